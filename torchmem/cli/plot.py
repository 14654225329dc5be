"""`torchmem plot`: pictures of a memory snapshot (PNG)."""
from __future__ import annotations

import argparse
import json
import sys

from torchmem.cli.progress import activity, progress_bar
from torchmem.formats.snapshot_format import load
from torchmem.formats.trace_types import TraceError
from torchmem.viz.png import plot_segments, plot_timeline


def run(args: argparse.Namespace) -> int:
    with activity(f"reading {args.snapshot}", disable=args.no_progress or args.json):
        snapshot = load(args.snapshot)
    if not args.segments and not any(isinstance(t, list) and t for t in snapshot.get("device_traces") or []):
        raise TraceError(f"{args.snapshot}: the snapshot has no trace (no history), so there is no timeline to draw: "
                         "record with torch.cuda.memory._record_memory_history() or torchmem.record_memory_history() "
                         "before dumping, or draw its segments with --segments")
    title = args.title or args.snapshot
    if args.segments:
        tot = plot_segments(snapshot, args.output, title, max_segments=args.max_segments, device=args.device)
        summary = {"output": args.output, "kind": "segments", **{k: v for k, v in tot.items() if k != "pools"}}
        used = tot["device_choice"]
    else:
        traces = snapshot.get("device_traces") or []
        total = max((len(t) for t in traces), default=0)
        with progress_bar(total, "plot", disable=args.no_progress or args.json) as update:
            t = plot_timeline(snapshot, args.output, title, device=args.device,
                              x="time" if args.time else "event", progress=update)
        used = t.device_choice
        summary = {"output": args.output, "kind": "timeline", "device": t.device, "device_choice": used, "events": t.events,
                   "peak_allocated": int(t.allocated.max()), "peak_reserved": int(t.reserved.max()),
                   "max_reserved_minus_allocated": int((t.reserved - t.allocated).max()),
                   "ooms": [{k: int(v) for k, v in o.items()} for o in t.ooms], "notes": t.notes,
                   "annotations": [a.entry for a in t.annotations]}
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(f"wrote {args.output}: {used}", file=sys.stderr)
    return 0
