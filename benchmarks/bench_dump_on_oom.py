"""What torchmem.dump_on_oom() costs while no OOM happens, against history recording alone.

dump_on_oom() is history recording with Python stacks plus an observer that
runs only when an OOM is raised, so its cost should be the recording's and
nothing more. Three modes, measured in the same run, interleaved (each
repeat runs every mode once, in turn), with torchmem installed as PyTorch's
CPU allocator and one intra-op thread:

- off: no recording;
- history: torchmem.record_memory_history(stacks="python"), as dump_on_oom starts it;
- dump_on_oom: torchmem.dump_on_oom(path) (history + the OOM observer).

Two workloads: torch.empty(1024) created and dropped (the allocator's hot
path as PyTorch calls it), and a training step of a small MLP (forward,
backward, Adam). Reports the median over --repeats of this thread's CPU
time (wall time on a shared machine counts other processes' work) per
tensor / per step, and the ratios dump_on_oom/history and dump_on_oom/off.

    python benchmarks/bench_dump_on_oom.py [--repeats R] [--pairs N] [--steps S] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import torchmem  # noqa: E402
from torchmem.cli.progress import progress_bar  # noqa: E402

MODES = ("off", "history", "dump_on_oom")


def set_mode(mode: str, path: str, max_entries: int) -> None:
    torchmem.dump_on_oom(None)
    torchmem.record_memory_history(None)
    if mode == "history":
        torchmem.record_memory_history("all", max_entries=max_entries, stacks="python")
    elif mode == "dump_on_oom":
        torchmem.dump_on_oom(path, max_entries=max_entries)


def empty_loop(pairs: int) -> float:
    empty = torch.empty
    start = time.thread_time_ns()
    for _ in range(pairs):
        empty(1024)
    return (time.thread_time_ns() - start) / pairs


def make_step():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256))
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    x = torch.randn(64, 256)

    def steps(n: int) -> float:
        start = time.thread_time_ns()
        for _ in range(n):
            model(x).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
        return (time.thread_time_ns() - start) / n

    return steps


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=9, help="runs per mode; the median is reported")
    p.add_argument("--pairs", type=int, default=50_000, help="torch.empty calls per run")
    p.add_argument("--steps", type=int, default=30, help="training steps per run")
    p.add_argument("--max-entries", type=int, default=100_000, help="history ring size")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()

    torch.set_num_threads(1)
    torchmem.install()
    path = os.path.join(tempfile.mkdtemp(prefix="bench-dump-on-oom-"), "oom_rank{rank}_pid{pid}.pickle")
    steps = make_step()
    for mode in MODES:  # warm-up: caches, stacks interned once
        set_mode(mode, path, args.max_entries)
        empty_loop(1000)
        steps(3)
    samples: dict[str, dict[str, list[float]]] = {"torch.empty(1024)": {m: [] for m in MODES},
                                                 "MLP training step": {m: [] for m in MODES}}
    with progress_bar(args.repeats, "repeats", disable=args.json, unit="run") as update:
        for r in range(args.repeats):
            order = MODES if r % 2 == 0 else MODES[::-1]  # drift hits every mode alike
            for mode in order:
                set_mode(mode, path, args.max_entries)
                samples["torch.empty(1024)"][mode].append(empty_loop(args.pairs))
                samples["MLP training step"][mode].append(steps(args.steps))
            update(r + 1)
    set_mode("off", path, args.max_entries)
    assert not torchmem.runtime.oom.written_snapshots(), "no OOM may happen in this benchmark"

    rows = []
    for what, by_mode in samples.items():
        med = {m: statistics.median(v) for m, v in by_mode.items()}
        rows.append({"what": what, **med, "dump/history": med["dump_on_oom"] / med["history"],
                     "dump/off": med["dump_on_oom"] / med["off"]})
    machine = (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
               f"Python {platform.python_version()}, load average {os.getloadavg()[0]:.2f}")
    if args.json:
        print(json.dumps({"machine": machine, "repeats": args.repeats, "rows": rows}, indent=2))
        return 0
    print(f"# {machine}; median of {args.repeats}; thread CPU time; 1 intra-op thread")
    print(f"| {'workload':<20} | {'off':>10} | {'history':>10} | {'dump_on_oom':>11} | {'dump/history':>12} | {'dump/off':>8} |")
    print(f"|{'-' * 22}|{'-' * 12}|{'-' * 12}|{'-' * 13}|{'-' * 14}|{'-' * 10}|")
    for row in rows:
        unit = 1e3 if row["what"].startswith("MLP") else 1.0
        suffix = " us" if unit == 1e3 else " ns"
        cells = [f"{row[m] / unit:.1f}{suffix}" for m in MODES]
        print(f"| {row['what']:<20} | {cells[0]:>10} | {cells[1]:>10} | {cells[2]:>11} | "
              f"{row['dump/history']:12.3f} | {row['dump/off']:8.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
