"""Many more fuzz cases than `make test` runs (tests/support/fuzz_cases.py), with the figures for docs/reliability.md.

    .venv/bin/python benchmarks/fuzz_snapshots.py --cases 5000 --jobs 2

Each case runs in a worker process; a case that takes longer than --timeout
seconds counts as a hang, and the workers' peak resident memory is
reported. Prints one JSON object: cases by damage and outcome, failures
(with the seed that reproduces each: `--seed N --cases 1`), seconds, peak
memory.
"""
from __future__ import annotations

import argparse
import collections
import json
import multiprocessing as mp
import os
import resource
import sys
import tempfile
import time

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout, for tests.support

from tests.support import fuzz_cases  # noqa: E402


def run_case(seed: int) -> tuple[int, dict, str, dict | str, float, int]:
    """(seed, what was written, "ok" | "failure", outcome or message, seconds, worker peak RSS in KiB)."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, f"case-{seed}")
        info = fuzz_cases.write_case(path, seed)
        start = time.perf_counter()
        try:
            outcome: dict | str = fuzz_cases.check_case(path)
            status = "ok"
        except fuzz_cases.Failure as exc:
            outcome, status = str(exc), "failure"
        seconds = time.perf_counter() - start
    return seed, info, status, outcome, seconds, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=1_000_000, help="first seed (cases use seed, seed+1, ...)")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds before a case counts as a hang")
    args = ap.parse_args()
    counts: collections.Counter = collections.Counter()
    failures = []
    slowest = (0.0, None)
    peak_kib = 0
    start = time.perf_counter()
    with mp.get_context("spawn").Pool(args.jobs, maxtasksperchild=500) as pool:
        pending = [(s, pool.apply_async(run_case, (s,))) for s in range(args.seed, args.seed + args.cases)]
        for seed, job in pending:
            try:
                seed, info, status, outcome, seconds, rss = job.get(timeout=args.timeout)
            except mp.TimeoutError:
                failures.append({"seed": seed, "failure": f"no result in {args.timeout} s (a hang?)"})
                continue
            peak_kib = max(peak_kib, rss)
            if seconds > slowest[0]:
                slowest = (seconds, info)
            if status == "failure":
                failures.append({**info, "failure": outcome})
                counts[(info["kind"], "FAILURE")] += 1
            else:
                result = "completes" if all(v == "ok" for v in outcome.values()) else (
                    "TraceError" if all(v == "TraceError" for v in outcome.values()) else "some readers refuse")
                counts[(info["kind"], result)] += 1
    by_kind: dict = collections.defaultdict(dict)
    for (kind, result), n in sorted(counts.items()):
        by_kind[kind][result] = n
    print(json.dumps({
        "cases": args.cases, "first_seed": args.seed, "failures": failures, "by_damage": by_kind,
        "seconds": round(time.perf_counter() - start, 1), "slowest_case_s": round(slowest[0], 2),
        "slowest_case": slowest[1], "peak_rss_mib_of_a_worker": round(peak_kib / 1024, 1),
    }, indent=2))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
