"""`torchmem ranks`: the snapshots of a distributed job's ranks, side by side."""
from __future__ import annotations

import argparse
import json


def register(subparsers) -> None:
    from torchmem.cli import arguments
    from torchmem.formats.input_files import SNAPSHOT_FORMATS

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
    p.set_defaults(func=run)


def load_any(path: str) -> dict:
    """A snapshot (pickle or JSON), checked; errors name the file (torchmem.formats.snapshot_format.load)."""
    from torchmem.formats.snapshot_format import load

    return load(path)


def run(args: argparse.Namespace) -> int:
    from torchmem.cli.progress import progress_bar
    from torchmem.viz.ranks import format_rows, rank_row

    if args.top < 0:
        raise ValueError(f"--top must be 0 or more, not {args.top}")
    rows = []
    with progress_bar(len(args.snapshots), "load", disable=args.no_progress or args.json, unit="file") as update:
        for i, path in enumerate(args.snapshots):
            rows.append(rank_row(load_any(path), path, i, args.top, args.device))
            update(i + 1)
    rows.sort(key=lambda r: (r["rank"], r["file"]))
    if args.json:
        print(json.dumps({"ranks": rows}, indent=2))
    else:
        print(format_rows(rows))
    return 0
