"""Allocation traces: read them from disk as chunks of events.

Three formats are read, chosen by looking at the file:

- PyTorch snapshot pickles with ``device_traces``, as written on a GPU by
  ``torch.cuda.memory._record_memory_history()`` + ``_dump_snapshot()``,
  and torchmem's own ``dump_snapshot()`` files (the same format), or the
  same dict saved as one JSON object: read here as data, while their
  events are built by the replay (``torchmem.replay.trace_files.load_trace``);
- JSON lines, one event per line:
  ``{"op": "alloc", "id": 7, "size": 4096, "stream": 0}`` /
  ``{"op": "free", "id": 7}``.

An event is (op, id, size, stream) with op 0 = alloc, 1 = free. Events come
in numpy chunks so that a trace of tens of millions of events never sits in
memory as Python objects. The types (``Trace``, ``Chunk``, ``TraceError``,
...) are in torchmem/formats/trace_types.py, a leaf module.
"""
from __future__ import annotations

import os
from typing import Any, Iterable, Iterator

import numpy as np

from torchmem import _core
from torchmem.formats.trace_types import ALLOC, CHUNK, FREE, Chunk, Trace, TraceError, short_repr
from torchmem.formats.input_files import load_snapshot_json as load_json, load_snapshot_pickle


class _ChunkBuilder:
    def __init__(self) -> None:
        self.ops: list[int] = []
        self.ids: list[int] = []
        self.sizes: list[int] = []
        self.streams: list[int] = []

    def add(self, op: int, id_: int, size: int, stream: int) -> None:
        self.ops.append(op)
        self.ids.append(id_)
        self.sizes.append(size)
        self.streams.append(stream)

    def __len__(self) -> int:
        return len(self.ops)

    def take(self) -> Chunk:
        chunk = Chunk(
            np.asarray(self.ops, dtype=np.uint8),
            np.asarray(self.ids, dtype=np.uint64),
            np.asarray(self.sizes, dtype=np.uint64),
            np.asarray(self.streams, dtype=np.uint64),
        )
        self.__init__()
        return chunk


def from_events(events: Iterable[dict], name: str = "events") -> Trace:
    """A trace from dicts {"op": "alloc"|"free", "id", "size", "stream"} in memory."""
    events = list(events)

    def factory() -> Iterator[Chunk]:
        yield from _parse_event_dicts(events, name, first_index=0)

    return Trace(name, factory, total=len(events))


def _parse_event(event: Any, where: str) -> tuple[int, int, int, int]:
    if not isinstance(event, dict):
        raise TraceError(f"{where}: expected an object like {{\"op\": \"alloc\", \"id\": 1, \"size\": 512}}, got {_short(event, 80)}")
    op = event.get("op")
    if op not in ("alloc", "free"):
        raise TraceError(f"{where}: unknown op {_short(op)} (expected 'alloc' or 'free')")
    if "id" not in event:
        raise TraceError(f"{where}: bad or missing field ('id')")
    id_, size, stream = event["id"], event.get("size", 0), event.get("stream", 0)
    for name, value in (("id", id_), ("size", size), ("stream", stream)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TraceError(f"{where}: {name} must be an integer, got {_short(value)}")
    if max(id_, size, stream) >= 2**64:
        raise TraceError(f"{where}: id, size and stream must be below 2**64")
    if id_ < 0 or size < 0 or stream < 0:
        raise TraceError(f"{where}: id, size and stream must be non-negative")
    if op == "alloc" and size == 0:
        raise TraceError(f"{where}: alloc of 0 bytes")
    return (ALLOC if op == "alloc" else FREE), id_, size, stream


def _short(value: Any, limit: int = 40) -> str:
    """The first `limit` characters of repr(value), as the C++ reader writes them
    (core/traces/python_repr.h: tests/replay/test_jsonl_reader.py holds the two to one message);
    a value nested too deep for repr() is shown by short_repr."""
    try:
        return repr(value)[:limit]
    except RecursionError:
        return short_repr(value, limit)


def _parse_event_dicts(events: Iterable[dict], name: str, first_index: int) -> Iterator[Chunk]:
    builder = _ChunkBuilder()
    for i, event in enumerate(events, first_index):
        builder.add(*_parse_event(event, f"{name}: event {i}"))
        if len(builder) >= CHUNK:
            yield builder.take()
    if len(builder):
        yield builder.take()


def load_jsonl(path: str, skip_bad_events: bool = False) -> Trace:
    """A JSON-lines trace, read by the C++ reader (csrc/core/traces/jsonl_reader.h); errors name the file and line.

    With skip_bad_events, bad lines are skipped: once read, the trace's
    ``skipped_lines`` counts them and ``first_skipped`` names the first."""
    path = os.fspath(path)

    def factory() -> Iterator[Chunk]:
        reader = _core.JsonlReader(os.fsencode(path), skip_bad_lines=skip_bad_events)
        while True:
            try:
                ops, ids, sizes, streams = reader.read(CHUNK)
            except ValueError as exc:
                raise TraceError(f"{path}: {exc}") from None
            trace.skipped_lines, trace.first_skipped = reader.skipped_lines, reader.first_skipped
            if not len(ops):
                return
            yield Chunk(ops, ids, sizes, streams)

    trace = Trace(path, factory, total=None)
    return trace


def load_snapshot(path: str) -> dict:
    """Read a snapshot pickle as data only (input_files.py); errors name the file and what is wrong."""

    return load_snapshot_pickle(path)


def load_snapshot_json(path: str) -> dict:
    """Read a snapshot saved as one JSON object; errors name the file."""

    return load_json(path)


def write_jsonl(trace: Trace, path: str) -> int:
    """Write a trace's allocs and frees as JSON lines; returns the number written."""
    if trace.start is not None and trace.start.segments:
        raise TraceError(f"{trace.name}: recorded mid-run; JSON lines cannot hold the memory live when recording began")
    n = 0
    with open(path, "w") as f:
        for chunk in trace.chunks():
            for op, id_, size, stream in zip(chunk.ops.tolist(), chunk.ids.tolist(), chunk.sizes.tolist(), chunk.streams.tolist()):
                if op not in (ALLOC, FREE):
                    continue  # empty_cache calls, recorded addresses and OOMs of snapshots
                if op == ALLOC:
                    f.write(f'{{"op": "alloc", "id": {id_}, "size": {size}, "stream": {stream}}}\n')
                else:
                    f.write(f'{{"op": "free", "id": {id_}}}\n')
                n += 1
    return n
