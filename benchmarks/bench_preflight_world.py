"""Rank 0 of a 64-rank FSDP2 job, answered from one machine: the answer, and what it cost this machine.

    PYTHONPATH=$PWD TORCHMEM_EXT_DIR=$PWD/build/cuda-2.14.1/lib/torchmem \\
        .venv-cuda/bin/python benchmarks/bench_preflight_world.py --preset 70b

Runs `torchmem preflight --card CARD --world-size 64 -- torchrun --nnodes 8 --nproc-per-node 8
examples/fsdp2_llama.py --preset PRESET` twice: with --no-advise (the rank's run alone) and with advise's
table (which replays the rank's snapshot under each setting). Prints, per run, the wall time and the most
host memory one process held (ru_maxrss of the children), then rank 0's peaks and verdict.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(preset: str, card: str, advise: bool) -> tuple[float, int, dict]:
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    with tempfile.TemporaryDirectory() as out:
        command = [sys.executable, "-m", "torchmem", "preflight", "--card", card, "--world-size", "64", "--json",
                   "--out", out, *([] if advise else ["--no-advise"]), "--", torchrun, "--nnodes", "8",
                   "--nproc-per-node", "8", "examples/fsdp2_llama.py", "--preset", preset]
        start = time.monotonic()
        proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        wall = time.monotonic() - start
    if proc.returncode not in (0, 3):
        sys.exit(f"preflight failed ({proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")
    peak_rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    return wall, peak_rss, json.loads(proc.stdout)  # the script's own output went to stderr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="70b", help="examples/fsdp2_llama.py's --preset (default 70b)")
    parser.add_argument("--card", default="h100")
    args = parser.parse_args()
    print("| run | wall time | peak host memory of one process (max RSS, cumulative) |")
    print("| --- | --- | --- |")
    report = None
    for advise in (False, True):
        wall, rss, report = run(args.preset, args.card, advise)
        print(f"| {'with advise' if advise else '--no-advise'} | {wall:.1f} s | {rss / 1e9:.2f} GB |")
    [device] = report["devices"]
    gib = 1 << 30
    print(f"\nrank 0 on {args.card}: peak allocated {device['peak_allocated'] / gib:.2f} GiB, peak reserved "
          f"{device['peak_reserved'] / gib:.2f} GiB, outside {device['outside'] / gib:.2f} GiB (NCCL "
          f"{device['nccl'] / gib:.2f} GiB), needed {device['needed'] / gib:.2f} GiB of "
          f"{device['total'] / gib:.2f} GiB: {'fits' if device['fits'] else 'does NOT fit'}")
    if report.get("advice"):
        best = report["advice"][0]
        print(f"advise's first row: {best}")


if __name__ == "__main__":
    main()
