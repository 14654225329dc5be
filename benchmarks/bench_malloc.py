"""Cached malloc+free in torchmem's core vs glibc and tcmalloc, same sizes, same run.

    python benchmarks/bench_malloc.py [--repeats 7]

Prints the median ns per operation of each allocator and the ratios
torchmem / glibc and tcmalloc / glibc (medians of the per-repeat ratios)
for three workloads (bench_malloc.cpp: pair, pair2t, window). tcmalloc is
measured when libtcmalloc_minimal.so.4 can be opened (Debian:
libtcmalloc-minimal4).
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
    binary = build(os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench_malloc.cpp"), "bench_malloc", ["-ldl"])
    out = subprocess.run([binary, str(args.repeats)], check=True, capture_output=True, text=True).stdout
    rows = [json.loads(line) for line in out.splitlines()]
    has_tc = any(r["allocator"] == "tcmalloc" for r in rows)
    print(f"median of {args.repeats}; ratios to glibc are medians of the per-repeat ratios")
    print(f"{'workload':<8} {'glibc ns':>10} {'torchmem ns':>12} {'torchmem/glibc':>15}" +
          (f" {'tcmalloc ns':>12} {'tcmalloc/glibc':>15}" if has_tc else "   (tcmalloc not found)"))
    for workload in ("pair", "pair2t", "window"):
        ns = {a: [r["ns"] for r in rows if r["workload"] == workload and r["allocator"] == a]
              for a in ("glibc", "torchmem", "tcmalloc")}
        g = ns["glibc"]
        line = f"{workload:<8} {statistics.median(g):>10.1f}"
        for a in ("torchmem", "tcmalloc") if has_tc else ("torchmem",):
            ratio = statistics.median(b / x for x, b in zip(g, ns[a]))
            line += f" {statistics.median(ns[a]):>12.1f} {ratio:>15.2f}"
        print(line)


if __name__ == "__main__":
    main()
