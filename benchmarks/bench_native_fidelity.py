"""How often torchmem's replay makes PyTorch's own decisions: the differential oracle at scale.

Runs random workloads (tests.support.oracle) under PyTorch's native
allocator on the fake GPU, replays each native snapshot with no hints and
counts, per setting, the cases replayed exactly (every trace entry at its
native address and size, the final segments block by block, the
statistics) and those that show each open deviation
(tests.support.deviations). Any other divergence is listed.

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
from tests.support.deviations import DEVIATIONS, classify
from torchmem.progress import progress_bar


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
    unexplained: list[str] = []
    start = time.perf_counter()
    with progress_bar(len(seeds), "oracle", unit="case") as update:
        for at in range(0, len(seeds), args.batch):
            workloads = [oracle.generate(s) for s in seeds[at:at + args.batch]]
            for w, problems in zip(workloads, oracle.check(workloads)):
                deviation = classify(w, problems) if problems else None
                outcome = "exact" if not problems else deviation.name if deviation else "unexplained"
                per_conf[w.conf][outcome] += 1
                if outcome == "unexplained":
                    unexplained.append(f"{w.describe()}: {problems[0]}")
            update(min(len(seeds), at + args.batch))
    seconds = time.perf_counter() - start
    names = ["exact"] + [d.name for d in DEVIATIONS] + ["unexplained"]
    total = collections.Counter()
    for counts in per_conf.values():
        total.update(counts)
    print(f"torch {torch.__version__}, {len(seeds)} workloads (seeds {seeds[0]}-{seeds[-1]}), {seconds:.0f} s\n")
    print("| setting | cases | " + " | ".join(names) + " |")
    print("|---|---:|" + "---:|" * len(names))
    for conf in oracle.SETTINGS:
        counts = per_conf.get(conf, collections.Counter())
        print(f"| `{conf or '(defaults)'}` | {sum(counts.values())} | " + " | ".join(str(counts[n]) for n in names) + " |")
    print(f"| all | {sum(total.values())} | " + " | ".join(str(total[n]) for n in names) + " |")
    if unexplained:
        print(f"\n{len(unexplained)} unexplained divergences, the first:")
        print("\n".join(unexplained[:10]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "seeds": [seeds[0], seeds[-1]], "seconds": seconds,
                       "per_setting": {c: dict(v) for c, v in per_conf.items()}, "total": dict(total),
                       "unexplained": unexplained}, f, indent=1)
    return 1 if unexplained else 0


if __name__ == "__main__":
    sys.exit(main())
