"""Snapshot files: load + exact replay, and advise, on a snapshot of about 20,000 entries.

    python benchmarks/bench_snapshot_replay.py [--entries 20000] [--repeats 5] [SNAPSHOT ...]

Writes a snapshot in PyTorch's format with torchmem's allocator on a
simulated 64 GiB device (a random training-like mix of sizes, recording begun
a third of the way in, 20 stack frames per entry as PyTorch records them),
then times, median of --repeats runs:

- load: reading the pickle and building the replay's events and start state;
- exact replay: sim.replay(path) with nothing else given (start state,
  recorded addresses; asserts every allocation landed where recorded);
- advise: torchmem.replay.advise(path), every candidate setting's least memory.

SNAPSHOT files given on the command line are timed the same way.
"""
from __future__ import annotations

import argparse
import os
import pickle
import random
import statistics
import tempfile
import time

import torch

from torchmem import _core
from torchmem import replay as sim
from torchmem.replay import advise
from torchmem.formats.snapshot_format import build_snapshot


def write_snapshot(path: str, entries: int) -> int:
    allocator = _core.CachingAllocator(_core.SimDevice(64 << 30), "")
    allocator.enable_history(1 << 22)
    rng = random.Random(0)
    live, ptrs, next_id = [], {}, 0
    while not (next_id % 1000 == 0 and len(allocator.history()) >= entries * 3 // 2):
        if live and rng.random() < 0.45:
            allocator.deallocate(ptrs.pop(live.pop(rng.randrange(len(live)))))
        else:
            kind = rng.random()
            size = (rng.choice([512, 4096, 70_000, 1 << 20]) + rng.randrange(512) if kind < 0.8
                    else rng.randrange(1 << 20, 10 << 20) if kind < 0.95 else rng.randrange(10 << 20, 200 << 20))
            try:
                ptrs[next_id] = allocator.allocate(size, 0)
            except torch.OutOfMemoryError:
                break
            live.append(next_id)
        next_id += 1
    snap = build_snapshot(allocator.segments(), allocator.history())
    trace = snap["device_traces"][0]
    snap["device_traces"][0] = trace = trace[len(trace) - entries:]  # recording began mid-run
    for e in trace:
        e["frames"] = [{"filename": f"/site-packages/model/layer{i}.py", "line": 10 * i + 7, "name": f"forward{i}"}
                       for i in range(20)]
    with open(path, "wb") as f:
        pickle.dump(snap, f)
    return len(trace)


def median(fn, repeats: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def report(path: str, repeats: int) -> None:
    seconds_load, trace = median(lambda: sim.load_trace(path), repeats)
    seconds_replay, result = median(lambda: sim.replay(path), repeats)
    assert result.exact, result.fidelity
    seconds_advise, rows = median(lambda: advise(path), max(1, repeats // 2))
    size = os.path.getsize(path) / 2**20
    print(f"{os.path.basename(path)[:48]:<48} {trace.recorded.entries:>8,} {size:>7.1f} {seconds_load:>8.3f} "
          f"{seconds_replay:>8.3f} {seconds_advise:>8.2f} {sum(r.replays for r in rows):>8}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("snapshots", nargs="*")
    parser.add_argument("--entries", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(f"{'snapshot':<48} {'entries':>8} {'MiB':>7} {'load s':>8} {'replay s':>8} {'advise s':>8} {'replays':>8}")
    print("(load: read + events + start state; replay: load + exact replay; advise: all settings; medians)")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "synthetic_mid_run.pickle")
        write_snapshot(path, args.entries)
        report(path, args.repeats)
    for path in args.snapshots:
        report(path, args.repeats)


if __name__ == "__main__":
    main()
