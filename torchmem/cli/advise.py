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
    from torchmem.progress import progress_bar
    from torchmem.replay import advise, candidates, load_trace
    from torchmem.replay.runner import fmt_size, size_reading

    from torchmem.progress import activity

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
    for r in rows:
        print("  " + r.summary())
    print(COLUMNS.format(reference=fmt_size(reference)))
    for line in verdict(rows):
        print(line)
    return 0


COLUMNS = ("  needs: the least device memory with which the trace completes under that setting (it completes there "
           "and fails 2 MiB below); peak reserved: the most the allocator held from the device, replayed on "
           "{reference} (on its 'needs' when it does not complete there); at {reference}: whether it completes "
           "on the reference capacity.")


def verdict(rows: list) -> list[str]:
    """The lines under advise's table; they name the rows they compare, so they agree with the table."""
    from torchmem.replay.advise import as_pytorch_setting
    from torchmem.replay.runner import fmt_size

    lines = []
    reference = rows[0].capacity
    baseline = next((r for r in rows if r.recorded), None)
    what = "the run's own setting"
    if baseline is None:  # a trace without settings: compare with PyTorch's defaults
        baseline, what = next((r for r in rows if not r.conf), None), "PyTorch's defaults"
    native = [r for r in rows if r.policy == "native"]  # what PYTORCH_CUDA_ALLOC_CONF can say
    best = native[0] if native else None
    stitched = next((r for r in rows if r.policy == "stitch"), None)
    base_need = "never completes" if baseline is None or baseline.min_capacity is None else f"needs {fmt_size(baseline.min_capacity)}"
    if best is not None and best.min_capacity is not None and best is not baseline and baseline is not None and (
            baseline.min_capacity is None or best.min_capacity < baseline.min_capacity):
        saved = "" if baseline.min_capacity is None else f", {fmt_size(baseline.min_capacity - best.min_capacity)} less than {what}"
        lines.append(f"Best PyTorch setting: PYTORCH_CUDA_ALLOC_CONF={as_pytorch_setting(best.conf)} needs {fmt_size(best.min_capacity)}{saved} "
                     f"({base_need}).")
        if best.peak_reserved > baseline.peak_reserved:
            why = (" (max_split_size_mb: a cached block above the limit is not split for a smaller request)"
                   if "max_split_size_mb" in best.conf else "")
            lines.append(f"  Its peak reserved ({fmt_size(best.peak_reserved)}) is above {what}'s "
                         f"({fmt_size(baseline.peak_reserved)}) on {fmt_size(reference)}: while the card has room, "
                         f"the allocator takes a new segment rather than release its cache, and under this setting "
                         f"cached blocks serve fewer requests{why}, so it holds more there; on a smaller card a "
                         f"refused segment makes it release its cache and retry, and it completes in "
                         f"{fmt_size(best.min_capacity)}.")
    elif baseline is not None:
        lines.append(f"No PyTorch setting tried needs less memory than {what} ({base_need}).")
    if stitched is not None and stitched.min_capacity is not None:
        reference_row = best if best is not None and best.min_capacity is not None else None
        versus = "" if reference_row is None else (
            f", {fmt_size(reference_row.min_capacity - stitched.min_capacity)} less than the best PyTorch setting"
            if stitched.min_capacity < reference_row.min_capacity else ", no less than the best PyTorch setting")
        lines.append(f"With torchmem installed: TORCHMEM_ALLOC_CONF={stitched.conf} needs {fmt_size(stitched.min_capacity)}"
                     f"{versus} (docs/stitch.md).")
    first = rows[0]
    if not any(r.completes for r in rows) and first.min_capacity is not None:
        lines.append(f"None completes on {fmt_size(reference)}: the least any needs is {fmt_size(first.min_capacity)} "
                     f"({fmt_size(first.min_capacity - reference)} more). Less must be live at the peak "
                     "(a smaller batch, activation checkpointing), or the card must be larger.")
    return lines
