"""`torchmem advise`: which allocator setting fits a trace in the least memory."""
from __future__ import annotations

import argparse
import json
import sys


def register(subparsers) -> None:
    from torchmem.cli import arguments
    from torchmem.input_files import TRACE_FORMATS

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
    p.add_argument("--device", type=int, default=None, help="device of a snapshot (default: the one with an OOM)")
    p.add_argument("--capacity", default=None, type=arguments.size("--capacity"), help="reference capacity (default: the snapshot's, else 80GiB)")
    p.add_argument("--try", dest="extra", nargs="+", metavar="CONF", default=[], type=arguments.conf, help="more settings to try")
    p.add_argument("--in-use-by-others", default="0", type=arguments.size("--in-use-by-others", allow_zero=True), help="memory held outside PyTorch, e.g. 2GiB (default 0)")
    p.add_argument("--skip-bad-events", action="store_true", help="skip bad trace entries with a warning")
    p.add_argument("--no-stitch", action="store_true", help="PyTorch's settings only: leave out torchmem's policy:stitch")
    p.add_argument("--json", action="store_true", help="print a JSON list, best first")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from torchmem.cli import arguments
    from torchmem.progress import progress_bar
    from torchmem.replay import advise, candidates, load_trace

    trace = load_trace(args.trace, device=args.device, skip_bad_events=args.skip_bad_events)
    arguments.require_trace(trace, args.trace, args.device is not None, "advise compares settings on the trace")
    base = trace.recorded.conf if trace.recorded is not None and trace.recorded.conf is not None else ""
    total = len(candidates(base, args.extra, not args.no_stitch)) + 3
    with progress_bar(total, "advise", disable=args.no_progress or args.json, unit="setting") as update:
        rows = advise(trace, args.capacity, extra=args.extra, skip_bad_events=args.skip_bad_events,
                      progress=update, in_use_by_others=args.in_use_by_others, stitch=not args.no_stitch)
    for note in trace.notes:
        print(f"note: {note}", file=sys.stderr)
    if args.json:
        print(json.dumps([r.to_json() for r in rows], indent=2))
        return 0
    reference = rows[0].capacity
    print(f"Least memory each setting needs to complete {args.trace} (to 2 MiB), best first; "
          f"reference capacity {reference / 2**30:.2f} GiB:")
    for r in rows:
        print("  " + r.summary())
    baseline = next((r for r in rows if r.recorded), None)
    what = "the run's own setting"
    if baseline is None:  # a trace without settings: compare with PyTorch's defaults
        baseline, what = next((r for r in rows if not r.conf), None), "PyTorch's defaults"
    native = [r for r in rows if r.policy == "native"]  # what PYTORCH_CUDA_ALLOC_CONF can say
    best = native[0] if native else rows[0]
    if baseline is not None and best.min_capacity is not None and best is not baseline and (
            baseline.min_capacity is None or best.min_capacity < baseline.min_capacity):
        saved = "" if baseline.min_capacity is None else f", {(baseline.min_capacity - best.min_capacity) / 2**30:.2f} GiB less than {what}"
        print(f"Best: PYTORCH_CUDA_ALLOC_CONF={best.conf}{saved}.")
    elif baseline is not None:
        print(f"No setting tried needs less memory than {what}.")
    stitched = next((r for r in rows if r.policy == "stitch"), None)
    if stitched is not None and stitched.min_capacity is not None:
        versus = "" if best.min_capacity is None else (
            f", {(best.min_capacity - stitched.min_capacity) / 2**30:.2f} GiB less than the best PyTorch setting"
            if stitched.min_capacity < best.min_capacity else ", no less than the best PyTorch setting")
        print(f"With torchmem installed: TORCHMEM_ALLOC_CONF={stitched.conf} needs {stitched.min_capacity / 2**30:.2f} GiB"
              f"{versus} (docs/stitch.md).")
    best = rows[0]
    if not any(r.completes for r in rows) and best.min_capacity is not None:
        print(f"None completes on {reference / 2**30:.2f} GiB: the least any needs is {best.min_capacity / 2**30:.2f} GiB "
              f"({(best.min_capacity - reference) / 2**30:.2f} GiB more). Less must be live at the peak "
              "(a smaller batch, activation checkpointing), or the card must be larger.")
    return 0
