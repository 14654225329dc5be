"""Benchmarks of the arena and the paged block pool.

    .venv/bin/python benchmarks/bench_paged.py [--quick] [--json out.json]

1. C++ (benchmarks/bench_paged.cpp, built here with g++ -O2 against
   csrc/core/**/*.cpp): block pool allocate+release operations per second on one
   thread, one block at a time and in batches of 64; a batch-64 decode step's
   pool bookkeeping; arena allocations per second against the caching
   allocator in the same run.
2. Python: the cost per appended token of PagedKVCache.append_tokens at
   batch 64 (decode steps, block size 16), without and with prefix caching,
   and with forked sequences (copy-on-write of the shared last blocks).
3. torch level (torchmem.install()): torch.empty of mixed sizes inside
   torchmem.arena() against torchmem's caching allocator.
Timing: time.perf_counter / std::chrono, best of several repeats.
"""
from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.append(ROOT)  # after PYTHONPATH, so a build elsewhere can be measured


def _build(sources: list[str], defines: list[str]) -> str | None:
    cxx = shutil.which(os.environ.get("CXX", "g++"))
    digest = hashlib.sha256(" ".join(defines).encode())
    for s in sources:
        with open(s, "rb") as f:
            digest.update(f.read())
    out_dir = os.path.join(ROOT, "build", "bench")
    os.makedirs(out_dir, exist_ok=True)
    binary = os.path.join(out_dir, "bench_paged_" + digest.hexdigest()[:16])
    if not os.path.exists(binary):
        cmd = [cxx, "-O2", "-std=c++17", *defines, "-I", os.path.join(ROOT, "csrc"), *sources, "-o", binary + ".tmp"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            print(proc.stderr[-2000:], file=sys.stderr)
            return None
        os.replace(binary + ".tmp", binary)
    return binary


def cpp_figures() -> dict:
    if shutil.which(os.environ.get("CXX", "g++")) is None:
        print("no g++ on PATH: C++ figures skipped", file=sys.stderr)
        return {}
    core_dir = os.path.join(ROOT, "csrc", "core")
    bench = os.path.join(ROOT, "benchmarks", "bench_paged.cpp")
    core = sorted(glob.glob(os.path.join(core_dir, "**", "*.cpp"), recursive=True))
    binary = _build([bench] + core, [])
    if binary is None:  # the caching allocator does not build: measure ours alone
        print("the caching allocator did not build; C++ figures without it", file=sys.stderr)
        ours = ["allocators/arena.cpp", "allocators/paged_block_pool.cpp", "devices/host_device.cpp",
                "devices/sim_device.cpp", "sync/fork_safety.cpp", "sync/fast_mutex.cpp"]
        binary = _build([bench] + [os.path.join(core_dir, f) for f in ours], ["-DTORCHMEM_BENCH_NO_CACHING"])
    out = subprocess.run([binary], check=True, capture_output=True, text=True).stdout
    figures = {}
    for line in out.splitlines():
        name, value, unit = line.split(maxsplit=2)
        figures[name] = (float(value), unit)
    return figures


def best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def python_figures(quick: bool) -> dict:
    import torch

    from torchmem.runtime.paged import PagedKVCache

    batch, block_size, steps = 64, 16, 200 if quick else 1000
    repeats = 3 if quick else 5
    figures = {}

    def decode(prefix: bool, forks: bool) -> float:
        def run():
            cache = PagedKVCache(
                num_blocks=batch * (steps // block_size + 4) * 2,
                block_size=block_size,
                num_heads=8,
                head_dim=64,
                dtype=torch.float16,
                device="cpu",
                enable_prefix_caching=prefix,
            )
            if forks:
                # 32 prompts of 20 tokens, each forked once (parallel sampling):
                # the first step copies 32 shared partial blocks.
                parents = [cache.add_sequence(list(range(i, i + 20))).seq_id for i in range(batch // 2)]
                seqs = parents + [cache.fork(p) for p in parents]
            else:
                seqs = [cache.add_sequence(list(range(i, i + 20))).seq_id for i in range(batch)]
            tokens = list(range(batch))
            t0 = time.perf_counter()
            for _ in range(steps):
                cache.append_tokens(seqs, tokens)
            run.elapsed = time.perf_counter() - t0

        times = []
        for _ in range(repeats):
            run()
            times.append(run.elapsed)
        return min(times) / (steps * batch)

    figures["python_us_per_token_b64"] = (decode(False, False) * 1e6, "us/token")
    figures["python_us_per_token_b64_prefix_caching"] = (decode(True, False) * 1e6, "us/token")
    figures["python_us_per_token_b64_forked_cow"] = (decode(True, True) * 1e6, "us/token")
    return figures


TORCH_LEVEL = r"""
import json, sys, time
import torch, torchmem
from torchmem.runtime.arena import Arena, arena
torchmem.install()
sizes = [64 << (i * 7 % 11) for i in range(256)]  # 64 B .. 64 KiB, 4 B elements / 4
steps = int(sys.argv[1])
def loop():
    for _ in range(steps):
        ts = [torch.empty(s // 4) for s in sizes]
        del ts
def best(f):
    r = []
    for _ in range(5):
        t0 = time.perf_counter(); f(); r.append(time.perf_counter() - t0)
    return min(r)
loop()
caching = best(loop)
a = Arena(64 << 20)
def in_arena():
    for _ in range(steps):
        with arena(a):
            ts = [torch.empty(s // 4) for s in sizes]
            del ts
in_arena()
arena_t = best(in_arena)
n = steps * len(sizes)
print(json.dumps({"torch_empty_caching_per_s": [n / caching / 1e6, "M/s"],
                  "torch_empty_arena_per_s": [n / arena_t / 1e6, "M/s"]}))
"""


def torch_level_figures(quick: bool) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", TORCH_LEVEL, "50" if quick else "400"],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=os.environ.get("PYTHONPATH", "") + os.pathsep + ROOT),
    )
    if proc.returncode != 0:
        return {"torch_level_error": (0.0, proc.stderr.strip().splitlines()[-1] if proc.stderr else "failed")}
    return {k: tuple(v) for k, v in json.loads(proc.stdout.strip().splitlines()[-1]).items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer steps (a smoke run)")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, {platform.python_version()}")
    figures = {}
    figures.update(cpp_figures())
    figures.update(python_figures(args.quick))
    figures.update(torch_level_figures(args.quick))
    for name, (value, unit) in figures.items():
        print(f"{name:45s} {value:10.3f} {unit}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
