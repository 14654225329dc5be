"""The arguments of `torchmem viz`; the command itself is torchmem/cli/viz.py."""
from __future__ import annotations

import argparse

from torchmem.cli import arguments
from torchmem.formats.input_files import SNAPSHOT_FORMATS


def register(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = subparsers.add_parser(
        "viz",
        help="write a self-contained HTML page for a snapshot (works with no network)",
        description="Write one HTML file (inline SVG and CSS, nothing loaded from the network) showing a "
        "snapshot's totals, memory over the recorded history, its segments with their blocks, and live "
        "memory by allocation site. Hover a block or a point for details.",
    )
    p.add_argument("snapshot", help=f"the snapshot: {SNAPSHOT_FORMATS}")
    p.add_argument("-o", "--output", required=True, metavar="FILE.html", help="page to write")
    p.add_argument("--device", type=int, default=None,
                   help="device index (default: the one with an OOM, else the one with the most history)")
    p.add_argument("--title", default=None, help="page title (default: the file name)")
    p.add_argument("--json", action="store_true", help="print the output path and size as JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
