"""`torchmem ranks`: the snapshots of a distributed job's ranks, side by side."""
from __future__ import annotations

import argparse
import json

from torchmem.cli.progress import progress_bar
from torchmem.formats.snapshot_format import load
from torchmem.viz.ranks import format_rows, rank_row


def load_any(path: str) -> dict:
    """A snapshot (pickle or JSON), checked; errors name the file (torchmem.formats.snapshot_format.load)."""

    return load(path)


def run(args: argparse.Namespace) -> int:
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
