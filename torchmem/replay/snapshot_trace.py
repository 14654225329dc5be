"""The trace of one device of a PyTorch memory snapshot, ready to replay exactly.

A snapshot written on a GPU by ``torch.cuda.memory._dump_snapshot()`` holds
the allocator's final ``segments`` and, per device, the ``device_traces``
recorded since ``_record_memory_history()``. Recording usually begins
mid-run, so this module rebuilds what the trace needs to replay what
happened on the GPU:

- the start state (the segments that existed when recording began and the
  blocks live in them), from the trace's frees of blocks it never
  allocated, its frees of segments it never created, and the final segments;
- the recorded segment addresses, offered to the simulated device so that
  every allocation lands where it did on the GPU;
- the program's ``empty_cache()`` calls (runs of ``segment_free`` that are
  not the allocator's own release before an out-of-memory);
- the request an ``oom`` entry refused, and from the entry the memory the
  process could have held (reserved at that moment plus ``device_free``);
- the allocator settings of ``allocator_settings``, in the config grammar.

Frees take effect at ``free_completed`` (``free_requested`` when a trace has
no ``free_completed``), as blocks become reusable only then.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np

from torchmem.traces import ALLOC, CHUNK, FREE, SNAPSHOT_ACTIONS, Chunk, Trace, TraceError

EMPTY_CACHE, SEGMENT_ADDRESS, FAILED_ALLOC, RELEASE_SEGMENT = 2, 3, 4, 5

SMALL_SEGMENT = 2 << 20  # the native allocator's small-pool segments; large ones are never this size
LIVE_STATES = ("active_allocated", "active_pending_free")


@dataclass
class StartSegment:
    """A segment that existed when recording began, with its live blocks."""

    addr: int
    size: int
    stream: int
    is_small: bool
    blocks: list[tuple[int, int, int]] = field(default_factory=list)  # (addr, size or 0 = infer, requested)
    ids: list[int] = field(default_factory=list)                      # trace ids of the blocks


@dataclass
class StartRange:
    """The range of an expandable segment when recording began: its mapped runs and live blocks."""

    base: int
    stream: int
    is_small: bool
    runs: list[tuple[int, int]] = field(default_factory=list)     # (addr, size) of mapped pages
    blocks: list[tuple[int, int, int]] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)

    def as_segments(self) -> list[StartSegment]:
        """Each mapped run as a fixed segment (when the range cannot be rebuilt as one)."""
        out = []
        for addr, size in self.runs:
            seg = StartSegment(addr, size, self.stream, self.is_small)
            for block, id_ in zip(self.blocks, self.ids):
                if addr <= block[0] < addr + size:
                    seg.blocks.append(block)
                    seg.ids.append(id_)
            out.append(seg)
        return out


@dataclass
class StartState:
    """What was in memory when recording began."""

    segments: list[StartSegment] = field(default_factory=list)
    ranges: list[StartRange] = field(default_factory=list)  # expandable segments
    notes: list[str] = field(default_factory=list)

    @property
    def reserved(self) -> int:
        return sum(s.size for s in self.segments) + sum(size for r in self.ranges for _, size in r.runs)

    @property
    def live_blocks(self) -> int:
        return sum(len(s.blocks) for s in self.segments) + sum(len(r.blocks) for r in self.ranges)

    @property
    def requested(self) -> int:
        return sum(b[2] for s in [*self.segments, *self.ranges] for b in s.blocks)

    def describe(self) -> str:
        if not self.segments and not self.ranges:
            return "recording began with an empty allocator"
        ranges = f" and {len(self.ranges)} expandable ranges" if self.ranges else ""
        return (f"rebuilt the state when recording began: {len(self.segments)} segments{ranges}, "
                f"{self.live_blocks} live blocks, {self.requested / 2**30:.2f} GiB requested in "
                f"{self.reserved / 2**30:.2f} GiB reserved")


@dataclass
class RecordedRun:
    """What a snapshot says about the run on its GPU, beside the events."""

    device: int
    devices: list[tuple[int, int]]           # (device index, trace entries) of every device with entries
    conf: str | None                         # allocator settings in the config grammar; None if not recorded
    capacity: int | None                     # reserved + device_free at the OOM, when there is one
    oom: dict | None                         # the first oom entry: index (event), entry, size, stream, device_free, reserved
    empty_cache_calls: int = 0
    entries: int = 0
    max_address: int = 0
    event_entries: Any = None                # numpy: the trace entry each replay event comes from

    def entry_of(self, event: int | None) -> int | None:
        """The trace entry of replay event `event`."""
        if event is None or self.event_entries is None or not 0 <= event < len(self.event_entries):
            return None
        return int(self.event_entries[event])


def recorded_conf(settings: Any) -> str | None:
    """The snapshot's ``allocator_settings`` in the config grammar ("" = defaults), None if absent."""
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
    return ",".join(items)


def choose_device(traces: list) -> int:
    """The device with an OOM, else the first with entries, else 0."""
    with_entries = [d for d, t in enumerate(traces) if isinstance(t, list) and t]
    for d in with_entries:
        if any(isinstance(e, dict) and e.get("action") == "oom" for e in traces[d]):
            return d
    return with_entries[0] if with_entries else 0


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


def _int_field(entry: dict, key: str, where: str) -> int:
    value = entry.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TraceError(f"{where}: {key} must be a non-negative integer, got {value!r}")
    return value


class _Builder:
    """One pass over a device's trace entries; see the module docstring."""

    def __init__(self, name: str, device: int, skip_bad_events: bool) -> None:
        self.name, self.device, self.skip = name, device, skip_bad_events
        self.cols = _Columns()
        self.next_id = 0
        self.live: dict[int, int] = {}            # addr -> id, blocks live now
        self.seen: set[int] = set()               # addresses with an alloc or free so far
        self.freed_at_start: dict[int, tuple[int, int, int]] = {}  # addr -> (id, requested, entry index)
        self.segments: dict[int, tuple[int, int]] = {}             # addr -> (size, entry index), made in the trace, live
        self.segments_gone: set[int] = set()      # addresses of segments freed so far
        self.start_segments: dict[int, tuple[int, int]] = {}       # addr -> (size, stream), freed before being made
        self.reserved_delta = 0
        self.pending_release: list[int] = []      # op positions of a run of segment_free / segment_unmap
        self.segment_after_release = False        # a segment_alloc / segment_map followed the run
        self.oom: dict | None = None
        self.empty_cache_calls = 0
        self.bad = 0
        self.max_address = 0
        self.maps: list[tuple[str, int, int, int]] = []  # (action, addr, size, stream) of every map and unmap
        self.allocs: list[tuple[int, int]] = []  # (addr, entry index) of every alloc

    def where(self, i: int) -> str:
        return f"{self.name}: device {self.device} entry {i}"

    def bad_entry(self, i: int, what: str) -> None:
        if not self.skip:
            raise TraceError(f"{self.where(i)}: {what}")
        self.bad += 1

    def new_id(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def settle_release(self, next_action: str | None) -> None:
        """A run of segment releases ends: the program's empty_cache(), or the allocator's own.

        Each release is in the trace (a replay that follows the recording
        makes exactly these). For replays under other settings the run counts
        as the program's empty_cache() unless the allocator made it itself: a
        retry before a new segment, or the release before an out-of-memory.
        """
        if self.pending_release and next_action != "oom" and not self.segment_after_release:
            self.cols.insert(self.pending_release[0], EMPTY_CACHE)
            self.empty_cache_calls += 1
        self.pending_release.clear()
        self.segment_after_release = False

    def entry(self, i: int, entry: Any, free_action: str) -> None:
        self.cols.entry = i
        if not isinstance(entry, dict) or "action" not in entry:
            return self.bad_entry(i, "not a trace entry (expected a dict with an 'action')")
        action = entry["action"]
        if action not in SNAPSHOT_ACTIONS:
            return self.bad_entry(i, f"unknown action {action!r} (expected one of {', '.join(sorted(SNAPSHOT_ACTIONS))})")
        if action in ("segment_free", "segment_unmap"):
            if self.segment_after_release:
                self.settle_release(action)
            self.pending_release.append(len(self.cols.ops))
        elif action in ("segment_alloc", "segment_map"):
            self.segment_after_release = bool(self.pending_release)
        elif action != "snapshot" and not (action.startswith("free") and action != free_action):
            self.settle_release(action)
        try:
            self.dispatch(i, entry, action, free_action)
        except TraceError as exc:
            if not self.skip:
                raise
            self.bad += 1
            del exc

    def dispatch(self, i: int, entry: dict, action: str, free_action: str) -> None:
        where = self.where(i)
        if action == "snapshot" or (action.startswith("free") and action != free_action):
            return
        size = _int_field(entry, "size", where)
        stream = _int_field(entry, "stream", where) if "stream" in entry else 0
        if action == "oom":
            if "device_free" not in entry:
                raise TraceError(f"{where}: oom entry without device_free (the free bytes on the GPU at the failure)")
            device_free = _int_field(entry, "device_free", where)
            if self.oom is None:
                self.oom = {"index": len(self.cols.ops), "entry": i, "size": size, "stream": stream,
                            "device_free": device_free, "reserved_delta": self.reserved_delta}
            self.cols.add(FAILED_ALLOC, 0, size, stream)
            return
        addr = _int_field(entry, "addr", where)
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
            self.cols.add(ALLOC, id_, size, stream, addr)
        elif action == free_action:
            id_ = self.live.pop(addr, None)
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
            self.reserved_delta += size
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
            self.reserved_delta += size
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
    if device is None:
        device = choose_device(traces)
    if isinstance(device, bool) or not isinstance(device, int) or not 0 <= device < max(1, len(traces)):
        raise TraceError(f"{name}: no device {device!r} (the snapshot has {len(traces)})")
    entries = traces[device] if device < len(traces) else []
    if not isinstance(entries, list):
        raise TraceError(f"{name}: device_traces[{device}] is not a list of trace entries")
    actions = {e.get("action") for e in entries if isinstance(e, dict)}
    free_action = "free_completed" if "free_completed" in actions else "free_requested"

    b = _Builder(name, device, skip_bad_events)
    for i, entry in enumerate(entries):
        b.entry(i, entry, free_action)
    b.settle_release(None)
    start = _start_state(snapshot, b)
    conf = recorded_conf(snapshot.get("allocator_settings"))
    _resolve_block_sizes(start, conf or "", name, b)
    capacity = None
    oom = None
    if b.oom is not None:
        oom = dict(b.oom)
        oom["reserved"] = start.reserved + oom.pop("reserved_delta")
        capacity = oom["reserved"] + oom["device_free"]
    devices = [(d, len(t)) for d, t in enumerate(traces) if isinstance(t, list) and t]
    recorded = RecordedRun(device=device, devices=devices, conf=conf, capacity=capacity, oom=oom,
                           empty_cache_calls=b.empty_cache_calls, entries=len(entries), max_address=b.max_address,
                           event_entries=np.asarray(b.cols.entries, dtype=np.int64))
    notes = []
    if b.bad:
        notes.append(f"skipped {b.bad} bad trace entries")
    notes += start.notes
    cols = b.cols

    def factory() -> Iterator[Chunk]:
        return cols.chunks()

    trace = Trace(name, factory, total=len(cols.ops), notes=notes)
    trace.start = start
    trace.recorded = recorded
    return trace


class _Ranges:
    """A set of address ranges, kept as sorted disjoint [start, end) runs."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.ends: list[int] = []

    def add(self, addr: int, size: int) -> None:
        self.remove(addr, size)
        k = bisect.bisect_left(self.starts, addr)
        self.starts.insert(k, addr)
        self.ends.insert(k, addr + size)
        # merge with touching neighbours
        if k + 1 < len(self.starts) and self.starts[k + 1] == self.ends[k]:
            self.ends[k] = self.ends.pop(k + 1)
            self.starts.pop(k + 1)
        if k > 0 and self.ends[k - 1] == self.starts[k]:
            self.ends[k - 1] = self.ends.pop(k)
            self.starts.pop(k)

    def remove(self, addr: int, size: int) -> None:
        end = addr + size
        out_s, out_e = [], []
        for s, e in zip(self.starts, self.ends):
            if e <= addr or s >= end:
                out_s.append(s)
                out_e.append(e)
                continue
            if s < addr:
                out_s.append(s)
                out_e.append(addr)
            if e > end:
                out_s.append(end)
                out_e.append(e)
        self.starts, self.ends = out_s, out_e

    def runs(self) -> list[tuple[int, int]]:
        return list(zip(self.starts, self.ends))


def _start_state(snapshot: dict, b: _Builder) -> StartState:
    """Segments and live blocks when recording began, from the pass and the final segments."""
    start_segments: dict[int, list] = {a: [s, st, s == SMALL_SEGMENT, False] for a, (s, st) in b.start_segments.items()}
    survivors: dict[int, tuple[int, int]] = {}  # addr -> (size, requested): live at start and at the end
    still_made = dict(b.segments)
    final_mapped = _Ranges()
    pool_of: dict[int, tuple[int, bool]] = {}  # range start -> (stream, is_small), for expandable pages
    live_at_end = dict(b.live)
    segments = snapshot.get("segments")
    if not isinstance(segments, list):
        raise TraceError(f"{b.name}: no segments list")
    for n, seg in enumerate(segments):
        where = f"{b.name}: segment {n}"
        if not isinstance(seg, dict):
            raise TraceError(f"{where}: not a segment (expected a dict)")
        if seg.get("device", b.device) != b.device:
            continue
        addr, size = _int_field(seg, "address", where), _int_field(seg, "total_size", where)
        b.max_address = max(b.max_address, addr + size)
        blocks = seg.get("blocks")
        if not isinstance(blocks, list):
            raise TraceError(f"{where}: blocks must be a list")
        made = still_made.pop(addr, None)
        if made is not None and made[0] != size and not seg.get("is_expandable"):
            b.bad_entry(made[1], f"segment_alloc of {made[0]} bytes at 0x{addr:x}, but the final segments give {size}")
        expandable = bool(seg.get("is_expandable"))
        stream = _int_field(seg, "stream", where) if "stream" in seg else 0
        if expandable:  # its pages mapped at the start are found below, from all the maps and unmaps
            final_mapped.add(addr, size)
            pool_of[addr] = (stream, seg.get("segment_type") == "small")
        elif made is None:
            start_segments[addr] = [size, stream, seg.get("segment_type") == "small", False]
        for k, block in enumerate(blocks):
            bwhere = f"{where} block {k}"
            if not isinstance(block, dict):
                raise TraceError(f"{bwhere}: not a block (expected a dict)")
            baddr = _int_field(block, "address", bwhere)
            state = block.get("state")
            if state in LIVE_STATES:
                if live_at_end.pop(baddr, None) is not None:
                    continue
                if baddr in b.seen:
                    b.bad_entry(len(b.cols.ops), f"the final segments show 0x{baddr:x} allocated, but the trace frees it last")
                    continue
                if made is not None:
                    b.bad_entry(made[1], f"the final segments show 0x{baddr:x} allocated in a segment the trace made, "
                                         "but the trace never allocates it")
                    continue
                survivors[baddr] = (_int_field(block, "size", bwhere), _int_field(block, "requested_size", bwhere)
                                    if "requested_size" in block else 0)
    # Expandable segments: the pages mapped at the start are the final ones with the trace's maps
    # undone backwards; each mapped run is rebuilt as a fixed segment.
    for action, addr, size, stream in reversed(b.maps):
        (final_mapped.remove if action == "segment_map" else final_mapped.add)(addr, size)
        pool_of.setdefault(addr, (stream, size % (20 << 20) != 0))
    for start, end in final_mapped.runs():
        owner = max((a for a in pool_of if a <= start), default=None)
        stream, is_small = pool_of.get(owner, (0, (end - start) % (20 << 20) != 0))
        start_segments[start] = [end - start, stream, is_small, True]
    for addr, id_ in live_at_end.items():
        b.bad_entry(len(b.cols.ops), f"the trace allocates 0x{addr:x} and never frees it, but the final segments "
                                     "show no live block there")
    for addr, (_, i) in still_made.items():
        b.bad_entry(i, f"segment_alloc at 0x{addr:x}, a segment the trace never frees, is missing from the final segments")

    state = StartState()
    order = sorted(start_segments)
    by_addr: dict[int, StartSegment] = {}
    expandable_runs: list[int] = []
    for addr in order:
        size, stream, is_small, expandable = start_segments[addr]
        by_addr[addr] = StartSegment(addr, size, stream, is_small)
        if expandable:
            expandable_runs.append(addr)
    blocks: list[tuple[int, int, int, int | None]] = [(a, 0, req, id_) for a, (id_, req, _) in b.freed_at_start.items()]
    blocks += [(a, size, req, None) for a, (size, req) in survivors.items()]
    blocks.sort()
    sizes = _sizes_from_later_allocs(blocks, order, by_addr, b)
    for (addr, size, requested, id_), known in zip(blocks, sizes):
        size = size or known
        k = bisect.bisect_right(order, addr) - 1
        seg = by_addr.get(order[k]) if k >= 0 else None
        if seg is None or addr >= seg.addr + seg.size:
            entry = b.freed_at_start.get(addr, (0, 0, len(b.cols.ops)))[2]
            b.bad_entry(entry, f"a block at 0x{addr:x}, live when recording began, lies in no segment that existed then")
            continue
        if id_ is None:
            id_ = b.new_id()
        seg.blocks.append((addr, size, requested))
        seg.ids.append(id_)
    # Mapped runs of one stream and pool belong to one expandable range, which begins at the lowest
    # address the recording ever mapped for them.
    groups: dict[tuple[int, bool], StartRange] = {}
    for addr in expandable_runs:
        run = by_addr.pop(addr)
        group = groups.setdefault((run.stream, run.is_small), StartRange(addr, run.stream, run.is_small))
        group.runs.append((run.addr, run.size))
        group.blocks += run.blocks
        group.ids += run.ids
    for action, addr, size, stream in b.maps:
        group = groups.get((stream, size % (20 << 20) != 0))
        if action == "segment_map" and group is not None:
            group.base = min(group.base, addr)
    state.segments = [by_addr[a] for a in order if a in by_addr]
    state.ranges = list(groups.values())
    return state


def _sizes_from_later_allocs(blocks: list, order: list[int], by_addr: dict, b: _Builder) -> list[int]:
    """Exact sizes of blocks live at the start and freed later, where the trace shows them (0 elsewhere).

    At the start, the space after such a block X, up to the next live block,
    is one free block beginning where X ends. An allocation always takes the
    beginning of the free block it is given, so the first allocation the
    trace places in that space while X is still live sits exactly at X's end.
    """
    allocs = sorted(b.allocs)
    alloc_addrs = [a for a, _ in allocs]
    out = []
    for n, (addr, size, _requested, _id) in enumerate(blocks):
        if size:
            out.append(0)
            continue
        k = bisect.bisect_right(order, addr) - 1
        seg = by_addr.get(order[k]) if k >= 0 else None
        limit = seg.addr + seg.size if seg else addr
        if n + 1 < len(blocks):
            limit = min(limit, blocks[n + 1][0])
        freed_at = b.freed_at_start[addr][2] if addr in b.freed_at_start else len(b.cols.ops)
        first = None
        for j in range(bisect.bisect_right(alloc_addrs, addr), bisect.bisect_left(alloc_addrs, limit)):
            a, i = allocs[j]
            if i < freed_at and (first is None or i < first[1]):
                first = (a, i)
        out.append(first[0] - addr if first else 0)
    return out


def _resolve_block_sizes(start: StartState, conf: str, name: str, b: _Builder) -> None:
    """Fixes the sizes still unknown (0) by the recorded settings' rules, once: a replay under
    other settings must start from the blocks the recorded ones made."""
    from torchmem import _C

    for r in list(start.ranges):
        runs_end = max(a + size for a, size in r.runs)
        capacity = max(runs_end - r.base, sum(size for _, size in r.runs)) + (20 << 20)
        probe = _C.Replayer(capacity, 0, conf)
        try:
            probe.restore_expandable(r.base, r.stream, r.is_small, r.runs, r.blocks, r.ids)
        except ValueError as exc:
            start.ranges.remove(r)
            start.segments += r.as_segments()
            start.segments.sort(key=lambda seg: seg.addr)
            start.notes.append(f"an expandable range that existed when recording began is rebuilt as fixed segments "
                               f"({exc}), so placements in it may differ")
            continue
        sizes = {blk["address"]: blk["size"] for s in probe.segments() for blk in s["blocks"] if blk["allocated"]}
        r.blocks = [(addr, sizes[addr], requested) for addr, _, requested in r.blocks]
    for seg in start.segments:
        if all(size for _, size, _ in seg.blocks):
            continue
        probe = _C.Replayer(seg.size + (2 << 20), 0, conf)
        try:
            probe.restore(seg.addr, seg.size, seg.stream, seg.is_small, seg.blocks, seg.ids)
        except ValueError as exc:
            if not b.skip:
                raise TraceError(f"{name}: device {b.device}: the state when recording began: {exc}") from None
            b.bad += 1
            seg.blocks, seg.ids = [], []
            continue
        sizes = {blk["address"]: blk["size"] for s in probe.segments() for blk in s["blocks"] if blk["allocated"]}
        seg.blocks = [(addr, sizes[addr], requested) for addr, _, requested in seg.blocks]
