"""Allocation traces: read them from disk as chunks of events.

Three formats are read, chosen by looking at the file:

- PyTorch snapshot pickles with ``device_traces``, as written on a GPU by
  ``torch.cuda.memory._record_memory_history()`` + ``_dump_snapshot()``,
  and torchmem's own ``dump_snapshot()`` files (the same format);
- JSON lines, one event per line:
  ``{"op": "alloc", "id": 7, "size": 4096, "stream": 0}`` /
  ``{"op": "free", "id": 7}``.

An event is (op, id, size, stream) with op 0 = alloc, 1 = free. Events come
in numpy chunks so that a trace of tens of millions of events never sits in
memory as Python objects.
"""
from __future__ import annotations

import os
import pickle
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

import numpy as np

from torchmem import _C

ALLOC, FREE = 0, 1
CHUNK = 1 << 16

# Actions of PyTorch's device_traces, and what replay does with each.
SNAPSHOT_ACTIONS = {
    "alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
    "segment_map", "segment_unmap", "oom", "snapshot",
}


class TraceError(ValueError):
    """A trace that cannot be read: names the file and the event or line."""


@dataclass
class Chunk:
    ops: np.ndarray      # uint8
    ids: np.ndarray      # uint64
    sizes: np.ndarray    # uint64
    streams: np.ndarray  # uint64

    def __len__(self) -> int:
        return len(self.ops)


@dataclass
class Trace:
    """A source of events: `chunks()` may be called more than once."""

    name: str
    _factory: Any = field(repr=False)
    total: int | None = None  # number of events, when known up front
    notes: list[str] = field(default_factory=list)

    def chunks(self) -> Iterator[Chunk]:
        return self._factory()


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
        raise TraceError(f"{where}: expected an object like {{\"op\": \"alloc\", \"id\": 1, \"size\": 512}}, got {event!r:.80}")
    op = event.get("op")
    if op not in ("alloc", "free"):
        raise TraceError(f"{where}: unknown op {op!r} (expected 'alloc' or 'free')")
    if "id" not in event:
        raise TraceError(f"{where}: bad or missing field ('id')")
    id_, size, stream = event["id"], event.get("size", 0), event.get("stream", 0)
    for name, value in (("id", id_), ("size", size), ("stream", stream)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TraceError(f"{where}: {name} must be an integer, got {value!r}")
    if max(id_, size, stream) >= 2**64:
        raise TraceError(f"{where}: id, size and stream must be below 2**64")
    if id_ < 0 or size < 0 or stream < 0:
        raise TraceError(f"{where}: id, size and stream must be non-negative")
    if op == "alloc" and size == 0:
        raise TraceError(f"{where}: alloc of 0 bytes")
    return (ALLOC if op == "alloc" else FREE), id_, size, stream


def _parse_event_dicts(events: Iterable[dict], name: str, first_index: int) -> Iterator[Chunk]:
    builder = _ChunkBuilder()
    for i, event in enumerate(events, first_index):
        builder.add(*_parse_event(event, f"{name}: event {i}"))
        if len(builder) >= CHUNK:
            yield builder.take()
    if len(builder):
        yield builder.take()


def load_jsonl(path: str) -> Trace:
    """A JSON-lines trace, read by the C++ reader (csrc/core/jsonl_reader.h); errors name the file and line."""
    path = os.fspath(path)

    def factory() -> Iterator[Chunk]:
        reader = _C.JsonlReader(os.fsencode(path))
        while True:
            try:
                ops, ids, sizes, streams = reader.read(CHUNK)
            except ValueError as exc:
                raise TraceError(f"{path}: {exc}") from None
            if not len(ops):
                return
            yield Chunk(ops, ids, sizes, streams)

    return Trace(path, factory, total=None)


def snapshot_events(snapshot: dict, name: str, device: int | None = None) -> Trace:
    """The allocation events of a PyTorch memory snapshot's device_traces.

    Addresses are reused after a free, so each alloc gets a fresh id. Frees of
    blocks allocated before recording began are skipped (and counted in the
    trace's notes); segment and OOM entries are ignored: the replay makes its
    own segment decisions.
    """
    traces = snapshot.get("device_traces")
    if not isinstance(traces, list):
        raise TraceError(f"{name}: no device_traces: record with torch.cuda.memory._record_memory_history() before dumping")
    if device is None:
        device = max(range(len(traces)), key=lambda d: len(traces[d]) if isinstance(traces[d], list) else -1, default=0)
    if not 0 <= device < len(traces):
        raise TraceError(f"{name}: no device {device} (the snapshot has {len(traces)})")
    entries = traces[device]
    if not isinstance(entries, list):
        raise TraceError(f"{name}: device_traces[{device}] is not a list of trace entries")
    actions = {e.get("action") for e in entries if isinstance(e, dict)}
    free_action = "free_completed" if "free_completed" in actions else "free_requested"
    notes: list[str] = []

    def factory() -> Iterator[Chunk]:
        builder = _ChunkBuilder()
        live: dict[int, int] = {}
        next_id = 0
        unmatched = 0
        for i, entry in enumerate(entries):
            if not isinstance(entry, dict) or "action" not in entry:
                raise TraceError(f"{name}: device {device} event {i}: not a trace entry")
            action = entry["action"]
            if action not in SNAPSHOT_ACTIONS:
                raise TraceError(f"{name}: device {device} event {i}: unknown action {action!r}")
            if action not in ("alloc", free_action):
                continue
            try:
                addr, size, stream = int(entry["addr"]), int(entry.get("size", 0)), int(entry.get("stream", 0))
                if addr < 0 or size < 0 or stream < 0 or (action == "alloc" and size == 0):
                    raise ValueError("negative or zero size, address or stream")
            except (KeyError, TypeError, ValueError, OverflowError) as exc:
                raise TraceError(f"{name}: device {device} event {i}: bad {action} entry ({type(exc).__name__}: {exc})") from None
            if action == "alloc":
                live[addr] = next_id
                builder.add(ALLOC, next_id, size, stream)
                next_id += 1
            else:
                id_ = live.pop(addr, None)
                if id_ is None:
                    unmatched += 1
                    continue
                builder.add(FREE, id_, 0, stream)
            if len(builder) >= CHUNK:
                yield builder.take()
        if len(builder):
            yield builder.take()
        if unmatched and not notes:
            notes.append(f"skipped {unmatched} frees of blocks allocated before recording began")

    total = sum(1 for e in entries if isinstance(e, dict) and e.get("action") in ("alloc", free_action))
    return Trace(name, factory, total=total, notes=notes)


def load_snapshot(path: str) -> dict:
    """Read a snapshot pickle; errors name the file and what is wrong."""
    try:
        with open(path, "rb") as f:
            data = pickle.load(f)
    except FileNotFoundError:
        raise
    except (pickle.UnpicklingError, EOFError, AttributeError, ImportError, IndexError, ValueError) as exc:
        raise TraceError(f"{path}: not a readable snapshot pickle ({type(exc).__name__}: {exc}); truncated file?") from None
    if not isinstance(data, dict) or "segments" not in data:
        raise TraceError(f"{path}: a pickle, but not a memory snapshot (expected a dict with 'segments' and 'device_traces')")
    return data


def load_trace(path: str, device: int | None = None) -> Trace:
    """Any supported trace file, by its content."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file")
    with open(path, "rb") as f:
        head = f.read(64).lstrip()
    if not head:
        raise TraceError(f"{path}: empty file")
    if head[:1] == b"\x80":
        return snapshot_events(load_snapshot(path), path, device)
    if head[:1] == b"{":
        return load_jsonl(path)
    raise TraceError(f"{path}: unknown format (expected a snapshot pickle or JSON lines of events)")


def write_jsonl(trace: Trace, path: str) -> int:
    """Write a trace as JSON lines; returns the number of events."""
    n = 0
    with open(path, "w") as f:
        for chunk in trace.chunks():
            for op, id_, size, stream in zip(chunk.ops.tolist(), chunk.ids.tolist(), chunk.sizes.tolist(), chunk.streams.tolist()):
                if op == ALLOC:
                    f.write(f'{{"op": "alloc", "id": {id_}, "size": {size}, "stream": {stream}}}\n')
                else:
                    f.write(f'{{"op": "free", "id": {id_}}}\n')
                n += 1
    return n
