"""`torchmem advise`: which allocator setting fits a trace in the least memory."""
from __future__ import annotations

import argparse
import json
import sys

from torchmem.cli import arguments
from torchmem.cli.progress import activity, progress_bar
from torchmem.replay import advise, candidates, load_trace
from torchmem.replay.advise_words import COLUMNS, table, verdict
from torchmem.sizes import fmt_size, size_reading


def run(args: argparse.Namespace) -> int:
    with activity(f"reading {args.trace}", disable=args.no_progress or args.json):
        trace = load_trace(args.trace, device=args.device, skip_bad_events=args.skip_bad_events)
    arguments.require_trace(trace, args.trace, args.device is not None, "advise compares settings on the trace")
    base = trace.recorded.conf if trace.recorded is not None and trace.recorded.conf is not None else ""
    total = len(candidates(base, args.extra, not args.no_stitch)) + 3
    with progress_bar(total, "advise", disable=args.no_progress or args.json, unit="setting") as update:
        rows = advise(trace, args.capacity, extra=args.extra, skip_bad_events=args.skip_bad_events,
                      progress=update, in_use_by_others=args.in_use_by_others, stitch=not args.no_stitch)
    for note in trace.notes:
        print(f"note: {note}", file=sys.stderr)
    reference = rows[0].capacity
    used = f" on {trace.recorded.device_choice}" if trace.recorded is not None and trace.recorded.device_choice else ""
    if trace.recorded is not None and args.json:
        print(f"advise {args.trace}: {trace.recorded.device_choice}", file=sys.stderr)
    if args.json:
        print(json.dumps([r.to_json() for r in rows], indent=2))
        return 0
    print(f"Least memory each setting needs to complete {args.trace}{used}, to 2 MiB, best first; "
          f"reference capacity {fmt_size(reference)}:")
    read = size_reading(args.capacity) if args.capacity else ""
    if read:
        print(f"  (--capacity {read})")
    for line in table(rows):
        print(line)
    print(COLUMNS.format(reference=fmt_size(reference)))
    for line in verdict(rows):
        print(line)
    return 0
