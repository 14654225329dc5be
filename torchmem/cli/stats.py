"""`torchmem stats`: totals of a memory snapshot, as torch.cuda._memory_viz segsum counts them."""
from __future__ import annotations

import argparse
import json


def register(subparsers) -> None:
    from torchmem.cli import arguments
    from torchmem.formats.input_files import SNAPSHOT_FORMATS

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
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from torchmem.formats.annotations import as_json, format_notes
    from torchmem.formats.snapshot_format import load
    from torchmem.formats.snapshot_devices import choose_device, device_segments
    from torchmem.viz.totals import format_totals, totals

    snapshot = load(args.snapshot)
    choice = choose_device(snapshot, args.device, args.snapshot)
    t = totals({"segments": device_segments(snapshot, choice.device)})
    if args.json:
        print(json.dumps(dict(t, device=choice.device, device_choice=choice.describe(),
                              **as_json(snapshot, choice.device)), indent=2))
    else:
        print(format_totals(t, f"{args.snapshot}, {choice.describe()}"))
        notes = format_notes(snapshot, choice.device)
        if notes:
            print(notes)
    return 0
