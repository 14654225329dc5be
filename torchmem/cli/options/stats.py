"""The arguments of `torchmem stats`; the command itself is torchmem/cli/stats.py."""
from __future__ import annotations

import argparse

from torchmem.cli import arguments
from torchmem.formats.input_files import SNAPSHOT_FORMATS


def register(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = subparsers.add_parser(
        "stats",
        help="totals of a snapshot: allocated, free internal, free external, reserved",
        description="Print a snapshot's totals: allocated (bytes requested by live allocations), free internal "
        "(rounding inside them), free external (free blocks inside segments), which add up to reserved; the "
        "largest free block; per pool; the trace's annotations and user metadata. One device: --device, else the one with an OOM, else the one with the most "
        "history.",
    )
    p.add_argument("snapshot", help=f"the snapshot: {SNAPSHOT_FORMATS}")
    p.add_argument("--device", type=int, default=None,
                   help="device index (default: the one with an OOM, else the one with the most history)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
