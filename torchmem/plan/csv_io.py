"""MiniMalloc's CSV format: header ``id,lower,upper,size`` (a solution adds
``offset``), one buffer per line, half-open lifetimes, sizes in bytes."""
from __future__ import annotations

import csv
import os
from typing import TYPE_CHECKING, Union

from torchmem.plan.buffers import Buffer

if TYPE_CHECKING:
    from torchmem.plan.solve import Plan

PathLike = Union[str, "os.PathLike[str]"]
COLUMNS = ["id", "lower", "upper", "size"]


def _id(text: str) -> Union[int, str]:
    try:
        return int(text)
    except ValueError:
        return text


def load_csv(path: PathLike) -> list[Buffer]:
    """Reads buffers; ValueError naming the file and line on malformed input."""
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
            try:
                buffers.append(Buffer(bid, lower, upper, size))
            except ValueError as exc:
                raise ValueError(f"{path}:{line}: {exc}") from None
    return buffers


def save_csv(plan: "Plan", path: PathLike) -> None:
    """Writes ``id,lower,upper,size,offset``: MiniMalloc's solution format."""
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(COLUMNS + ["offset"])
        for b, off in zip(plan.buffers, plan.offsets):
            writer.writerow([b.id, b.lower, b.upper, b.size, off])
