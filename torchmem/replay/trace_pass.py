"""One pass over the trace entries of one device of a snapshot: the replay's events, and what the pass saw.

The pass reads each entry once, in order, and writes the replay's event
columns (see the docstring of snapshot_trace.py for what each becomes); it
also notes what the later steps infer from: the blocks and segments it met
before they were made, the maps and unmaps, the OOM entries, the runs of
releases. Frees take effect at ``free_completed`` (``free_requested`` when a
trace has no ``free_completed``); a ``free_requested`` whose
``free_completed`` comes later (``record_stream``) ends the allocation there,
as PyTorch counts it (_Builder.request_free). Such frees directly before an
OOM entry complete at the request's release (Note [Frees completed at a
release], sync_frees.py).

Note [A failed map's own release]
With expandable segments a request maps pages one at a time; where the
device refuses one, the request releases the cache (unmapping free pages)
and maps again, or fails. Its trace is its maps, then the releases, then
its alloc or OOM entry: nothing of the program's can come between a map and
the request it serves. A replay that follows the recording makes each
recorded release at its event, so it would unmap before the request maps,
and the trace's order differs. The releases after a request's first map
are its own: the pass lists their events (TracePass.request_releases), and
they become REQUEST_RELEASE events (snapshot_trace.py), which the
allocator makes itself when its map fails, or the replay after the request.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Mapping, NamedTuple

from torchmem import _core
from torchmem.replay.entries import int_field
from torchmem.replay.release_runs import ALLOCATOR, NO_SEGMENT, PROGRAM, ReleaseRun, python_stack, release_origin
from torchmem.replay.sync_frees import SyncFrees
from torchmem.formats.trace_types import (ALLOC, EMPTY_CACHE, FAILED_ALLOC, FREE, FREE_AT_SYNC, FREE_REQUESTED,
                                  NOTE_ACTIONS, POOL, RELEASE_SEGMENT, SEGMENT_ADDRESS, SNAPSHOT_ACTIONS,
                                  SURVIVED_FAILED_ALLOC, TraceError, unknown_action)

DEFAULT_POOL = (0, 0)


class BadEntries:
    """Raises a bad entry's TraceError, or under skip_bad_events counts it and keeps the first in words."""

    def __init__(self, name: str, device: int, skip: bool) -> None:
        self.name, self.device, self.skip = name, device, skip
        self.count = 0
        self.first = ""  # the first bad entry skipped, in words

    def where(self, i: int) -> str:
        return f"{self.name}: device {self.device} entry {i}"

    def __call__(self, i: int, what: str) -> None:
        if not self.skip:
            raise TraceError(f"{self.where(i)}: {what}")
        if not self.count:
            self.first = f"trace entry {i:,}: {what}"
        self.count += 1

    def caught(self, exc: TraceError) -> None:
        """An entry whose reading raised `exc`, under skip_bad_events."""
        if not self.count:
            self.first = str(exc).removeprefix(f"{self.name}: ")
        self.count += 1


class OomEntry(NamedTuple):
    """An oom entry of the trace."""

    index: int           # the position of its FAILED_ALLOC event
    entry: int           # its trace entry
    size: int            # the request refused
    stream: int
    device_free: int     # the bytes the card still had free
    reserved_delta: int  # reserved then, less what was reserved when recording began


@dataclass(frozen=True)
class PassEvents:
    """The replay's event columns the pass wrote, one row per event (trace_types.Chunk's columns)."""

    ops: tuple[int, ...]
    ids: tuple[int, ...]
    sizes: tuple[int, ...]
    streams: tuple[int, ...]
    addrs: tuple[int, ...]
    entries: tuple[int, ...]  # the trace entry each event comes from

    def __len__(self) -> int:
        return len(self.ops)


@dataclass(frozen=True)
class TracePass:
    """What one pass over a device's trace entries wrote and saw; the steps after it only read it."""

    name: str
    device: int
    events: PassEvents
    start_segments: Mapping[int, tuple[int, int]]       # addr -> (size, stream): freed before being made
    start_pools: Mapping[int, tuple[int, int]]          # addr -> the private pool of such a segment (its pool_id)
    segments: Mapping[int, tuple[int, int]]             # addr -> (size, entry): made in the trace, live at the end
    live: Mapping[int, int]                             # addr -> id: blocks live at the end
    seen: frozenset[int]                                # addresses with an alloc or free
    freed_at_start: Mapping[int, tuple[int, int, int]]  # addr -> (id, requested, entry): freed, never allocated
    maps: tuple[tuple[str, int, int, int], ...]         # (action, addr, size, stream) of every map and unmap
    map_pools: tuple[tuple[int, int], ...]              # the private pool of each (its pool_id; default: (0, 0))
    allocs: tuple[tuple[int, int], ...]                 # (addr, entry) of every alloc
    ooms: tuple[OomEntry, ...]
    # (reserved_delta before, size, the request that followed: maps; None for segment_alloc) of every
    # segment made: the memory fraction's lower bound (memory_limit.py)
    creations: tuple[tuple[int, int, int | None], ...]
    retry_releases: tuple[ReleaseRun, ...]              # runs a new segment followed; new_segment: its creation
    max_address: int                                    # the highest address the trace reaches
    reserved_peak: int                                  # the highest reserved_delta
    empty_cache_calls: int
    next_id: int                                        # the first id the pass did not give out
    pools: int                                          # pools met, the default one included
    pool_ids: Mapping[tuple[int, int], int]             # each pool met -> its index in the replay (kPool)
    pools_inferred: int                                 # allocations placed in a pool by their final segment
    request_releases: tuple[int, ...]                   # events of releases inside a request that mapped first


class _Columns:
    def __init__(self) -> None:
        self.ops: list[int] = []
        self.ids: list[int] = []
        self.sizes: list[int] = []
        self.streams: list[int] = []
        self.addrs: list[int] = []
        self.entries: list[int] = []  # the trace entry each event comes from
        self.entry = 0

    def insert(self, position: int, op: int) -> None:
        for column, value in ((self.ops, op), (self.ids, 0), (self.sizes, 0), (self.streams, 0), (self.addrs, 0),
                              (self.entries, self.entries[position] if position < len(self.entries) else self.entry)):
            column.insert(position, value)

    def add(self, op: int, id_: int = 0, size: int = 0, stream: int = 0, addr: int = 0) -> None:
        self.entries.append(self.entry)
        self.ops.append(op)
        self.ids.append(id_)
        self.sizes.append(size)
        self.streams.append(stream)
        self.addrs.append(addr)


class _Where:
    """'FILE: device D entry I', made when an error message needs it."""

    __slots__ = ("bad", "i")

    def __init__(self, bad: BadEntries, i: int) -> None:
        self.bad, self.i = bad, i

    def __str__(self) -> str:
        return self.bad.where(self.i)

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)


def _free_action(entries: list, segments: Any) -> str:
    """The action that frees a block in a trace with no free_completed entry.

    free_requested, where the release writes no free_completed; but a trace
    whose every requested free is still pending when the snapshot was taken
    (record_stream, the stream's work not done: each such block
    active_pending_free in the final segments, none allocated again) has
    none either, and its blocks are freed at their free_completed.
    """
    requested = set()
    for e in entries:
        if isinstance(e, dict) and e.get("action") == "free_requested":
            requested.add(e.get("addr"))
        elif isinstance(e, dict) and e.get("action") == "alloc" and e.get("addr") in requested:
            return "free_requested"
    pending = {b.get("address") for seg in (segments if isinstance(segments, list) else []) if isinstance(seg, dict)
               for b in (seg.get("blocks") if isinstance(seg.get("blocks"), list) else [])
               if isinstance(b, dict) and b.get("state") == "active_pending_free"}
    return "free_completed" if requested and requested <= pending else "free_requested"


def _replays_two_step_frees() -> bool:
    """Whether the loaded extension knows FREE_REQUESTED; one built before it frees at free_completed alone."""
    return getattr(_core, "replay_op_count", 0) > FREE_REQUESTED


def pool_id_field(value: Any) -> tuple[int, int] | None:
    """A recorded pool id ((0, 0) is the default pool), or None if it is not a pair of ints."""
    if isinstance(value, (tuple, list)) and len(value) == 2 and all(
            isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**64 for v in value):
        return int(value[0]), int(value[1])
    return None


class _FinalPools:
    """The private pool of an address, from the final segments' segment_pool_id (torch 2.11's only record)."""

    def __init__(self, segments: Any) -> None:
        spans = []
        for seg in segments if isinstance(segments, list) else []:
            if not isinstance(seg, dict):
                continue
            pool, addr, size = pool_id_field(seg.get("segment_pool_id")), seg.get("address"), seg.get("total_size")
            if pool and pool != DEFAULT_POOL and isinstance(addr, int) and isinstance(size, int):
                spans.append((addr, addr + size, pool))
        spans.sort()
        self.starts = [a for a, _, _ in spans]
        self.spans = spans

    def __bool__(self) -> bool:
        return bool(self.spans)

    def pool_of(self, addr: int) -> tuple[int, int]:
        at = bisect.bisect_right(self.starts, addr) - 1
        if at >= 0 and addr < self.spans[at][1]:
            return self.spans[at][2]
        return DEFAULT_POOL


class _Builder:
    """One pass over a device's trace entries; see the module docstring."""

    def __init__(self, bad_entry: BadEntries, final_segments: Any = None) -> None:
        self.bad_entry = bad_entry  # raises or counts a bad entry
        self.cols = _Columns()
        self.pools: dict[tuple[int, int], int] = {DEFAULT_POOL: 0}  # pool id -> the replay's pool index
        self.pool = 0                             # the pool index allocations go to now
        self.final_pools = _FinalPools(final_segments)
        self.pools_inferred = 0                   # allocations placed in a pool by their final segment
        self.next_id = 0
        self.live: dict[int, int] = {}            # addr -> id, blocks live now
        self.two_step_frees = _replays_two_step_frees()
        self.requested: set[int] = set()          # ids whose free was requested (FREE_REQUESTED), not completed
        self.sync_frees = SyncFrees()             # frees that may complete at the next request's release
        self.mapped_for_request = False           # a map since the last request (Note [A failed map's own release])
        self.request_releases: list[int] = []     # events of releases after such a map
        self.seen: set[int] = set()               # addresses with an alloc or free so far
        self.freed_at_start: dict[int, tuple[int, int, int]] = {}  # addr -> (id, requested, entry index)
        self.segments: dict[int, tuple[int, int]] = {}             # addr -> (size, entry index), made in the trace, live
        self.segments_gone: set[int] = set()      # addresses of segments freed so far
        self.start_segments: dict[int, tuple[int, int]] = {}       # addr -> (size, stream), freed before being made
        self.start_pools: dict[int, tuple[int, int]] = {}          # addr -> private pool id of such a segment
        self.reserved_delta = 0
        self.reserved_peak = 0  # the highest reserved_delta
        self.pending_release: list[int] = []      # op positions of a run of segment_free / segment_unmap
        self.pending_release_sizes: list[int] = []
        self.pending_release_streams: list[int] = []
        self.run_stream = 0                       # the stream of the segment that followed the run
        self.run_private = False                  # the run released a private pool's segment (a pool that died)
        self.run_unmapped = False                 # the run unmapped pages of an expandable range
        self.run_reserved = 0                     # reserved_delta when the run began
        self.run_new_creation = 0                 # the creation (self.creations) of the segment that followed the run
        self.run_position = 0                     # the event position of that segment
        self.run_stack: tuple | None = None       # the Python stack of the run's first release (None: not recorded)
        self.run_origin: str | None = None        # release_origin() of the run and the segment that followed it
        # each run that a new segment followed (the allocator's retry, or the program's empty_cache():
        # retries.py), but those the stacks give to the program and no OOM followed, replayed as its
        # empty_cache(); new_segment holds the segment's creation (self.creations) until the end
        self.retry_releases: list[ReleaseRun] = []
        self.segment_after_release = False        # a segment_alloc / segment_map followed the run
        self.ooms: list[OomEntry] = []
        self.unsurvived: list[int] = []  # positions of FAILED_ALLOC ops with no alloc after them yet
        self.empty_cache_calls = 0
        self.max_address = 0
        self.maps: list[tuple[str, int, int, int]] = []  # (action, addr, size, stream) of every map and unmap
        self.map_pools: list[tuple[int, int]] = []       # the pool_id of each, where recorded
        self.allocs: list[tuple[int, int]] = []  # (addr, entry index) of every alloc
        # [reserved_delta before, size, the request that followed (maps; None for segment_alloc)]
        # of every segment made: the memory fraction's lower bound (memory_limit.py)
        self.creations: list[list] = []
        self.maps_waiting: list[int] = []  # creations of maps whose request has not come yet

    def mark_survived(self) -> None:
        """The program asks for memory again: it caught the OOMs before and went on."""
        for position in self.unsurvived:
            self.cols.ops[position] = SURVIVED_FAILED_ALLOC
        self.unsurvived.clear()

    def enter_pool(self, entry: dict, addr: int | None) -> None:
        """Route the next allocation to its private pool (a POOL event when it changes)."""
        pool = pool_id_field(entry.get("pool_id")) if "pool_id" in entry else None
        if pool is None and addr is not None and self.final_pools:
            pool = self.final_pools.pool_of(addr)
            self.pools_inferred += pool != DEFAULT_POOL
        index = self.pools.setdefault(pool or DEFAULT_POOL, len(self.pools))
        if index != self.pool:
            self.pool = index
            key = pool or DEFAULT_POOL
            self.cols.add(POOL, index, key[0], 0, key[1])

    def pool_of_map(self, entry: dict, addr: int) -> tuple[int, int]:
        """The private pool of a map or unmap: its pool_id, else (torch 2.11) its final segment's."""
        if "pool_id" in entry:
            return pool_id_field(entry.get("pool_id")) or DEFAULT_POOL
        return self.final_pools.pool_of(addr) if self.final_pools else DEFAULT_POOL

    def request_free(self, entry: dict, where: "_Where") -> None:
        """A free_requested whose free_completed is to come: a FREE_REQUESTED event.

        PyTorch's free() ends the allocation at the request (allocation,
        allocated_bytes and oversize_allocations drop) and its free_block()
        at free_completed, when the streams that used the block (record_stream)
        are done with it (active, active_bytes and requested_bytes drop; the
        block is cached). Most requests complete at once: the free_completed
        that follows directly turns the event into a FREE. A block allocated
        before recording began is left to its free_completed (the start state).
        A second request of a block is the replay's bad event.
        """
        id_ = self.live.get(int_field(entry, "addr", where))
        if id_ is not None:
            self.requested.add(id_)
            self.cols.add(FREE_REQUESTED, id_, 0, int_field(entry, "stream", where) if "stream" in entry else 0)

    def inside_release(self, entry: dict, action: str, free_action: str) -> bool:
        """A free that completes in the middle of a run of releases, under the run's own stack: PyTorch's
        full release first completes the frees that wait on events (synchronize_and_free_events), so the
        run goes on past it. Only where stacks are recorded (without them it may be the program's)."""
        return action == free_action and self.under_run_stack(entry)

    def retry_without_segment(self, entry: dict) -> bool:
        """An allocation right after a run of releases under its own stack, with no new segment between.

        With expandable segments a request's retry may need no map: the frees
        its full release completed left a free block before unmapped space of
        its range, enough for the request (find_expandable_block). The run is
        the request's retry all the same (only where stacks are recorded).
        """
        return self.under_run_stack(entry)

    def under_run_stack(self, entry: dict) -> bool:
        """Whether a run of releases, not yet followed by a new segment, was made under this entry's stack."""
        return (bool(self.pending_release) and not self.segment_after_release and self.run_stack is not None
                and python_stack(entry) == self.run_stack)

    def new_id(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def settle_release(self, next_action: str | None) -> None:
        """A run of segment releases ends: the program's empty_cache(), or the allocator's own.

        Each release is in the trace (a replay that follows the recording
        makes exactly these). For replays under other settings the run counts
        as the program's empty_cache() unless the allocator made it itself: a
        retry before a new segment, or the release before an out-of-memory.
        Where the trace records stacks, a run whose stack is not the new
        segment's is the program's (release_origin).
        """
        by_program = not self.segment_after_release or self.run_origin == PROGRAM
        if self.pending_release and next_action != "oom" and by_program:
            self.cols.insert(self.pending_release[0], EMPTY_CACHE)
            self.empty_cache_calls += 1
        elif self.pending_release and self.segment_after_release:
            self.retry_releases.append(ReleaseRun(self.run_reserved, self.run_new_creation,
                                                  list(self.pending_release_sizes), list(self.pending_release_streams),
                                                  self.run_stream, self.run_private, self.run_origin,
                                                  self.run_position, self.run_unmapped))
        self.pending_release.clear()
        self.pending_release_sizes.clear()
        self.pending_release_streams.clear()
        self.run_private = False
        self.run_unmapped = False
        self.run_origin = None
        self.segment_after_release = False

    def entry(self, i: int, entry: Any, free_action: str) -> None:
        self.cols.entry = i
        if not isinstance(entry, dict) or "action" not in entry:
            return self.bad_entry(i, "not a trace entry (expected a dict with an 'action')")
        action = entry["action"]
        if not isinstance(action, str) or action not in SNAPSHOT_ACTIONS:
            try:
                return unknown_action(entry, self.bad_entry.where(i))  # one that changes no memory: left out
            except TraceError as exc:
                if not self.bad_entry.skip:
                    raise
                return self.bad_entry.caught(exc)
        if action in NOTE_ACTIONS:  # a snapshot taken, an annotation: no memory changes, and no run of releases ends
            return None
        if action in ("segment_free", "segment_unmap"):
            if self.segment_after_release:
                self.settle_release(action)
            if not self.pending_release:
                self.run_reserved = self.reserved_delta
                self.run_stack = python_stack(entry)
            self.pending_release.append(len(self.cols.ops))
            self.pending_release_sizes.append(entry.get("size") if isinstance(entry.get("size"), int) else 0)
            self.pending_release_streams.append(entry.get("stream") if isinstance(entry.get("stream"), int) else 0)
            self.run_private |= pool_id_field(entry.get("pool_id")) not in (None, DEFAULT_POOL)
            self.run_unmapped |= action == "segment_unmap"
        elif action in ("segment_alloc", "segment_map"):
            if self.pending_release and not self.segment_after_release:
                self.run_new_creation = len(self.creations)
                self.run_position = len(self.cols.ops)
                self.run_origin = release_origin(self.run_stack, python_stack(entry))
                self.run_stream = entry.get("stream") if isinstance(entry.get("stream"), int) else 0
            self.segment_after_release = bool(self.pending_release)
        elif not (action.startswith("free") and action != free_action) \
                and not self.inside_release(entry, action, free_action):
            if action == "alloc" and self.pending_release and self.retry_without_segment(entry):
                self.run_new_creation, self.run_position, self.run_origin = NO_SEGMENT, len(self.cols.ops), ALLOCATOR
                self.run_stream = entry.get("stream") if isinstance(entry.get("stream"), int) else 0
                self.segment_after_release = True
            self.settle_release(action)
        try:
            self.dispatch(i, entry, action, free_action)
        except TraceError as exc:
            if not self.bad_entry.skip:
                raise
            self.bad_entry.caught(exc)
            del exc

    def dispatch(self, i: int, entry: dict, action: str, free_action: str) -> None:
        where = _Where(self.bad_entry, i)  # written out only in an error: a million f-strings cost half a second
        if self.sync_frees.candidates and action not in (free_action, "oom"):  # read first: the hot path
            self.sync_frees.clear()
        if action.startswith("free") and action != free_action:
            if action == "free_requested" and self.two_step_frees:  # and free_action is free_completed
                self.request_free(entry, where)
            return
        size = int_field(entry, "size", where)
        stream = int_field(entry, "stream", where) if "stream" in entry else 0
        if action == "oom":
            return self.record_oom(i, entry, size, stream, where)
        addr = int_field(entry, "addr", where)
        self.max_address = max(self.max_address, addr + size)
        if action == "alloc":
            self.allocate(i, entry, size, stream, addr, where)
        elif action == free_action:
            self.record_free(i, entry, action, size, stream, addr, where)
        elif action == "segment_alloc":
            self.make_segment(i, size, stream, addr, where)
        elif action == "segment_free":
            self.free_segment(entry, size, stream, addr, where)
        elif action == "segment_map":
            self.map_pages(entry, size, stream, addr)
        elif action == "segment_unmap":
            self.unmap_pages(entry, size, stream, addr)

    def record_oom(self, i: int, entry: dict, size: int, stream: int, where: _Where) -> None:
        """An oom entry: a FAILED_ALLOC event, after the frees that completed at its release (FREE_AT_SYNC)."""
        if "device_free" not in entry:
            raise TraceError(f"{where}: oom entry without device_free (the free bytes on the GPU at the failure)")
        device_free = int_field(entry, "device_free", where)
        self.ooms.append(OomEntry(len(self.cols.ops), i, size, stream, device_free, self.reserved_delta))
        self.mapped_for_request = False
        for position in self.sync_frees.at_oom(python_stack(entry)):
            self.cols.ops[position] = FREE_AT_SYNC
        self.mark_survived()
        self.enter_pool(entry, None)
        self.unsurvived.append(len(self.cols.ops))
        self.cols.add(FAILED_ALLOC, 0, size, stream)

    def allocate(self, i: int, entry: dict, size: int, stream: int, addr: int, where: _Where) -> None:
        """An alloc entry: a new block live at `addr` (an ALLOC event), the request the maps before it served."""
        if size == 0:
            raise TraceError(f"{where}: alloc of 0 bytes")
        if addr in self.live:
            raise TraceError(f"{where}: alloc at 0x{addr:x}, which is already allocated (its free is missing)")
        id_ = self.new_id()
        self.live[addr] = id_
        self.seen.add(addr)
        self.allocs.append((addr, i))
        self.mapped_for_request = False
        for k in self.maps_waiting:
            self.creations[k][2] = size
        self.maps_waiting.clear()
        self.mark_survived()
        self.enter_pool(entry, addr)
        self.cols.add(ALLOC, id_, size, stream, addr)

    def record_free(self, i: int, entry: dict, action: str, size: int, stream: int, addr: int, where: _Where) -> None:
        """The entry that frees a block (free_action): a FREE event, or its request's FREE_REQUESTED completed."""
        id_ = self.live.pop(addr, None)
        if id_ is not None and self.cols.ops and self.cols.ops[-1] == FREE_REQUESTED and self.cols.ids[-1] == id_:
            self.cols.ops[-1], self.cols.entries[-1] = FREE, i  # its request, completed at once
            self.requested.discard(id_)
            if self.sync_frees.candidates:
                self.sync_frees.clear()
            return
        if id_ is not None and id_ in self.requested:
            self.requested.discard(id_)
            self.sync_frees.freed(len(self.cols.ops), python_stack(entry))
        elif self.sync_frees.candidates:
            self.sync_frees.clear()
        if id_ is None:
            if addr in self.seen:
                raise TraceError(f"{where}: {action} of 0x{addr:x}, which is not allocated (freed twice)")
            id_ = self.new_id()
            self.freed_at_start[addr] = (id_, size, i)
            self.seen.add(addr)
        self.cols.add(FREE, id_, 0, stream)

    def make_segment(self, i: int, size: int, stream: int, addr: int, where: _Where) -> None:
        """A segment_alloc entry: a segment made (a SEGMENT_ADDRESS event) and its creation."""
        if addr in self.segments:
            raise TraceError(f"{where}: segment_alloc at 0x{addr:x}, which is already a segment")
        self.segments[addr] = (size, i)
        self.segments_gone.discard(addr)
        self.creations.append([self.reserved_delta, size, None])
        self.reserved_delta += size
        self.reserved_peak = max(self.reserved_peak, self.reserved_delta)
        self.cols.add(SEGMENT_ADDRESS, 0, size, stream, addr)

    def free_segment(self, entry: dict, size: int, stream: int, addr: int, where: _Where) -> None:
        """A segment_free entry: a RELEASE_SEGMENT event; a segment never made in the trace is a start segment."""
        if addr in self.segments:
            made_size, _ = self.segments.pop(addr)
            if made_size != size:
                raise TraceError(f"{where}: segment_free of {size} bytes at 0x{addr:x}, made with {made_size}")
        elif addr in self.segments_gone:
            raise TraceError(f"{where}: segment_free of 0x{addr:x}, which was already freed")
        else:
            self.start_segments[addr] = (size, stream)
            pool = pool_id_field(entry.get("pool_id")) if "pool_id" in entry else None
            if pool is not None and pool != DEFAULT_POOL:
                self.start_pools[addr] = pool
        self.segments_gone.add(addr)
        self.reserved_delta -= size
        self.release(size, stream, addr)

    def map_pages(self, entry: dict, size: int, stream: int, addr: int) -> None:
        """A segment_map entry: pages mapped (a SEGMENT_ADDRESS event), a creation waiting for its request."""
        self.maps.append(("segment_map", addr, size, stream))
        self.map_pools.append(self.pool_of_map(entry, addr))
        self.mapped_for_request = True
        self.maps_waiting.append(len(self.creations))
        self.creations.append([self.reserved_delta, size, 0])
        self.reserved_delta += size
        self.reserved_peak = max(self.reserved_peak, self.reserved_delta)
        self.cols.add(SEGMENT_ADDRESS, 0, 0, stream, addr)

    def unmap_pages(self, entry: dict, size: int, stream: int, addr: int) -> None:
        """A segment_unmap entry: pages unmapped (a RELEASE_SEGMENT event)."""
        self.maps.append(("segment_unmap", addr, size, stream))
        self.map_pools.append(self.pool_of_map(entry, addr))
        self.reserved_delta -= size
        self.release(size, stream, addr)

    def release(self, size: int, stream: int, addr: int) -> None:
        """A RELEASE_SEGMENT event; listed as the request's own after a map it made."""
        if self.mapped_for_request:
            self.request_releases.append(len(self.cols.ops))
        self.cols.add(RELEASE_SEGMENT, 0, size, stream, addr)

    def result(self) -> TracePass:
        """The pass, done: what it wrote and saw, frozen."""
        c = self.cols
        events = PassEvents(tuple(c.ops), tuple(c.ids), tuple(c.sizes), tuple(c.streams), tuple(c.addrs),
                            tuple(c.entries))
        return TracePass(
            name=self.bad_entry.name, device=self.bad_entry.device, events=events,
            start_segments=MappingProxyType(self.start_segments), start_pools=MappingProxyType(self.start_pools),
            segments=MappingProxyType(self.segments),
            live=MappingProxyType(self.live), seen=frozenset(self.seen),
            freed_at_start=MappingProxyType(self.freed_at_start), maps=tuple(self.maps), map_pools=tuple(self.map_pools),
            allocs=tuple(self.allocs),
            ooms=tuple(self.ooms), creations=tuple((a, b, c) for a, b, c in self.creations),
            retry_releases=tuple(self.retry_releases), max_address=self.max_address,
            reserved_peak=self.reserved_peak, empty_cache_calls=self.empty_cache_calls, next_id=self.next_id,
            pools=len(self.pools), pool_ids=MappingProxyType(dict(self.pools)), pools_inferred=self.pools_inferred,
            request_releases=tuple(self.request_releases))


def run_pass(entries: list, bad_entry: BadEntries, final_segments: Any = None) -> TracePass:
    """One pass over a device's trace entries; a bad entry goes to `bad_entry` (raised, or counted).
    `final_segments`: the snapshot's, which tell the action that frees a block and, on torch 2.11, the pools."""
    actions = {e.get("action") for e in entries if isinstance(e, dict) and isinstance(e.get("action"), str)}
    free_action = "free_completed" if "free_completed" in actions else _free_action(entries, final_segments)
    b = _Builder(bad_entry, final_segments)
    for i, entry in enumerate(entries):
        b.entry(i, entry, free_action)
    b.settle_release(None)
    return b.result()
