"""Streams in the planner's input (the model is csrc/core/planner/streams/streams.h).

Time is one axis of steps, the order in which the program issues its
operations. A buffer is produced on its ``stream`` at step ``lower`` and used
there through ``upper - 1``; ``reads`` adds uses ``(stream, step)`` on other
streams. A ``Sync(src, after, dst, before)`` is an event recorded on stream
``src`` after its step ``after`` and waited on by stream ``dst`` before its
step ``before``. A buffer's bytes go to another buffer only once every use of
the first happens before the second's producer, so a read in flight on
another stream keeps it live until a synchronisation after that read leads
back.

This module holds the stream parts of a buffer (``Read``, ``Sync``) and their
checks; a buffer and its lifetime, under streams too, are in
torchmem/plan/buffers.py.

Text forms (the CSV columns): reads ``"1@7;2@9"`` (stream@step), syncs
``"0@3>1@4;1@8>0@9"`` (src@after>dst@before).
"""
from __future__ import annotations

import re
from typing import Any, Iterable, NamedTuple, Sequence

STREAM_LIMIT = 2**31


class Read(NamedTuple):
    """A use of a buffer on ``stream`` at ``step``."""

    stream: int
    step: int


class Sync(NamedTuple):
    """An event recorded on stream ``src`` after step ``after``, waited on by
    stream ``dst`` before step ``before``."""

    src: int
    after: int
    dst: int
    before: int

    def __str__(self) -> str:
        return f"{self.src}@{self.after}>{self.dst}@{self.before}"


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            as_int = int(value)
        except (TypeError, ValueError):
            raise ValueError(f"{what} must be an integer, got {value!r}") from None
        if as_int != value:
            raise ValueError(f"{what} must be an integer, got {value!r}")
        value = as_int
    if not -(2**63) <= value < 2**63:
        raise ValueError(f"{what} {value} does not fit in 63 bits")
    return value


def check_stream(value: Any, what: str) -> int:
    s = _int(value, what)
    if not 0 <= s < STREAM_LIMIT:
        raise ValueError(f"{what} must be in 0..2**31-1, got {s}")
    return s


def as_reads(items: Iterable[Any] | str, owner: str) -> tuple[Read, ...]:
    """Reads from (stream, step) pairs or their text form."""
    if isinstance(items, str):
        try:
            items = parse_reads(items)
        except ValueError as exc:
            raise ValueError(f"{owner}: {exc}") from None
    out = []
    for item in items:
        if not isinstance(item, Sequence) or isinstance(item, (str, bytes)) or len(item) != 2:
            raise ValueError(f"{owner}: a read must be (stream, step), got {item!r}")
        out.append(Read(check_stream(item[0], f"{owner}: read stream"), _int(item[1], f"{owner}: read step")))
    return tuple(out)


def as_syncs(items: Iterable[Any] | str, owner: str) -> tuple[Sync, ...]:
    """Syncs from (src, after, dst, before) quadruples or their text form."""
    if isinstance(items, str):
        try:
            items = parse_syncs(items)
        except ValueError as exc:
            raise ValueError(f"{owner}: {exc}") from None
    out = []
    for item in items:
        if not isinstance(item, Sequence) or isinstance(item, (str, bytes)) or len(item) != 4:
            raise ValueError(f"{owner}: a sync must be (src, after, dst, before), got {item!r}")
        out.append(Sync(check_stream(item[0], f"{owner}: sync src"), _int(item[1], f"{owner}: sync after"),
                        check_stream(item[2], f"{owner}: sync dst"), _int(item[3], f"{owner}: sync before")))
    return tuple(out)


_READ = re.compile(r"^\s*(-?\d+)\s*@\s*(-?\d+)\s*$")
_SYNC = re.compile(r"^\s*(-?\d+)\s*@\s*(-?\d+)\s*>\s*(-?\d+)\s*@\s*(-?\d+)\s*$")


def _parts(text: str) -> list[str]:
    return [p for p in re.split(r"[;\s]+", text.strip()) if p] if text.strip() else []


def parse_reads(text: str) -> list[tuple[int, int]]:
    """``"1@7;2@9"`` -> [(1, 7), (2, 9)]; ValueError on anything else."""
    out = []
    for part in _parts(text):
        m = _READ.match(part)
        if not m:
            raise ValueError(f"bad read {part!r} (expected stream@step, e.g. 1@7)")
        out.append((int(m.group(1)), int(m.group(2))))
    return out


def parse_syncs(text: str) -> list[tuple[int, int, int, int]]:
    """``"0@3>1@4"`` -> [(0, 3, 1, 4)]; ValueError on anything else."""
    out = []
    for part in _parts(text.replace(" > ", ">")):
        m = _SYNC.match(part)
        if not m:
            raise ValueError(f"bad sync {part!r} (expected src@after>dst@before, e.g. 0@3>1@4)")
        out.append(tuple(int(g) for g in m.groups()))
    return out


def format_reads(reads: Iterable[Read]) -> str:
    return ";".join(f"{r.stream}@{r.step}" for r in reads)


def format_syncs(syncs: Iterable[Sync]) -> str:
    return ";".join(str(s) for s in syncs)
