"""Cost of allocation history on the hot path: a cached malloc+free pair with
history off, on, and on with Python stacks, measured in the same run.

Two measurements:

- allocator: pairs of CachingAllocator.allocate/deallocate in a C++ loop with
  the GIL released (as around PyTorch's operators), on a host device; the
  Python stack provider then takes the GIL for each allocation, as it does
  under PyTorch. The loop is called from --depth nested Python frames.
- torch: torch.empty(n) created and dropped in a Python loop with torchmem
  installed as PyTorch's CPU allocator (includes PyTorch's own overhead).

Reports the median of --repeats runs in ns of this thread's CPU time per
pair (wall time on a shared machine counts other processes' work), and
ratios to "off".

    python benchmarks/bench_history.py [--pairs N] [--repeats R] [--depth D] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import torchmem  # noqa: E402
from torchmem import _core  # noqa: E402

MODES = ("off", "on", "python stacks")


def nested(depth: int, fn):
    return nested(depth - 1, fn) if depth > 0 else fn()


def cpu_ns(fn) -> int:
    """CPU time of this thread running fn(): on a shared machine, wall time counts other people's work."""
    start = time.thread_time_ns()
    fn()
    return time.thread_time_ns() - start


def set_mode(allocator, mode: str, max_entries: int) -> None:
    if mode == "off":
        _core.enable_history(allocator, 0)
    else:
        _core.enable_history(allocator, max_entries, _core.StackTable() if mode == "python stacks" else None)


def bench_allocator(size: int, pairs: int, repeats: int, depth: int, max_entries: int) -> dict:
    a = _core.CachingAllocator(_core.HostDevice(), "")
    samples = {m: [] for m in MODES}
    for _ in range(repeats):  # modes interleaved so that drift hits all alike
        for mode in MODES:
            set_mode(a, mode, max_entries)
            samples[mode].append(nested(depth, lambda: cpu_ns(lambda: _core.time_malloc_free(a, size, pairs)) / pairs))
    _core.enable_history(a, 0)
    return {m: statistics.median(v) for m, v in samples.items()}


def bench_torch(numel: int, pairs: int, repeats: int, depth: int, max_entries: int) -> dict:
    torchmem.install()
    a = torchmem.caching_allocator()

    def loop():
        empty = torch.empty
        start = time.thread_time_ns()
        for _ in range(pairs):
            empty(numel)
        return (time.thread_time_ns() - start) / pairs

    samples = {m: [] for m in MODES}
    for _ in range(repeats):
        for mode in MODES:
            set_mode(a, mode, max_entries)
            samples[mode].append(nested(depth, loop))
    _core.enable_history(a, 0)
    return {m: statistics.median(v) for m, v in samples.items()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=200_000, help="malloc+free pairs per run (allocator loop)")
    p.add_argument("--torch-pairs", type=int, default=50_000, help="tensors per run (torch loop)")
    p.add_argument("--repeats", type=int, default=7, help="runs per mode; the median is reported")
    p.add_argument("--depth", type=int, default=20, help="Python frames above the allocation")
    p.add_argument("--max-entries", type=int, default=100_000, help="history ring size")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()

    rows = []
    for size in (4096, 4 << 20):
        r = bench_allocator(size, args.pairs, args.repeats, args.depth, args.max_entries)
        rows.append({"what": f"allocator, {size:,} B", **r})
    r = bench_torch(1024, args.torch_pairs, args.repeats, args.depth, args.max_entries)
    rows.append({"what": "torch.empty(1024), installed", **r})
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, Python {platform.python_version()}"
    if args.json:
        print(json.dumps({"machine": machine, "depth": args.depth, "rows": rows}, indent=2))
        return 0
    print(f"# {machine}; Python stack depth {args.depth}; median of {args.repeats}; thread CPU ns per pair")
    print(f"| {'measurement':<30} | {'off ns':>8} | {'on ns':>8} | {'stacks ns':>9} | {'on/off':>6} | {'stacks/off':>10} |")
    print(f"|{'-' * 32}|{'-' * 10}|{'-' * 10}|{'-' * 11}|{'-' * 8}|{'-' * 12}|")
    for row in rows:
        off, on, st = row["off"], row["on"], row["python stacks"]
        print(f"| {row['what']:<30} | {off:8.1f} | {on:8.1f} | {st:9.1f} | {on / off:6.2f} | {st / off:10.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
