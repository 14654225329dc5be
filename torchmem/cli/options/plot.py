"""The arguments of `torchmem plot`; the command itself is torchmem/cli/plot.py."""
from __future__ import annotations

import argparse

from torchmem.cli import arguments
from torchmem.formats.input_files import SNAPSHOT_FORMATS


def register(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
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
