"""The trace types: what every reader of allocation traces hands on, and the errors they raise.

A leaf of the package: it imports nothing of torchmem, so the readers
(torchmem/traces.py, torchmem/input_files.py, torchmem/replay/) and what they
feed (the replayer, snapshots, the command line) all name these types
without importing one another.

An event is (op, id, size, stream) with op 0 = alloc, 1 = free (snapshot
traces add the ops of torchmem/replay/snapshot_trace.py). Events come in numpy
chunks so that a trace of tens of millions of events never sits in memory
as Python objects.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np

ALLOC, FREE = 0, 1
# The replay's other events (csrc/core/replay/replayer.h, ReplayOp), made from snapshots (replay/snapshot_trace.py).
EMPTY_CACHE, SEGMENT_ADDRESS, FAILED_ALLOC, RELEASE_SEGMENT, SURVIVED_FAILED_ALLOC, POOL, FREE_REQUESTED = 2, 3, 4, 5, 6, 7, 8
CHUNK = 1 << 16

# Actions of PyTorch's device_traces, and what replay does with each.
SNAPSHOT_ACTIONS = {
    "alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
    "segment_map", "segment_unmap", "oom", "snapshot",
}


class TraceError(ValueError):
    """A trace that cannot be read: names the file and the event or line."""


class ArgumentError(ValueError):
    """An argument that does not fit the input (e.g. a device the snapshot does not have): exit status 2
    at the command line, where bad input is 1."""


class DeviceError(TraceError, ArgumentError):
    """A device the snapshot does not have, or one with nothing to replay while another has a trace."""


@dataclass
class Chunk:
    ops: np.ndarray      # uint8: 0 alloc, 1 free (and, in snapshot traces, 2-4: see replay.snapshot_trace)
    ids: np.ndarray      # uint64
    sizes: np.ndarray    # uint64
    streams: np.ndarray  # uint64
    addrs: np.ndarray | None = None  # uint64: recorded addresses (snapshot traces), else None

    def __len__(self) -> int:
        return len(self.ops)


@dataclass
class Trace:
    """A source of events: `chunks()` may be called more than once."""

    name: str
    _factory: Any = field(repr=False)
    total: int | None = None  # number of events, when known up front
    notes: list[str] = field(default_factory=list)
    start: Any = None     # replay.snapshot_trace.StartState: memory when recording began (snapshots)
    recorded: Any = None  # replay.snapshot_trace.RecordedRun: settings, capacity, OOM (snapshots)

    def chunks(self) -> Iterator[Chunk]:
        return self._factory()
