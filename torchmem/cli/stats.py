"""`torchmem stats`: totals of a memory snapshot, as torch.cuda._memory_viz segsum counts them."""
from __future__ import annotations

import argparse
import json


def register(subparsers) -> None:
    from torchmem.cli import arguments
    from torchmem.input_files import SNAPSHOT_FORMATS

    p = subparsers.add_parser(
        "stats",
        help="totals of a snapshot: allocated, free internal, free external, reserved",
        description="Print a snapshot's totals: allocated (bytes requested by live allocations), free internal "
        "(rounding inside them), free external (free blocks inside segments), which add up to reserved; the "
        "largest free block; per pool.",
    )
    p.add_argument("snapshot", help=f"the snapshot: {SNAPSHOT_FORMATS}")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from torchmem.snapshot import load
    from torchmem.viz.totals import format_totals, totals

    t = totals(load(args.snapshot))
    if args.json:
        print(json.dumps(t, indent=2))
    else:
        print(format_totals(t, args.snapshot))
    return 0
