"""Reading JSON-lines traces: events per second, parse only and parse + replay.

    python benchmarks/bench_jsonl.py [--events 2000000] [--repeats 5] [--python-baseline]

Writes a trace of --events events to a temporary file with traces.write_jsonl
(a sliding window of 2,000 live allocations, sizes from 512 B to 64 MiB, as
bench_replay.py), then times, median of --repeats runs:

- parse only: traces.load_jsonl(path).chunks() drained (the C++ reader);
- parse + replay: sim.replay(path, "80GiB"), the whole call;
- replay only: the same events replayed from chunks already in memory, for
  what the replay itself costs;
- with --python-baseline, the Python reader this replaced (json.loads and
  traces._parse_event per line), for comparison.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import numpy as np

from torchmem.formats import trace_types, traces
from torchmem import replay as sim
from torchmem.formats.trace_types import Chunk, Trace

WINDOW = 2000
SIZES = np.array([512, 4096, 65536, 1 << 20, 3 << 20, 12 << 20, 40 << 20, 64 << 20], dtype=np.uint64)


def sliding_window_trace(events: int) -> Trace:
    def chunks():
        rng = np.random.default_rng(0)
        done, next_id = 0, 0
        while done < events:
            n = min(trace_types.CHUNK, events - done)
            pairs = (n + 1) // 2  # alloc of id i, then free of id i - WINDOW
            alloc_ids = np.arange(next_id, next_id + pairs, dtype=np.int64)
            ops = np.tile(np.array([0, 1], dtype=np.uint8), pairs)
            ids = np.stack([alloc_ids, alloc_ids - WINDOW], axis=1).ravel()
            keep = ids >= 0  # no frees until the window is full
            ops, ids = ops[keep][:n], ids[keep][:n].astype(np.uint64)
            sizes = np.where(ops == 0, SIZES[rng.integers(0, len(SIZES), len(ops))], 0).astype(np.uint64)
            yield Chunk(ops, ids, sizes, np.zeros(len(ops), dtype=np.uint64))
            next_id += pairs
            done += len(ops)

    return Trace("sliding-window", chunks)


def python_baseline(path: str) -> int:
    """The reader load_jsonl used before the C++ one: json.loads per line."""
    n = 0
    with open(path, "rb") as f:
        for lineno, line in enumerate(f, 1):
            if line.strip():
                traces._parse_event(json.loads(line), f"{path}: line {lineno}")
                n += 1
    return n


def median_seconds(fn, repeats: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=2_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--python-baseline", action="store_true", help="also time the json.loads reader")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.jsonl")
        events = traces.write_jsonl(sliding_window_trace(args.events), path)
        size_mib = os.path.getsize(path) / 2**20
        in_memory = list(traces.load_jsonl(path).chunks())

        def parse_only() -> int:
            return sum(len(chunk) for chunk in traces.load_jsonl(path).chunks())

        def parse_and_replay() -> sim.ReplayResult:
            return sim.replay(path, "80GiB")

        def replay_only() -> sim.ReplayResult:
            return sim.replay(Trace("in-memory", lambda: iter(in_memory)), "80GiB")

        rows = [("parse only (C++ reader)", parse_only), ("parse + replay", parse_and_replay),
                ("replay only (chunks in memory)", replay_only)]
        if args.python_baseline:
            rows.append(("parse only (json.loads, before)", lambda: python_baseline(path)))

        print(f"{events:,} events, {size_mib:.0f} MiB of JSON lines; median of {args.repeats} runs")
        print(f"{'':<34}{'seconds':>10}{'events/s':>16}")
        for name, fn in rows:
            seconds, result = median_seconds(fn, args.repeats)
            if isinstance(result, sim.ReplayResult):
                assert result.completed and result.events == events, result.summary()
            else:
                assert result == events
            print(f"{name:<34}{seconds:>10.3f}{events / seconds:>16,.0f}")


if __name__ == "__main__":
    main()
