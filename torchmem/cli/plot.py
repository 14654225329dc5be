"""`torchmem plot`: pictures of a memory snapshot (PNG)."""
from __future__ import annotations

import argparse
import json
import sys


def register(subparsers) -> None:
    from torchmem.cli import arguments
    from torchmem.formats.input_files import SNAPSHOT_FORMATS

    p = subparsers.add_parser(
        "plot",
        help="draw a snapshot: memory over time, or a map of its segments (PNG)",
        description="Draw a memory snapshot (torchmem.dump_snapshot() or torch.cuda.memory._dump_snapshot()). "
        "By default: allocated and reserved over the recorded history, the gap between them shaded, the "
        "largest free block, OOMs marked. With --segments: one row per segment, blocks coloured by state.",
    )
    p.add_argument("snapshot", help=f"the snapshot: {SNAPSHOT_FORMATS}")
    p.add_argument("-o", "--output", required=True, metavar="FILE.png", help="picture to write")
    p.add_argument("--segments", action="store_true", help="draw the map of segments instead of the timeline")
    p.add_argument("--time", action="store_true", help="timeline against seconds instead of event number")
    p.add_argument("--device", type=int, default=None,
                   help="device index (default: the one with an OOM, else the one with the most history)")
    p.add_argument("--max-segments", type=arguments.count(1), default=40, help="rows in the segment map (default 40, largest first)")
    p.add_argument("--title", default=None, help="title (default: the file name)")
    p.add_argument("--json", action="store_true", help="print what was drawn as JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from torchmem.cli.progress import progress_bar
    from torchmem.formats.snapshot_format import load
    from torchmem.formats.trace_types import TraceError
    from torchmem.viz.png import plot_segments, plot_timeline

    from torchmem.cli.progress import activity

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
