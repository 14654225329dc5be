"""How often torchmem's replay makes PyTorch's own decisions: the differential oracle at scale.

Runs random workloads (tests.support.oracle) under PyTorch's native
allocator on the fake GPU, replays each native snapshot with no hints and
counts, per setting, the cases replayed exactly (every trace entry at its
native address and size, the final segments block by block, the
statistics) and those that show each open deviation
(tests.support.deviations). Any other divergence is listed. A second
table counts the same outcomes by how the snapshot starts: from the run's
start, mid-run (recording began part-way), or into a ring of entries.

    make fakegpu fakegpu-ext
    PYTHONPATH=. TORCHMEM_EXT_DIR=build/cuda-2.14.1/lib/torchmem .venv-cuda/bin/python \\
        benchmarks/bench_native_fidelity.py --cases 2000 [--first-seed 1000] [--json out.json]
"""
from __future__ import annotations

import argparse
import collections
import json
import sys
import time

import torch

from tests.support import oracle
from tests.support.deviations import DEVIATIONS, classify, proved
from torchmem.cli.progress import progress_bar


START_KINDS = ("from the start", "mid-run", "mid-run, expandable", "ring")


def start_kind(w: oracle.Workload) -> str:
    """How the workload's snapshot starts: a ring counts before a mid-run start."""
    if w.max_entries:
        return "ring"
    if w.record_at:
        return "mid-run, expandable" if "expandable_segments:True" in w.conf else "mid-run"
    return "from the start"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=2000, help="number of workloads (default 2000)")
    parser.add_argument("--first-seed", type=int, default=1000,
                        help="first seed (default 1000: past the test suite's 0-199)")
    parser.add_argument("--batch", type=int, default=200, help="workloads per native run (default 200)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    if args.cases < 1 or args.batch < 1:
        parser.error("--cases and --batch must be positive")
    seeds = list(range(args.first_seed, args.first_seed + args.cases))
    per_conf: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    per_start: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    cases: list[dict] = []
    unexplained: list[str] = []
    start = time.perf_counter()
    with progress_bar(len(seeds), "oracle", unit="case") as update:
        for at in range(0, len(seeds), args.batch):
            workloads = [oracle.generate(s) for s in seeds[at:at + args.batch]]
            for w, problems in zip(workloads, oracle.check(workloads)):
                deviation = classify(w, problems) if problems else None
                outcome = "exact" if not problems else deviation.name if deviation else "unexplained"
                per_conf[w.conf][outcome] += 1
                per_start[start_kind(w)][outcome] += 1
                cases.append({"seed": w.seed, "conf": w.conf, "start": start_kind(w), "outcome": outcome,
                              "problem": problems[0] if problems else ""})
                if outcome == "unexplained":
                    unexplained.append(f"{w.describe()}: {problems[0]}")
            update(min(len(seeds), at + args.batch))
    seconds = time.perf_counter() - start
    names = ["exact"] + [d.name for d in DEVIATIONS] + ["unexplained"]
    total = collections.Counter()
    for counts in per_conf.values():
        total.update(counts)
    print(f"torch {torch.__version__}, {len(seeds)} workloads (seeds {seeds[0]}-{seeds[-1]}), {seconds:.0f} s")
    shown = sum(total[n] for n in proved())
    print(f"exact {total['exact']}; proved indistinguishable (a pair of runs, tests.support.indistinguishable) "
          f"{shown}; other deviations {sum(total.values()) - total['exact'] - shown - total['unexplained']}; "
          f"unexplained {total['unexplained']}\n")
    header = " | ".join(f"{n} (proved)" if n in proved() else n for n in names)
    print(f"| setting | cases | {header} |")
    print("|---|---:|" + "---:|" * len(names))
    for conf in oracle.SETTINGS:
        counts = per_conf.get(conf, collections.Counter())
        print(f"| `{conf or '(defaults)'}` | {sum(counts.values())} | " + " | ".join(str(counts[n]) for n in names) + " |")
    print(f"| all | {sum(total.values())} | " + " | ".join(str(total[n]) for n in names) + " |")
    print(f"\n| start | cases | {header} |")
    print("|---|---:|" + "---:|" * len(names))
    for kind in START_KINDS:
        counts = per_start.get(kind, collections.Counter())
        print(f"| {kind} | {sum(counts.values())} | " + " | ".join(str(counts[n]) for n in names) + " |")
    if unexplained:
        print(f"\n{len(unexplained)} unexplained divergences, the first:")
        print("\n".join(unexplained[:10]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "seeds": [seeds[0], seeds[-1]], "seconds": seconds,
                       "per_setting": {c: dict(v) for c, v in per_conf.items()},
                       "per_start": {k: dict(v) for k, v in per_start.items()}, "total": dict(total),
                       "proved": sorted(proved()), "unexplained": unexplained, "cases": cases}, f, indent=1)
    return 1 if unexplained else 0


if __name__ == "__main__":
    sys.exit(main())
