"""The arguments of `torchmem replay`; the command itself is torchmem/cli/replay.py."""
from __future__ import annotations

import argparse

from torchmem.cli import arguments
from torchmem.formats.input_files import TRACE_FORMATS


def register(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = subparsers.add_parser(
        "replay",
        help="replay an allocation trace on a simulated device",
        description="Replay a trace (a PyTorch or torchmem snapshot, pickle or JSON, or JSON lines of "
        '{"op": "alloc"|"free", "id": N, "size": BYTES, "stream": S}) through torchmem\'s caching '
        "allocator on a simulated device. A snapshot with nothing else given replays exactly what happened "
        "on its GPU: its settings, the memory live when recording began, every address, its OOM.",
    )
    p.add_argument("trace", help=f"the trace: {TRACE_FORMATS}")
    p.add_argument("--capacity", default=None, type=arguments.size("--capacity"),
                   help="device capacity with a unit: 80GiB (2**30 bytes each) or 80GB (10**9 bytes each) "
                        "(default: from the snapshot's OOM, else 80GiB)")
    p.add_argument("--in-use-by-others", default=None, type=arguments.size("--in-use-by-others", allow_zero=True), help="memory held outside PyTorch, e.g. 2GiB (default: what the recording's card held, on its own card; else 0)")
    p.add_argument("--conf", default=None, type=arguments.conf, help="allocator config (default: the snapshot's recorded settings)")
    p.add_argument("--compare", nargs="+", metavar="CONF", default=None, type=arguments.conf,
                   help="also replay under these configs ('' = PyTorch's defaults; policy:stitch = torchmem's "
                        "least-memory policy, docs/stitch.md)")
    p.add_argument("--device", type=int, default=None,
                   help="device of a snapshot (default: the one with an OOM, else the one with the most history)")
    p.add_argument("--skip-bad-events", action="store_true", help="skip bad events with a counted warning instead of failing")
    p.add_argument("--json", action="store_true", help="print one JSON object (a list with --compare)")
    p.add_argument("--plot", metavar="FILE.png", help="draw allocated and reserved over the trace")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
