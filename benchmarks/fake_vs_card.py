"""The fake GPU against a real card, event by event: bench_cuda.py's native runs, recorded on both.

    python benchmarks/fake_vs_card.py --results bench_cuda.json --snapshots DIR [--workloads empty_del ...]

scripts/gpu_check.sh's bench stage records PyTorch's own allocator on the
card running bench_cuda.py's workloads (seeded: the same requests every run)
and keeps the snapshots (native_snapshots.tar.gz). This script runs each
recorded workload again, here, under PyTorch's allocator on the fake GPU:
the same torch should be installed, and the card is the recorded one's size.
It runs once with rising and once with falling addresses
(TORCHMEM_FAKEGPU_ADDRESSES), then compares each run with the card's
recording (torchmem.preflight.compare): the events that agree from the
start, the first that differs and how, the share of allocations at the
same offset in their segment, and the peaks. Prints a Markdown table.
"""
from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from preflight_accuracy import same_offset_share  # noqa: E402

from torchmem import fakegpu  # noqa: E402
from torchmem.preflight.compare import compare  # noqa: E402

ORDERS = ("rising", "falling")


def record_on_fake_gpu(run: dict[str, Any], order: str, folder: Path) -> Path:
    """bench_cuda.py's child for `run`'s workload, recorded on a fake card of the recorded card's size."""
    snapshot = folder / f"{run['workload']}_{order}.pickle"
    steps = run["steps"] + 3  # bench_cuda.py's warm-up steps (3) are in the recording too
    command = [sys.executable, str(ROOT / "benchmarks" / "bench_cuda.py"), "--child", run["workload"], "native",
               "--json", str(folder / f"{run['workload']}_{order}.json"), "--record", str(snapshot),
               "--steps", str(steps)]
    env = fakegpu.environment(run["gpu_total_bytes"], base=dict(os.environ, TORCHMEM_FAKEGPU_ADDRESSES=order,
                                                                  PYTHONPATH=str(ROOT)))
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"{run['workload']} on the fake GPU: {proc.stderr.strip().splitlines()[-1]}")
    return snapshot


def row(workload: str, order: str, card: dict[str, Any], fake: dict[str, Any]) -> str:
    c = compare(card, fake)
    share, n_card, n_fake = same_offset_share(card, fake)
    first = f"event {c.first.position:,}, {c.first.field}" if c.first else "none"
    return (f"| {workload} | {order} | {c.matching:,} of {c.events_real:,} | {first} | "
            f"{share:.1%} of {max(n_card, n_fake):,} | {c.peaks_real.allocated:,} / {c.peaks_other.allocated:,} | "
            f"{c.peaks_real.reserved:,} / {c.peaks_other.reserved:,} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", required=True, help="the GPU run's bench_cuda.json")
    parser.add_argument("--snapshots", required=True, help="the folder its native snapshots were unpacked into")
    parser.add_argument("--workloads", nargs="+", help="default: every recorded one whose snapshot is here")
    args = parser.parse_args()
    with open(args.results) as f:
        history = json.load(f)["native_history"]
    lines = ["| workload | addresses | events agreeing from the start | first difference | same offset | "
             "peak allocated card / fake | peak reserved card / fake |", "|---|---|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory(prefix="torchmem-fake-vs-card-") as tmp:
        for run in history:
            card_path = Path(args.snapshots) / os.path.basename(run.get("snapshot", ""))
            if "snapshot" not in run or not card_path.is_file():
                continue
            if args.workloads and run["workload"] not in args.workloads:
                continue
            with open(card_path, "rb") as f:
                card = pickle.load(f)
            for order in ORDERS:
                print(f"fake_vs_card: {run['workload']}, {order} addresses", file=sys.stderr, flush=True)
                try:
                    with open(record_on_fake_gpu(run, order, Path(tmp)), "rb") as f:
                        lines.append(row(run["workload"], order, card, pickle.load(f)))
                except RuntimeError as exc:
                    lines.append(f"| {run['workload']} | {order} | failed: {exc} | | | | |")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
