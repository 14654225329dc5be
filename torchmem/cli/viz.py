"""`torchmem viz`: a self-contained HTML page for a memory snapshot."""
from __future__ import annotations

import argparse
import json
import os
import sys


def register(subparsers) -> None:
    from torchmem.cli import arguments
    from torchmem.formats.input_files import SNAPSHOT_FORMATS

    p = subparsers.add_parser(
        "viz",
        help="write a self-contained HTML page for a snapshot (works with no network)",
        description="Write one HTML file (inline SVG and CSS, nothing loaded from the network) showing a "
        "snapshot's totals, memory over the recorded history, its segments with their blocks, and live "
        "memory by allocation site. Hover a block or a point for details.",
    )
    p.add_argument("snapshot", help=f"the snapshot: {SNAPSHOT_FORMATS}")
    p.add_argument("-o", "--output", required=True, metavar="FILE.html", help="page to write")
    p.add_argument("--device", type=int, default=None,
                   help="device index (default: the one with an OOM, else the one with the most history)")
    p.add_argument("--title", default=None, help="page title (default: the file name)")
    p.add_argument("--json", action="store_true", help="print the output path and size as JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from torchmem.cli.progress import progress_bar
    from torchmem.formats.snapshot_format import load
    from torchmem.viz.html import write_html

    from torchmem.formats.snapshot_devices import choose_device

    from torchmem.cli.progress import activity

    with activity(f"reading {args.snapshot}", disable=args.no_progress or args.json):
        snapshot = load(args.snapshot)
    choice = choose_device(snapshot, args.device, args.snapshot)
    traces = snapshot.get("device_traces") or []
    total = max((len(t) for t in traces), default=0)
    with progress_bar(total, "viz", disable=args.no_progress or args.json) as update:
        write_html(snapshot, args.output, title=args.title or os.path.basename(args.snapshot), device=args.device,
                   progress=update)
    if args.json:
        print(json.dumps({"output": args.output, "bytes": os.path.getsize(args.output), "device": choice.device,
                          "device_choice": choice.describe()}))
    else:
        print(f"wrote {args.output}: {choice.describe()}", file=sys.stderr)
    return 0
