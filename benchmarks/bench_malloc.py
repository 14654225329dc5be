"""Cached malloc+free in torchmem's core vs glibc malloc/free, same sizes, same run.

    python benchmarks/bench_malloc.py [--repeats 7]

Prints the median ns per operation of each allocator and the ratio
torchmem / glibc for two workloads (see bench_malloc.cpp).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _build import build  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    binary = build(os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench_malloc.cpp"), "bench_malloc")
    out = subprocess.run([binary, str(args.repeats)], check=True, capture_output=True, text=True).stdout
    rows = [json.loads(line) for line in out.splitlines()]
    print(f"{'workload':<8} {'glibc ns':>10} {'torchmem ns':>12} {'ratio':>7}   (median of {args.repeats}; ratio = torchmem / glibc, paired)")
    for workload in ("pair", "window"):
        g = [r["ns"] for r in rows if r["workload"] == workload and r["allocator"] == "glibc"]
        t = [r["ns"] for r in rows if r["workload"] == workload and r["allocator"] == "torchmem"]
        ratio = statistics.median(b / a for a, b in zip(g, t))
        print(f"{workload:<8} {statistics.median(g):>10.1f} {statistics.median(t):>12.1f} {ratio:>7.2f}")


if __name__ == "__main__":
    main()
