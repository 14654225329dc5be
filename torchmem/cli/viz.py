"""`torchmem viz`: a self-contained HTML page for a memory snapshot."""
from __future__ import annotations

import argparse
import json
import os
import sys

from torchmem.cli.progress import activity, progress_bar
from torchmem.formats.snapshot_devices import choose_device
from torchmem.formats.snapshot_format import load
from torchmem.viz.html import write_html


def run(args: argparse.Namespace) -> int:
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
