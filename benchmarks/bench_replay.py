"""Replay speed and memory: events per second through the core, and peak
memory for traces of growing length.

    python benchmarks/bench_replay.py [--events 10000000]

The trace is a stream in chunks of numpy columns (no Python per event): a
sliding window of 2,000 live allocations, sizes drawn from 512 B to 64 MiB,
on a simulated 80 GiB device with the default config and with
expandable_segments:True. Each length runs in a fresh process so its peak
RSS (ru_maxrss) is its own.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

WORKER = r"""
import json, resource, sys, time
import numpy as np
from torchmem import replay as sim
from torchmem.formats.trace_types import Chunk, Trace

events, conf = int(sys.argv[1]), sys.argv[2]
WINDOW, CHUNK = 2000, 1 << 18
SIZES = np.array([512, 4096, 65536, 1 << 20, 3 << 20, 12 << 20, 40 << 20, 64 << 20], dtype=np.uint64)

def chunks():
    rng = np.random.default_rng(0)
    done, next_id = 0, 0
    while done < events:
        n = min(CHUNK, events - done) // 2 * 2
        ops = np.tile(np.array([0, 1], dtype=np.uint8), n // 2)
        alloc_ids = np.arange(next_id, next_id + n // 2, dtype=np.uint64)
        free_ids = alloc_ids - WINDOW
        ids = np.empty(n, dtype=np.uint64)
        ids[0::2] = alloc_ids
        ids[1::2] = free_ids
        if next_id < WINDOW:  # no frees until the window is full
            keep = np.ones(n, dtype=bool)
            keep[1::2] = alloc_ids >= WINDOW
            ops, ids = ops[keep], ids[keep]
        sizes = SIZES[rng.integers(0, len(SIZES), len(ops))]
        yield Chunk(ops, ids, sizes, np.zeros(len(ops), dtype=np.uint64))
        next_id += n // 2
        done += n

before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
r = sim.replay(Trace("stream", chunks, total=events), "80GiB", conf)
print(json.dumps({"events": r.events, "conf": conf, "seconds": r.seconds, "events_per_s": r.events / r.seconds,
                  "completed": r.completed, "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "rss_before_mib": before / 1024}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=10_000_000)
    args = parser.parse_args()
    lengths = sorted({args.events // 10, args.events})
    print(f"{'events':>12} {'config':<26} {'M events/s':>11} {'seconds':>8} {'peak RSS MiB':>13}")
    for conf in ["", "expandable_segments:True"]:
        for n in lengths:
            out = subprocess.run([sys.executable, "-c", WORKER, str(n), conf], capture_output=True, text=True, check=True,
                                 env=dict(os.environ, PYTHONPATH=ROOT)).stdout
            r = json.loads(out.strip().splitlines()[-1])
            print(f"{r['events']:>12,} {conf or '(default)':<26} {r['events_per_s'] / 1e6:>11.2f} {r['seconds']:>8.2f} {r['peak_rss_mib']:>13.0f}")


if __name__ == "__main__":
    main()
