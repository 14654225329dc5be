"""The trace types: what every reader of allocation traces hands on, and the errors they raise.

Near the bottom of the package: it imports only the extension, so the
readers (torchmem/traces.py, torchmem/input_files.py, torchmem/replay/) and
what they feed (the replayer, snapshots, the command line) all name these
types without importing one another.

An event is (op, id, size, stream). The op codes are the core's (ReplayOp in
csrc/core/replay/replayer.h, read from torchmem._C.rules): JSON-lines traces
hold only ALLOC and FREE; snapshot traces use the others too
(torchmem/replay/snapshot_trace.py). Events come in numpy chunks so that a
trace of tens of millions of events never sits in memory as Python objects.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np

from torchmem import _C

_OPS: dict[str, int] = _C.rules.REPLAY_OPS
ALLOC, FREE = _OPS["ALLOC"], _OPS["FREE"]
EMPTY_CACHE, SEGMENT_ADDRESS, FAILED_ALLOC = _OPS["EMPTY_CACHE"], _OPS["SEGMENT_ADDRESS"], _OPS["FAILED_ALLOC"]
RELEASE_SEGMENT, SURVIVED_FAILED_ALLOC = _OPS["RELEASE_SEGMENT"], _OPS["SURVIVED_FAILED_ALLOC"]
POOL, FREE_REQUESTED, RANGE_OFFER = _OPS["POOL"], _OPS["FREE_REQUESTED"], _OPS["RANGE_OFFER"]
RECORDED_RETRY, FREE_AT_SYNC = _OPS["RECORDED_RETRY"], _OPS["FREE_AT_SYNC"]
REQUEST_RELEASE = _OPS["REQUEST_RELEASE"]
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
    ops: np.ndarray      # uint8: ALLOC, FREE (and, in snapshot traces, the other op codes above)
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
    skipped_lines: int = 0     # bad lines or entries skipped (skip_bad_events); a JSON-lines file's once read
    first_skipped: str = ""    # the first of them, named

    def chunks(self) -> Iterator[Chunk]:
        return self._factory()
