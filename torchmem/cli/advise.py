"""`torchmem advise`: which allocator setting fits a trace in the least memory."""
from __future__ import annotations

import argparse
import json
import sys

from torchmem.sizes import fmt_size, size_reading


def register(subparsers) -> None:
    from torchmem.cli import arguments
    from torchmem.formats.input_files import TRACE_FORMATS

    p = subparsers.add_parser(
        "advise",
        help="find the allocator setting under which a trace needs the least memory",
        description="Replay a trace (a snapshot written on a GPU, or JSON lines) under candidate settings "
        "(the recorded one, expandable segments, max_split_size_mb, garbage collection, "
        "roundup_power2_divisions, pairs that help, and torchmem's own policy:stitch) and give, for each, the "
        "smallest capacity at which the trace completes (to 2 MiB), its peak reserved, and whether it completes "
        "at the snapshot's capacity.",
    )
    p.add_argument("trace", help=f"the trace: {TRACE_FORMATS}")
    p.add_argument("--device", type=int, default=None,
                   help="device of a snapshot (default: the one with an OOM, else the one with the most history)")
    p.add_argument("--capacity", default=None, type=arguments.size("--capacity"),
                   help="reference capacity with a unit: 80GiB (2**30 bytes each) or 80GB (10**9 bytes each) "
                        "(default: the snapshot's, else 80GiB)")
    p.add_argument("--try", dest="extra", nargs="+", metavar="CONF", default=[], type=arguments.conf, help="more settings to try")
    p.add_argument("--in-use-by-others", default="0", type=arguments.size("--in-use-by-others", allow_zero=True), help="memory held outside PyTorch, e.g. 2GiB (default 0)")
    p.add_argument("--skip-bad-events", action="store_true", help="skip bad trace entries with a warning")
    p.add_argument("--no-stitch", action="store_true", help="PyTorch's settings only: leave out torchmem's policy:stitch")
    p.add_argument("--json", action="store_true", help="print a JSON list, best first")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from torchmem.cli import arguments
    from torchmem.cli.progress import progress_bar
    from torchmem.replay import advise, candidates, load_trace
    from torchmem.replay.advise_words import COLUMNS, table, verdict

    from torchmem.cli.progress import activity

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
