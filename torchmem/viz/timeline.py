"""Allocated, reserved and the largest free block over a snapshot's history.

The history is a ring buffer, so it usually starts in the middle of a run.
The snapshot's segments say how things stood at its end; walking the history
backwards from there gives how they stood before its first entry, and then
forwards again gives every point in between:

    allocated[i] = allocated_end - sum(delta_allocated[i+1:])

The largest free block is recomputed at sampled events from the live blocks
and reserved ranges of that moment. The trace records requested sizes, not
block sizes: a block made inside the history is taken as its request rounded
up to 512 bytes, or as the whole free gap it starts when the allocator's
split rule would not split it (less than 512 bytes left in the small pool,
1 MiB or less in the large). Blocks freed inside the history but made before
it are taken as their rounded request. Oversize rules (max_split_size) are
not modelled, so the series is close, and exact at the snapshot's end.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from torchmem import _core
from torchmem.formats.annotations import annotation_entries
from torchmem.formats.snapshot_devices import choose_device

MIN_BLOCK = _core.rules.MIN_BLOCK_SIZE
SMALL_SIZE = _core.rules.SMALL_SIZE  # requests up to 1 MiB use the small pool; large blocks split only above 1 MiB left


@dataclass
class Timeline:
    """Series over the events of one device's history."""

    device: int
    events: int
    index: np.ndarray        # point i: the state after trace entry i - 1 (0: before the first entry)
    time_us: np.ndarray      # time of each point
    allocated: np.ndarray    # bytes requested by live allocations after each event
    reserved: np.ndarray     # bytes of mapped segments after each event
    free_index: np.ndarray   # events at which the largest free block was sampled
    largest_free: np.ndarray
    ooms: list[dict] = field(default_factory=list)  # {"entry", "index", "time_us", "size", "device_free", "allocated", "reserved"}
    notes: list[str] = field(default_factory=list)
    device_choice: str = ""  # "device 0 (the one with the OOM)" (torchmem.formats.snapshot_devices)
    annotations: list = field(default_factory=list)  # torchmem.formats.annotations.Annotation: annotate entries

    @property
    def entry(self) -> np.ndarray:
        """The trace entry of each point (-1: when recording began), as every command numbers entries."""
        return self.index - 1


def _round(size: int) -> int:
    return max(MIN_BLOCK, -(-size // MIN_BLOCK) * MIN_BLOCK)


def timeline(snapshot: dict, device: int | None = None, samples: int = 400,
             progress: Callable[[int], None] | None = None) -> Timeline:
    """The series of `device` (default: the one with the OOM, else the longest history)."""

    choice = choose_device(snapshot, device)
    device = choice.device
    traces = snapshot.get("device_traces") or [[]]
    entries = traces[device] if device < len(traces) else []
    segments = [s for s in snapshot["segments"] if s.get("device", device) == device]
    notes: list[str] = []
    n = len(entries)

    end_allocated = sum(b.get("requested_size", b["size"]) for s in segments for b in s["blocks"]
                        if b["state"] != "inactive")
    end_reserved = sum(s["total_size"] for s in segments)
    d_alloc = np.zeros(n + 1, dtype=np.int64)
    d_resv = np.zeros(n + 1, dtype=np.int64)
    times = np.zeros(n + 1, dtype=np.int64)
    ooms = []
    sign = {"alloc": (1, 0), "free_completed": (-1, 0), "segment_alloc": (0, 1), "segment_map": (0, 1),
            "segment_free": (0, -1), "segment_unmap": (0, -1)}
    for i, e in enumerate(entries, 1):
        a, r = sign.get(e["action"], (0, 0))
        d_alloc[i] = a * e["size"] if a else 0
        d_resv[i] = r * e["size"] if r else 0
        times[i] = e.get("time_us", 0)
        if e["action"] == "oom":
            ooms.append({"entry": i - 1, "index": i, "time_us": times[i], "size": e["size"], "device_free": e.get("device_free", e.get("addr", 0))})
    times[0] = times[1] if n else 0
    allocated = end_allocated - (d_alloc.sum() - np.cumsum(d_alloc))
    reserved = end_reserved - (d_resv.sum() - np.cumsum(d_resv))
    if n and (allocated.min() < 0 or reserved.min() < 0):
        notes.append("the history does not end where the segments were taken; the curves are shifted")
    for o in ooms:
        o["allocated"] = int(allocated[o["index"]])
        o["reserved"] = int(reserved[o["index"]])

    free_index, largest = _largest_free_series(entries, segments, samples, progress)
    return Timeline(device, n, np.arange(n + 1), times, allocated, reserved, free_index, largest, ooms, notes,
                    choice.describe(), annotation_entries(entries))


class _Ranges:
    """Reserved address ranges: plain segments, and mapped pages that join their neighbours."""

    def __init__(self) -> None:
        self.segments: dict[int, int] = {}   # start -> size
        self.mapped: list[list[int]] = []    # sorted, disjoint, non-touching [start, end)

    def add_mapped(self, start: int, size: int) -> None:
        end = start + size
        keep = []
        for s, e in self.mapped:
            if e < start or s > end:
                keep.append([s, e])
            else:
                start, end = min(s, start), max(e, end)
        keep.append([start, end])
        self.mapped = sorted(keep)

    def remove_mapped(self, start: int, size: int) -> None:
        end = start + size
        out = []
        for s, e in self.mapped:
            if e <= start or s >= end:
                out.append([s, e])
                continue
            if s < start:
                out.append([s, start])
            if e > end:
                out.append([end, e])
        self.mapped = out

    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        pairs = [(s, s + n) for s, n in self.segments.items()] + [tuple(r) for r in self.mapped]
        pairs.sort()
        if not pairs:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        arr = np.asarray(pairs, dtype=np.int64)
        return arr[:, 0], arr[:, 1]


def _largest_free(live: dict[int, int], ranges: _Ranges) -> int:
    starts, ends = ranges.bounds()
    if not len(starts):
        return 0
    if live:
        addr = np.fromiter(live.keys(), dtype=np.int64, count=len(live))
        size = np.fromiter(live.values(), dtype=np.int64, count=len(live))
    else:
        addr = size = np.zeros(0, np.int64)
    which = np.searchsorted(starts, addr, side="right") - 1
    inside = (which >= 0) & (addr < ends[np.clip(which, 0, None)])
    addr, size, which = addr[inside], size[inside], which[inside]
    # Each range contributes a zero-size marker at its start and at its end;
    # gaps between neighbours in address order that lie in the same range are free.
    k = len(starts)
    all_start = np.concatenate([addr, starts, ends])
    all_end = np.concatenate([addr + size, starts, ends])
    all_range = np.concatenate([which, np.arange(k), np.arange(k)])
    order = np.lexsort((all_end, all_start))
    s, e, r = all_start[order], all_end[order], all_range[order]
    reach = np.maximum.accumulate(e)  # overlapping blocks (stale sizes) never make negative gaps
    gaps = s[1:] - reach[:-1]
    same = r[1:] == r[:-1]
    gaps = gaps[same]
    return int(gaps.max()) if len(gaps) and gaps.max() > 0 else 0


def _end_state(segments: list[dict]) -> tuple[dict[int, int], _Ranges]:
    """The live blocks (address -> size) and reserved ranges at the snapshot's end, from its segments."""
    live = {b["address"]: b["size"] for s in segments for b in s["blocks"] if b["state"] != "inactive"}
    ranges = _Ranges()
    for s in segments:
        if s.get("is_expandable"):
            ranges.add_mapped(s["address"], s["total_size"])
        else:
            ranges.segments[s["address"]] = s["total_size"]
    return live, ranges


def _rewind(entries: list[dict], live: dict[int, int], ranges: _Ranges) -> None:
    """Undoes the history's entries, last first, on ``live`` and ``ranges``: the state before the first entry."""
    for e in reversed(entries):
        action = e["action"]
        if action == "alloc":
            live.pop(e["addr"], None)
        elif action == "free_completed":
            live.setdefault(e["addr"], _round(e["size"]))
        elif action == "segment_alloc":
            ranges.segments.pop(e["addr"], None)
        elif action == "segment_free":
            ranges.segments[e["addr"]] = e["size"]
        elif action == "segment_map":
            ranges.remove_mapped(e["addr"], e["size"])
        elif action == "segment_unmap":
            ranges.add_mapped(e["addr"], e["size"])


@dataclass(frozen=True)
class _Forward:
    """The state walked forwards through the history, changed in place: live blocks, their sorted addresses,
    the reserved ranges, and those ranges' bounds as lists (empty until needed, cleared when they change)."""

    live: dict[int, int]
    live_addrs: list[int]
    ranges: _Ranges
    bounds: list


def _block_size(state: _Forward, addr: int, size: int) -> int:
    """The size of a new block at ``addr`` for a request of ``size``: the rounded request, or the whole free
    gap it starts when the split rule would not split it."""
    rounded = _round(size)
    bounds, live_addrs = state.bounds, state.live_addrs
    if not bounds:
        starts, ends = state.ranges.bounds()
        bounds.extend([starts.tolist(), ends.tolist()])
    r = bisect.bisect_right(bounds[0], addr) - 1
    if r < 0 or addr >= bounds[1][r]:
        return rounded
    k = bisect.bisect_right(live_addrs, addr)
    gap_end = min(bounds[1][r], live_addrs[k]) if k < len(live_addrs) else bounds[1][r]
    remaining = gap_end - addr - rounded
    small = rounded <= SMALL_SIZE
    if 0 <= remaining and (remaining < MIN_BLOCK if small else remaining <= SMALL_SIZE):
        return gap_end - addr
    return rounded


def _step_forward(state: _Forward, e: dict) -> None:
    """Applies one trace entry to ``state``: a block made or freed, a range reserved or released."""
    live, live_addrs, ranges = state.live, state.live_addrs, state.ranges
    action = e["action"]
    if action == "alloc":
        addr = e["addr"]
        if addr not in live:
            live[addr] = _block_size(state, addr, e["size"])
            bisect.insort(live_addrs, addr)
    elif action == "free_completed":
        if live.pop(e["addr"], None) is not None:
            del live_addrs[bisect.bisect_left(live_addrs, e["addr"])]
    elif action.startswith("segment_"):
        if action == "segment_alloc":
            ranges.segments[e["addr"]] = e["size"]
        elif action == "segment_free":
            ranges.segments.pop(e["addr"], None)
        elif action == "segment_map":
            ranges.add_mapped(e["addr"], e["size"])
        elif action == "segment_unmap":
            ranges.remove_mapped(e["addr"], e["size"])
        state.bounds.clear()


def _sample_marks(n: int, samples: int) -> set[int]:
    """The points (0 to ``n``) at which to sample: at most ``samples``, spread evenly."""
    return set(np.unique(np.linspace(0, n, num=min(samples, n + 1), dtype=np.int64)).tolist()) if n else {0}


def _largest_free_series(entries: list[dict], segments: list[dict], samples: int,
                         progress: Callable[[int], None] | None) -> tuple[np.ndarray, np.ndarray]:
    """The largest free block at sampled points of the history: (points, bytes)."""
    # The state at the end, from the segments.
    live, ranges = _end_state(segments)
    # Backwards to the state before the first entry.
    _rewind(entries, live, ranges)
    # Forwards, sampling. A new block takes the whole free gap it starts when
    # splitting would leave too little (the allocator's split rule), so its
    # size is the gap's, not just the rounded request.
    state = _Forward(live, sorted(live), ranges, [])
    n = len(entries)
    marks = _sample_marks(n, samples)
    index, values = [], []
    if 0 in marks:
        index.append(0)
        values.append(_largest_free(live, ranges))
    for i, e in enumerate(entries, 1):
        _step_forward(state, e)
        if i in marks:
            index.append(i)
            values.append(_largest_free(live, ranges))
            if progress and len(index) % 16 == 0:
                progress(i)
    if progress:
        progress(n)
    return np.asarray(index, dtype=np.int64), np.asarray(values, dtype=np.int64)
