"""MiniMalloc's CSV format: header ``id,lower,upper,size`` (a solution adds
``offset``), one buffer per line, half-open lifetimes, sizes in bytes.

Optional columns for several streams, found by name anywhere after the
first four: ``stream`` (the producer's stream, default 0), ``reads`` (uses on
other streams, ``1@7;2@9``) and ``syncs`` (``0@3>1@4``: recorded on stream 0
after step 3, waited on by stream 1 before step 4). Files without them load
as before; other extra columns are ignored.
"""
from __future__ import annotations

import csv
import os
from typing import TYPE_CHECKING, Union

from torchmem.plan.buffers import Buffer, has_streams
from torchmem.plan.streams import format_reads, format_syncs, parse_reads, parse_syncs

if TYPE_CHECKING:
    from torchmem.plan.solve import Plan

PathLike = Union[str, "os.PathLike[str]"]
COLUMNS = ["id", "lower", "upper", "size"]
STREAM_COLUMNS = ["stream", "reads", "syncs"]


def _id(text: str) -> Union[int, str]:
    try:
        return int(text)
    except ValueError:
        return text


def load_csv(path: PathLike) -> list[Buffer]:
    """Reads buffers; ValueError naming the file and line on malformed input (a binary file too)."""
    try:
        return _load_csv(path)
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8 text, not a CSV of buffers "
                         "(expected a header id,lower,upper,size)") from None


def _load_csv(path: PathLike) -> list[Buffer]:
    buffers: list[Buffer] = []
    seen: set = set()
    with open(path, newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            raise ValueError(f"{path}: empty file (expected header {','.join(COLUMNS)})")
        header = [h.strip() for h in header]
        if header[:4] != COLUMNS:
            raise ValueError(f"{path}:1: expected header {','.join(COLUMNS)}[,offset], got {','.join(header)}")
        extra = {name: k for k, name in enumerate(header) if k >= 4 and name in STREAM_COLUMNS}
        for line, row in enumerate(reader, start=2):
            if not row or all(not cell.strip() for cell in row):
                continue
            if len(row) < 4:
                raise ValueError(f"{path}:{line}: expected 4 fields (id,lower,upper,size), got {len(row)}")
            try:
                lower, upper, size = (int(cell.strip()) for cell in row[1:4])
            except ValueError:
                raise ValueError(f"{path}:{line}: lower, upper and size must be integers, got {','.join(row)}") from None
            bid = _id(row[0].strip())
            if bid in seen:
                raise ValueError(f"{path}:{line}: duplicate id {bid!r}")
            seen.add(bid)
            cells = {name: (row[k].strip() if k < len(row) else "") for name, k in extra.items()}
            try:
                stream_text = cells.get("stream", "")
                try:
                    stream = int(stream_text) if stream_text else 0
                except ValueError:
                    raise ValueError(f"stream must be an integer, got {stream_text!r}") from None
                reads = parse_reads(cells.get("reads", ""))
                syncs = parse_syncs(cells.get("syncs", ""))
                buffers.append(Buffer(bid, lower, upper, size, stream, reads, syncs))
            except ValueError as exc:
                raise ValueError(f"{path}:{line}: {exc}") from None
    return buffers


def save_csv(plan: "Plan", path: PathLike) -> None:
    """Writes ``id,lower,upper,size,offset`` (MiniMalloc's solution format),
    then ``stream,reads,syncs`` when the buffers use streams."""
    streams = has_streams(plan.buffers)
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(COLUMNS + ["offset"] + (STREAM_COLUMNS if streams else []))
        for b, off in zip(plan.buffers, plan.offsets):
            row = [b.id, b.lower, b.upper, b.size, off]
            if streams:
                row += [b.stream, format_reads(b.reads), format_syncs(b.syncs)]
            writer.writerow(row)
