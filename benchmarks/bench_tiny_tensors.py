"""Resident memory of many tiny CPU tensors under each allocator.

    python benchmarks/bench_tiny_tensors.py [--tensors 300000] [--floats 4] [--rounds 3]

Each run is a fresh process that keeps --tensors tensors of --floats float32
each alive in a list and reports its resident set (VmRSS) before and after,
(torch.ones: the data is written, so its pages are resident), so the
difference is what the tensors cost: their data blocks plus PyTorch's
and Python's objects, which every allocator pays alike. Allocators: glibc
(PyTorch's default), torchmem as torchmem.install() sets it up on the CPU
(min_block_size:64), torchmem with the native policy's 512 B blocks
(conf "reuse_order:address,min_block_size:512"), and tcmalloc / jemalloc
preloaded when installed. Rounds alternate allocators; figures are medians.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRELOADS = {
    "tcmalloc": "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
    "jemalloc": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
}
TORCHMEM_CONFS = {"torchmem": None, "torchmem-native": "reuse_order:address,min_block_size:512"}

WORKER = r"""
import json, sys, torch
allocator, conf, n, floats = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
def rss_mib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
if allocator.startswith("torchmem"):
    import torchmem
    torchmem.install(conf=conf or None)
torch.ones(floats)  # warm up whatever the first tensor sets up
before = rss_mib()
keep = [torch.ones(floats) for _ in range(n)]  # written: their pages are resident
after = rss_mib()
out = {"allocator": allocator, "rss_mib": after, "tensors_mib": after - before}
if allocator.startswith("torchmem"):
    out["reserved_mib"] = torchmem.memory_reserved() / 2**20
print(json.dumps(out))
"""


def run_one(allocator: str, n: int, floats: int) -> dict:
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("TORCHMEM_ALLOC_CONF", None)
    if allocator in PRELOADS:
        env["LD_PRELOAD"] = PRELOADS[allocator]
    conf = TORCHMEM_CONFS.get(allocator) or ""
    cmd = [sys.executable, "-c", WORKER, allocator, conf, str(n), str(floats)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tensors", type=int, default=300_000)
    parser.add_argument("--floats", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    allocators = ["glibc", *TORCHMEM_CONFS] + [name for name, lib in PRELOADS.items() if os.path.exists(lib)]
    results: dict[str, list[dict]] = {a: [] for a in allocators}
    for r in range(args.rounds):
        for a in allocators:
            results[a].append(run_one(a, args.tensors, args.floats))
            print(f"round {r + 1}/{args.rounds} {a:<16} RSS {results[a][-1]['rss_mib']:.1f} MiB", file=sys.stderr)
    print(f"{args.tensors:,} tensors of {args.floats} float32, median of {args.rounds} rounds")
    print(f"{'allocator':<16} {'RSS MiB':>8} {'tensors MiB':>12} {'bytes/tensor':>13} {'reserved MiB':>13}")
    for a in allocators:
        rss = statistics.median(x["rss_mib"] for x in results[a])
        cost = statistics.median(x["tensors_mib"] for x in results[a])
        reserved = statistics.median(x["reserved_mib"] for x in results[a]) if "reserved_mib" in results[a][0] else None
        per = cost * 2**20 / args.tensors
        print(f"{a:<16} {rss:>8.1f} {cost:>12.1f} {per:>13.0f} {'' if reserved is None else f'{reserved:.1f}':>13}")


if __name__ == "__main__":
    main()
