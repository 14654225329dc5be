"""The trace types: what every reader of allocation traces hands on, and the errors they raise.

Near the bottom of the package: it imports only the extension, so the
readers (torchmem/formats/traces.py, torchmem/formats/input_files.py, torchmem/replay/) and
what they feed (the replayer, snapshots, the command line) all name these
types without importing one another.

An event is (op, id, size, stream). The op codes are the core's (ReplayOp in
csrc/core/replay/replayer.h, read from torchmem._core.rules): JSON-lines traces
hold only ALLOC and FREE; snapshot traces use the others too
(torchmem/replay/snapshot_trace.py). Events come in numpy chunks so that a
trace of tens of millions of events never sits in memory as Python objects.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np

from torchmem import _core

_OPS: dict[str, int] = _core.rules.REPLAY_OPS
ALLOC, FREE = _OPS["ALLOC"], _OPS["FREE"]
EMPTY_CACHE, SEGMENT_ADDRESS, FAILED_ALLOC = _OPS["EMPTY_CACHE"], _OPS["SEGMENT_ADDRESS"], _OPS["FAILED_ALLOC"]
RELEASE_SEGMENT, SURVIVED_FAILED_ALLOC = _OPS["RELEASE_SEGMENT"], _OPS["SURVIVED_FAILED_ALLOC"]
POOL, FREE_REQUESTED, RANGE_OFFER = _OPS["POOL"], _OPS["FREE_REQUESTED"], _OPS["RANGE_OFFER"]
RECORDED_RETRY, FREE_AT_SYNC = _OPS["RECORDED_RETRY"], _OPS["FREE_AT_SYNC"]
REQUEST_RELEASE = _OPS["REQUEST_RELEASE"]
CHUNK = 1 << 16

# Actions of PyTorch's device_traces (c10/core/CachingDeviceAllocator.h, torch 2.14.1): those that change
# memory, and those that only note something (a snapshot taken; an annotation of a live block), which every
# reader carries through and replay leaves out.
MEMORY_ACTIONS = frozenset({
    "alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
    "segment_map", "segment_unmap", "oom",
})
NOTE_ACTIONS = frozenset({"snapshot", "annotate"})
SNAPSHOT_ACTIONS = MEMORY_ACTIONS | NOTE_ACTIONS
_warned_actions: set[tuple[str, str]] = set()  # (file and device, action) already warned of


def unknown_action(entry: dict, where: str) -> None:
    """An action no release torchmem knows writes: a one-line warning on stderr (once per action, file
    and device) where the entry changes no memory, else a TraceError naming the entry.

    The rule: an entry changes no memory when it has no 'size' or a size of 0, so
    a replay has nothing to place or release; any other size, or an action that is
    not a string, may change memory and is refused.
    """
    import sys

    action, size = entry.get("action"), entry.get("size", 0)
    if not isinstance(action, str) or size != 0 or isinstance(size, bool):
        what = f"with a size of {short_repr(size)}" if isinstance(action, str) else "that is not a name"
        raise TraceError(f"{where}: unknown action {short_repr(action)} {what}: it may change memory, so it "
                         f"cannot be left out (known: {', '.join(sorted(SNAPSHOT_ACTIONS))})")
    key = (where.rpartition(" entry ")[0], action)
    if key not in _warned_actions:
        _warned_actions.add(key)
        print(f"warning: {where}: unknown action {short_repr(action)} carried through: it has no size, "
              f"so it changes no memory", file=sys.stderr)


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
    annotations: list = field(default_factory=list)  # torchmem.formats.annotations.Annotation: a snapshot's annotate entries

    def chunks(self) -> Iterator[Chunk]:
        return self._factory()


def short_repr(value: Any, limit: int = 40) -> str:
    """repr() for error messages: bounded in length and depth, so safe on containers nested any deep."""
    import reprlib

    r = reprlib.Repr()
    r.maxlevel, r.maxstring, r.maxother, r.maxlong = 2, limit, limit, limit
    text = r.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
