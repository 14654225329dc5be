"""`torchmem replay`: replay a trace on a simulated GPU and say what happened."""
from __future__ import annotations

import argparse
import json
import sys


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "replay",
        help="replay an allocation trace on a simulated device",
        description="Replay a trace (a PyTorch or torchmem snapshot pickle, or JSON lines of "
        '{"op": "alloc"|"free", "id": N, "size": BYTES, "stream": S}) through torchmem\'s caching '
        "allocator on a simulated device, to reproduce out-of-memory errors and try fixes.",
    )
    p.add_argument("trace", help="trace file")
    p.add_argument("--capacity", default="80GiB", help="device capacity (default 80GiB)")
    p.add_argument("--in-use-by-others", default="0", help="memory held outside PyTorch, e.g. 2GiB (default 0)")
    p.add_argument("--conf", default="", help="allocator config, e.g. expandable_segments:True")
    p.add_argument("--compare", nargs="+", metavar="CONF", default=None, help="also replay under these configs ('' = default)")
    p.add_argument("--device", type=int, default=None, help="device index in a snapshot with several")
    p.add_argument("--skip-bad-events", action="store_true", help="skip frees of unknown ids with a warning instead of failing")
    p.add_argument("--json", action="store_true", help="print one JSON object (a list with --compare)")
    p.add_argument("--plot", metavar="FILE.png", help="draw allocated and reserved over the trace")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from torchmem import sim
    from torchmem.progress import progress_bar
    from torchmem.traces import load_trace

    trace = load_trace(args.trace, device=args.device)
    confs = [args.conf] + (args.compare or [])
    results = []
    for conf in confs:
        with progress_bar(trace.total, f"replay {conf or 'default'}", disable=args.no_progress or args.json) as update:
            results.append(
                sim.replay(
                    trace, args.capacity, conf, skip_bad_events=args.skip_bad_events,
                    progress=update, in_use_by_others=args.in_use_by_others,
                )
            )
    for note in results[0].notes:
        print(f"note: {note}", file=sys.stderr)
    if results[0].skipped:
        print(f"warning: skipped {results[0].skipped} bad events", file=sys.stderr)
    if args.json:
        out = [r.to_json() for r in results]
        print(json.dumps(out if args.compare else out[0], indent=2))
    else:
        print(results[0].explain())
        if len(results) > 1:
            print()
            for r in results:
                print(r.summary())
    if args.plot:
        from torchmem.plots import plot_replays

        plot_replays(results, args.plot, title=args.trace)
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0
