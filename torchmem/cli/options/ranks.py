"""The arguments of `torchmem ranks`; the command itself is torchmem/cli/ranks.py."""
from __future__ import annotations

import argparse

from torchmem.cli import arguments
from torchmem.formats.input_files import SNAPSHOT_FORMATS


def register(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = subparsers.add_parser(
        "ranks",
        help="several snapshots (one per rank) side by side",
        description="One table with a row per snapshot (rank): allocated, reserved, reserved but free, largest "
        "free block, the OOM (request, when) and the allocation site holding the most bytes at the end; then "
        "each rank's top sites. The rank comes from the snapshot (written by torchmem.dump_on_oom), else "
        "'rank<N>' in the file name, else the file's position. Files may be pickles or JSON snapshots.",
    )
    p.add_argument("snapshots", nargs="+", metavar="SNAPSHOT",
                   help=f"snapshot files, e.g. oom_rank*.pickle; each is {SNAPSHOT_FORMATS}")
    p.add_argument("--top", type=arguments.count(0), default=5, help="allocation sites listed per rank (default 5)")
    p.add_argument("--device", type=int, default=None,
                   help="device index in every file (default, per file: the one with an OOM, else the one with "
                        "the most history)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
