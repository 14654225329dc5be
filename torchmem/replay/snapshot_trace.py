"""The trace of one device of a PyTorch memory snapshot, ready to replay exactly.

A snapshot written on a GPU by ``torch.cuda.memory._dump_snapshot()`` holds
the allocator's final ``segments`` and, per device, the ``device_traces``
recorded since ``_record_memory_history()``. Recording usually begins
mid-run, so this module rebuilds what the trace needs to replay what
happened on the GPU:

- the start state (the segments that existed when recording began and the
  blocks live in them: start_state.py), from the trace's frees of blocks it
  never allocated, its frees of segments it never created, and the final
  segments;
- the recorded segment addresses, offered to the simulated device so that
  every allocation lands where it did on the GPU;
- the program's ``empty_cache()`` calls (runs of ``segment_free`` that are
  not the allocator's own release before an out-of-memory);
- the request an ``oom`` entry refused, and from the entry the memory the
  process could have held (reserved at that moment plus ``device_free``);
- the allocator settings of ``allocator_settings``, in the config grammar;
- the private pool of each allocation (CUDA graphs, ``torch.cuda.MemPool``):
  the entry's ``pool_id`` where the release records one (torch 2.13 and
  later), else the ``segment_pool_id`` of the final segment that holds its
  address (torch 2.11); an allocation in a segment freed before the end has
  no recorded pool there and is replayed in the default pool.

Frees take effect at ``free_completed`` (``free_requested`` when a trace has
no ``free_completed``), as blocks become reusable only then; a
``free_requested`` whose ``free_completed`` comes later (``record_stream``)
ends the allocation there, as PyTorch counts it (_Builder.request_free).
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np

from torchmem import _C
from torchmem.replay.capacity import DEFAULT_CAPACITY, expandable_capacity, segment_request
from torchmem.replay.memory_limit import bounds, conf_fraction, format_fraction, infer_fraction
from torchmem.replay.entries import int_field
from torchmem.replay.expandable_ranges import failure_offers, recorded_ranges
from torchmem.replay.release_runs import PROGRAM, ReleaseRun, python_stack, release_origin
from torchmem.replay.start_state import fix_block_sizes, rebuild_start_state
from torchmem.trace_types import (ALLOC, CHUNK, EMPTY_CACHE, FAILED_ALLOC, FREE, FREE_REQUESTED, POOL, RELEASE_SEGMENT,
                                  SEGMENT_ADDRESS, SNAPSHOT_ACTIONS, SURVIVED_FAILED_ALLOC, Chunk, Trace, TraceError)

DEFAULT_POOL = (0, 0)


@dataclass
class RecordedRun:
    """What a snapshot says about the run on its GPU, beside the events."""

    device: int
    devices: list[tuple[int, int]]           # (device index, trace entries) of every device with entries
    conf: str | None                         # allocator settings in the config grammar; None if not recorded
    capacity: int | None                     # the card's memory, when the recording tells it (capacity_from)
    oom: dict | None                         # the first oom entry: index (event), entry, size, stream, device_free, reserved
    ooms: list[dict] = field(default_factory=list)  # every oom entry, the same fields
    empty_cache_calls: int = 0
    entries: int = 0
    max_address: int = 0
    event_entries: Any = None                # numpy: the trace entry each replay event comes from
    capacity_from: str | None = None         # "oom" (reserved + device_free at the OOM) or "expandable" (capacity.py)
    fraction_from: str = "none"              # the conf's per_process_memory_fraction: "config", "inferred" or "none"
    limit_low: int | None = None             # an inferred fraction's lowest possible limit (memory_limit.py)
    peak_reserved: int = 0                   # the most the recording held (start state plus segments and maps)
    device_choice: str = ""                  # "device 0 (the one with the OOM)": torchmem.snapshot_devices' rule
    retry_releases: list = field(default_factory=list)  # runs of releases a new segment followed (retries.py)
    start_reserved: int = 0                  # reserved when recording began

    def entry_of(self, event: int | None) -> int | None:
        """The trace entry of replay event `event`."""
        if event is None or self.event_entries is None or not 0 <= event < len(self.event_entries):
            return None
        return int(self.event_entries[event])


# Settings that change the allocator's decisions but have no field of their own in
# ``allocator_settings``: read from its PYTORCH_CUDA_ALLOC_CONF string.
# reuse_order and min_block_size: torchmem's CPU settings (docs/cpu.md), recorded by a CPU install.
CONF_ONLY_KEYS = ("max_non_split_rounding_mb", "large_segment_size_mb", "per_process_memory_fraction",
                  "reuse_order", "min_block_size")


def recorded_conf(settings: Any) -> str | None:
    """The snapshot's ``allocator_settings`` in the config grammar ("" = defaults), None if absent.

    The fields (``expandable_segments``, ``max_split_size``, ...) give the
    settings in force when the snapshot was taken; the keys of
    CONF_ONLY_KEYS come from the recorded PYTORCH_CUDA_ALLOC_CONF string,
    each kept only when torchmem's parser accepts it.
    """
    if not isinstance(settings, dict):
        return None
    items = []
    if settings.get("expandable_segments"):
        items.append("expandable_segments:True")
    split = settings.get("max_split_size", -1)
    if isinstance(split, int) and 0 < split < 2**62:
        items.append(f"max_split_size_mb:{split // 2**20}")
    threshold = settings.get("garbage_collection_threshold", 0.0)
    if isinstance(threshold, (int, float)) and threshold > 0:
        items.append(f"garbage_collection_threshold:{threshold:g}")
    divisions = settings.get("roundup_power2_divisions")
    if isinstance(divisions, dict) and any(divisions.values()):
        pairs = sorted((int(k), int(v)) for k, v in divisions.items())
        values = {v for _, v in pairs}
        items.append(f"roundup_power2_divisions:{values.pop()}" if len(values) == 1
                     else "roundup_power2_divisions:[" + ",".join(f"{k}:{v}" for k, v in pairs) + "]")
    from torchmem.pytorch_env import recorded_conf_string

    items += _conf_only_items(recorded_conf_string(settings))
    # torch 2.13 and later (their settings carry max_cached_size) break ties between equal free
    # blocks by the age of their segment, then by address (BlockComparatorSizeCounterAddress in
    # libc10_cuda.so); 2.11 and earlier by address. torchmem's reuse_order:segment is that rule.
    if ("max_cached_size" in settings or "max_round_threshold" in settings) and \
            not any(item.startswith("reuse_order") for item in items):
        items.append("reuse_order:segment")
    return ",".join(items)


def _creation_needs(b: "_Builder", lss: int) -> list[int]:
    """What each segment made asked of the device: its size, or for a map its request's alloc_size (at least)."""
    return [size if request is None else max(size, segment_request(request, lss)) for _, size, request in b.creations]


def _with_fraction(conf: str | None, capacity: int | None, creations: list[tuple[int, int]],
                   ooms: list[dict]) -> tuple[str | None, str, int | None]:
    """The recorded config with the memory fraction the trace shows (memory_limit.py), where it comes from,
    and for an inferred one the lowest limit the trace allows. `creations`: (reserved before, need) of
    every segment made, reserved bytes absolute."""
    limits = bounds(creations, [(o["reserved"], o["size"], o["device_free"]) for o in ooms],
                    large_segment_size(conf or ""))
    fraction, source = infer_fraction(capacity if ooms else None, limits, conf_fraction(conf or ""))
    if conf is None and fraction is None:
        return None, source, None  # no settings recorded, and nothing to add
    items = [item for item in (conf or "").split(",")
             if item and item.partition(":")[0].strip() != "per_process_memory_fraction"]
    if fraction is not None:
        items.append(f"per_process_memory_fraction:{format_fraction(fraction)}")
    return ",".join(items), source, limits.lo if source == "inferred" else None


def large_segment_size(conf: str) -> int:
    """The large pool's segment size under a config (large_segment_size_mb, else 20 MiB), as the core reads it."""
    return _C.rules.config_fields(conf or "")["large_segment_size"]


def _conf_only_items(conf: Any) -> list[str]:
    if not isinstance(conf, str):
        return []
    out = []
    for item in conf.split(","):
        key, _, value = item.partition(":")
        key, value = key.strip(), value.strip()
        if key in CONF_ONLY_KEYS and not any(o.startswith(key + ":") for o in out):
            try:
                _C.parse_config(f"{key}:{value}")
            except ValueError:
                continue
            out.append(f"{key}:{value}")
    return out


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

    def chunks(self) -> Iterator[Chunk]:
        ops = np.asarray(self.ops, dtype=np.uint8)
        ids = np.asarray(self.ids, dtype=np.uint64)
        sizes = np.asarray(self.sizes, dtype=np.uint64)
        streams = np.asarray(self.streams, dtype=np.uint64)
        addrs = np.asarray(self.addrs, dtype=np.uint64)
        for lo in range(0, len(ops), CHUNK):
            hi = lo + CHUNK
            yield Chunk(ops[lo:hi], ids[lo:hi], sizes[lo:hi], streams[lo:hi], addrs[lo:hi])

class _Where:
    """'FILE: device D entry I', made when an error message needs it."""

    __slots__ = ("builder", "i")

    def __init__(self, builder: "_Builder", i: int) -> None:
        self.builder, self.i = builder, i

    def __str__(self) -> str:
        return self.builder.where(self.i)

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
    return getattr(_C, "replay_op_count", 0) > FREE_REQUESTED


def _pool_id(value: Any) -> tuple[int, int] | None:
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
            pool, addr, size = _pool_id(seg.get("segment_pool_id")), seg.get("address"), seg.get("total_size")
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

    def __init__(self, name: str, device: int, skip_bad_events: bool, final_segments: Any = None) -> None:
        self.name, self.device, self.skip = name, device, skip_bad_events
        self.cols = _Columns()
        self.pools: dict[tuple[int, int], int] = {DEFAULT_POOL: 0}  # pool id -> the replay's pool index
        self.pool = 0                             # the pool index allocations go to now
        self.final_pools = _FinalPools(final_segments)
        self.pools_inferred = 0                   # allocations placed in a pool by their final segment
        self.next_id = 0
        self.live: dict[int, int] = {}            # addr -> id, blocks live now
        self.two_step_frees = _replays_two_step_frees()
        self.seen: set[int] = set()               # addresses with an alloc or free so far
        self.freed_at_start: dict[int, tuple[int, int, int]] = {}  # addr -> (id, requested, entry index)
        self.segments: dict[int, tuple[int, int]] = {}             # addr -> (size, entry index), made in the trace, live
        self.segments_gone: set[int] = set()      # addresses of segments freed so far
        self.start_segments: dict[int, tuple[int, int]] = {}       # addr -> (size, stream), freed before being made
        self.reserved_delta = 0
        self.reserved_peak = 0  # the highest reserved_delta
        self.pending_release: list[int] = []      # op positions of a run of segment_free / segment_unmap
        self.pending_release_sizes: list[int] = []
        self.pending_release_streams: list[int] = []
        self.run_stream = 0                       # the stream of the segment that followed the run
        self.run_private = False                  # the run released a private pool's segment (a pool that died)
        self.run_reserved = 0                     # reserved_delta when the run began
        self.run_new_creation = 0                 # the creation (self.creations) of the segment that followed the run
        self.run_stack: tuple | None = None       # the Python stack of the run's first release (None: not recorded)
        self.run_origin: str | None = None        # release_origin() of the run and the segment that followed it
        # each run that a new segment followed (the allocator's retry, or the program's empty_cache():
        # retries.py), but those the stacks give to the program and no OOM followed, replayed as its
        # empty_cache(); new_segment holds the segment's creation (self.creations) until the end
        self.retry_releases: list[ReleaseRun] = []
        self.segment_after_release = False        # a segment_alloc / segment_map followed the run
        self.oom: dict | None = None  # the first oom entry
        self.ooms: list[dict] = []    # every oom entry
        self.unsurvived: list[int] = []  # positions of FAILED_ALLOC ops with no alloc after them yet
        self.empty_cache_calls = 0
        self.bad = 0
        self.first_bad = ""                        # the first bad entry skipped, in words
        self.max_address = 0
        self.maps: list[tuple[str, int, int, int]] = []  # (action, addr, size, stream) of every map and unmap
        self.allocs: list[tuple[int, int]] = []  # (addr, entry index) of every alloc
        # [reserved_delta before, size, the request that followed (maps; None for segment_alloc)]
        # of every segment made: the memory fraction's lower bound (memory_limit.py)
        self.creations: list[list] = []
        self.maps_waiting: list[int] = []  # creations of maps whose request has not come yet

    def where(self, i: int) -> str:
        return f"{self.name}: device {self.device} entry {i}"

    def bad_entry(self, i: int, what: str) -> None:
        if not self.skip:
            raise TraceError(f"{self.where(i)}: {what}")
        if not self.bad:
            self.first_bad = f"trace entry {i:,}: {what}"
        self.bad += 1

    def mark_survived(self) -> None:
        """The program asks for memory again: it caught the OOMs before and went on."""
        for position in self.unsurvived:
            self.cols.ops[position] = SURVIVED_FAILED_ALLOC
        self.unsurvived.clear()

    def enter_pool(self, entry: dict, addr: int | None) -> None:
        """Route the next allocation to its private pool (a POOL event when it changes)."""
        pool = _pool_id(entry.get("pool_id")) if "pool_id" in entry else None
        if pool is None and addr is not None and self.final_pools:
            pool = self.final_pools.pool_of(addr)
            self.pools_inferred += pool != DEFAULT_POOL
        index = self.pools.setdefault(pool or DEFAULT_POOL, len(self.pools))
        if index != self.pool:
            self.pool = index
            key = pool or DEFAULT_POOL
            self.cols.add(POOL, index, key[0], 0, key[1])

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
            self.cols.add(FREE_REQUESTED, id_, 0, int_field(entry, "stream", where) if "stream" in entry else 0)

    def inside_release(self, entry: dict, action: str, free_action: str) -> bool:
        """A free that completes in the middle of a run of releases, under the run's own stack: PyTorch's
        full release first completes the frees that wait on events (synchronize_and_free_events), so the
        run goes on past it. Only where stacks are recorded (without them it may be the program's)."""
        return (action == free_action and bool(self.pending_release) and not self.segment_after_release
                and self.run_stack is not None and python_stack(entry) == self.run_stack)

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
                                                  self.run_stream, self.run_private, self.run_origin))
        self.pending_release.clear()
        self.pending_release_sizes.clear()
        self.pending_release_streams.clear()
        self.run_private = False
        self.run_origin = None
        self.segment_after_release = False

    def entry(self, i: int, entry: Any, free_action: str) -> None:
        self.cols.entry = i
        if not isinstance(entry, dict) or "action" not in entry:
            return self.bad_entry(i, "not a trace entry (expected a dict with an 'action')")
        action = entry["action"]
        if not isinstance(action, str) or action not in SNAPSHOT_ACTIONS:
            from torchmem.input_files import short_repr

            return self.bad_entry(i, f"unknown action {short_repr(action)} (expected one of "
                                     f"{', '.join(sorted(SNAPSHOT_ACTIONS))})")
        if action in ("segment_free", "segment_unmap"):
            if self.segment_after_release:
                self.settle_release(action)
            if not self.pending_release:
                self.run_reserved = self.reserved_delta
                self.run_stack = python_stack(entry)
            self.pending_release.append(len(self.cols.ops))
            self.pending_release_sizes.append(entry.get("size") if isinstance(entry.get("size"), int) else 0)
            self.pending_release_streams.append(entry.get("stream") if isinstance(entry.get("stream"), int) else 0)
            self.run_private |= _pool_id(entry.get("pool_id")) not in (None, DEFAULT_POOL)
        elif action in ("segment_alloc", "segment_map"):
            if self.pending_release and not self.segment_after_release:
                self.run_new_creation = len(self.creations)
                self.run_origin = release_origin(self.run_stack, python_stack(entry))
                self.run_stream = entry.get("stream") if isinstance(entry.get("stream"), int) else 0
            self.segment_after_release = bool(self.pending_release)
        elif action != "snapshot" and not (action.startswith("free") and action != free_action) \
                and not self.inside_release(entry, action, free_action):
            self.settle_release(action)
        try:
            self.dispatch(i, entry, action, free_action)
        except TraceError as exc:
            if not self.skip:
                raise
            if not self.bad:
                self.first_bad = str(exc).removeprefix(f"{self.name}: ")
            self.bad += 1
            del exc

    def dispatch(self, i: int, entry: dict, action: str, free_action: str) -> None:
        where = _Where(self, i)  # written out only in an error: a million f-strings cost half a second
        if action == "snapshot" or (action.startswith("free") and action != free_action):
            if action == "free_requested" and self.two_step_frees:  # and free_action is free_completed
                self.request_free(entry, where)
            return
        size = int_field(entry, "size", where)
        stream = int_field(entry, "stream", where) if "stream" in entry else 0
        if action == "oom":
            if "device_free" not in entry:
                raise TraceError(f"{where}: oom entry without device_free (the free bytes on the GPU at the failure)")
            device_free = int_field(entry, "device_free", where)
            self.ooms.append({"index": len(self.cols.ops), "entry": i, "size": size, "stream": stream,
                              "device_free": device_free, "reserved_delta": self.reserved_delta})
            self.oom = self.oom or self.ooms[-1]
            self.mark_survived()
            self.enter_pool(entry, None)
            self.unsurvived.append(len(self.cols.ops))
            self.cols.add(FAILED_ALLOC, 0, size, stream)
            return
        addr = int_field(entry, "addr", where)
        self.max_address = max(self.max_address, addr + size)
        if action == "alloc":
            if size == 0:
                raise TraceError(f"{where}: alloc of 0 bytes")
            if addr in self.live:
                raise TraceError(f"{where}: alloc at 0x{addr:x}, which is already allocated (its free is missing)")
            id_ = self.new_id()
            self.live[addr] = id_
            self.seen.add(addr)
            self.allocs.append((addr, i))
            for k in self.maps_waiting:
                self.creations[k][2] = size
            self.maps_waiting.clear()
            self.mark_survived()
            self.enter_pool(entry, addr)
            self.cols.add(ALLOC, id_, size, stream, addr)
        elif action == free_action:
            id_ = self.live.pop(addr, None)
            if id_ is not None and self.cols.ops and self.cols.ops[-1] == FREE_REQUESTED and self.cols.ids[-1] == id_:
                self.cols.ops[-1], self.cols.entries[-1] = FREE, i  # its request, completed at once
                return
            if id_ is None:
                if addr in self.seen:
                    raise TraceError(f"{where}: {action} of 0x{addr:x}, which is not allocated (freed twice)")
                id_ = self.new_id()
                self.freed_at_start[addr] = (id_, size, i)
                self.seen.add(addr)
            self.cols.add(FREE, id_, 0, stream)
        elif action == "segment_alloc":
            if addr in self.segments:
                raise TraceError(f"{where}: segment_alloc at 0x{addr:x}, which is already a segment")
            self.segments[addr] = (size, i)
            self.segments_gone.discard(addr)
            self.creations.append([self.reserved_delta, size, None])
            self.reserved_delta += size
            self.reserved_peak = max(self.reserved_peak, self.reserved_delta)
            self.cols.add(SEGMENT_ADDRESS, 0, size, stream, addr)
        elif action == "segment_free":
            if addr in self.segments:
                made_size, _ = self.segments.pop(addr)
                if made_size != size:
                    raise TraceError(f"{where}: segment_free of {size} bytes at 0x{addr:x}, made with {made_size}")
            elif addr in self.segments_gone:
                raise TraceError(f"{where}: segment_free of 0x{addr:x}, which was already freed")
            else:
                self.start_segments[addr] = (size, stream)
            self.segments_gone.add(addr)
            self.reserved_delta -= size
            self.cols.add(RELEASE_SEGMENT, 0, size, stream, addr)
        elif action == "segment_map":
            self.maps.append((action, addr, size, stream))
            self.maps_waiting.append(len(self.creations))
            self.creations.append([self.reserved_delta, size, 0])
            self.reserved_delta += size
            self.reserved_peak = max(self.reserved_peak, self.reserved_delta)
            self.cols.add(SEGMENT_ADDRESS, 0, 0, stream, addr)
        elif action == "segment_unmap":
            self.maps.append((action, addr, size, stream))
            self.reserved_delta -= size
            self.cols.add(RELEASE_SEGMENT, 0, size, stream, addr)


def snapshot_trace(snapshot: dict, name: str, device: int | None = None, skip_bad_events: bool = False) -> Trace:
    """The replayable trace of one device of a snapshot (see the module docstring).

    Raises TraceError naming the entry for an unknown action, a malformed
    entry, an oom entry without device_free, or a trace that contradicts its
    final segments; with skip_bad_events those entries are skipped and counted
    in the trace's notes instead.
    """
    traces = snapshot.get("device_traces")
    if not isinstance(traces, list):
        raise TraceError(f"{name}: no device_traces: record with torch.cuda.memory._record_memory_history() before dumping")
    from torchmem.snapshot_devices import DeviceChoice, choose_device as device_rule, snapshot_devices

    choice = device_rule(snapshot) if device is None else DeviceChoice(device, "given", len(snapshot_devices(snapshot)))
    device = choice.device
    if isinstance(device, bool) or not isinstance(device, int) or device not in (snapshot_devices(snapshot) or [0]):
        raise TraceError(f"{name}: no device {device!r} (the snapshot has {len(traces)})")
    entries = traces[device] if device < len(traces) else []
    if not isinstance(entries, list):
        raise TraceError(f"{name}: device_traces[{device}] is not a list of trace entries")
    actions = {e.get("action") for e in entries if isinstance(e, dict) and isinstance(e.get("action"), str)}
    free_action = "free_completed" if "free_completed" in actions else _free_action(entries, snapshot.get("segments"))

    b = _Builder(name, device, skip_bad_events, snapshot.get("segments"))
    for i, entry in enumerate(entries):
        b.entry(i, entry, free_action)
    b.settle_release(None)
    start = rebuild_start_state(snapshot, b)
    conf = recorded_conf(snapshot.get("allocator_settings"))
    fix_block_sizes(start, conf or "", name, b)
    capacity = capacity_from = None
    oom = None
    ooms = [dict(o, reserved=start.reserved + o["reserved_delta"]) for o in b.ooms]
    for o in ooms:
        del o["reserved_delta"]
    expandable = _C.rules.config_fields(conf or "")["expandable_segments"]
    if ooms:
        oom = ooms[0]
        capacity, capacity_from = oom["reserved"] + oom["device_free"], "oom"
    elif expandable:
        ranges = recorded_ranges(b, start, large_segment_size(conf))
        capacity = expandable_capacity(ranges, DEFAULT_CAPACITY)
        if capacity is not None and capacity >= start.reserved + b.reserved_peak:
            capacity_from = "expandable"
        else:
            capacity = None
    needs = _creation_needs(b, large_segment_size(conf or ""))
    creations = [(start.reserved + c[0], need) for c, need in zip(b.creations, needs)]
    conf, fraction_from, limit_low = _with_fraction(conf, capacity, creations, ooms)
    retry_releases = [run._replace(new_segment=needs[run.new_segment] if run.new_segment < len(needs) else 0)
                      for run in b.retry_releases]
    windows = (failure_offers(b, start, capacity, large_segment_size(conf or ""), ooms)
               if expandable else [])  # Note [Expandable ranges in a snapshot]
    devices = [(d, len(t)) for d, t in enumerate(traces) if isinstance(t, list) and t]
    recorded = RecordedRun(device=device, devices=devices, conf=conf, capacity=capacity, oom=oom, ooms=ooms,
                           capacity_from=capacity_from, fraction_from=fraction_from, limit_low=limit_low,
                           peak_reserved=start.reserved + b.reserved_peak,
                           empty_cache_calls=b.empty_cache_calls, entries=len(entries), max_address=b.max_address,
                           retry_releases=retry_releases, start_reserved=start.reserved,
                           event_entries=np.asarray(b.cols.entries, dtype=np.int64), device_choice=choice.describe())
    notes = []
    if fraction_from == "inferred":
        notes.append(f"a memory fraction of {conf_fraction(conf):.4g} (the highest that makes the recording's refusals; "
                     "a snapshot does not record one set by torch.cuda.set_per_process_memory_fraction)")
    if b.pools_inferred:
        pools = len(b.pools) - 1
        notes.append(f"{pools} private pool{'s' if pools != 1 else ''} (CUDA graphs or torch.cuda.MemPool): this release records "
                     "no pool_id in its trace, so each allocation's pool comes from the final segment that holds it; "
                     "allocations in segments freed before the end are replayed in the default pool")
    if b.bad:
        notes.append(f"skipped {b.bad} bad trace entries" + (f" (first: {b.first_bad})" if b.first_bad else ""))
    notes += start.notes
    cols = b.cols

    def factory() -> Iterator[Chunk]:
        return cols.chunks()

    return Trace(name, factory, total=len(cols.ops), notes=notes, start=start, recorded=recorded,
                 range_windows=windows, skipped_lines=b.bad, first_skipped=b.first_bad)
