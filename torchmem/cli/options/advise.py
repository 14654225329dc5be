"""The arguments of `torchmem advise`; the command itself is torchmem/cli/advise.py."""
from __future__ import annotations

import argparse

from torchmem.cli import arguments
from torchmem.formats.input_files import TRACE_FORMATS


def register(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
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
