"""Two memory snapshots of one program, compared event by event (benchmarks/preflight_vs_real.py).

One snapshot was recorded on a real GPU, the other under preflight. Both are
plain dicts as ``torch.cuda.memory._snapshot()`` makes them; nothing here
imports torch, and every function is pure.

Per trace entry the comparison looks at:

- the action and the size (``alloc``, ``free_requested``, ``free_completed``,
  ``segment_alloc``, ``segment_free``, ``segment_map``, ``segment_unmap``,
  ``oom``; ``snapshot`` marks are skipped);
- for an ``alloc``, its offset in the segment that holds it;
- the segment sizes, in the order the segments were made;
- the peaks of allocated and reserved bytes over the trace.

Block sizes (what ``allocated_bytes`` counts) are not in the trace: an
``alloc`` records the requested size. ``Layout`` rebuilds them with the
caching allocator's rounding and split rules, segment by segment, so the
peaks match ``memory_stats()`` for a trace recorded from the first
allocation. For a trace that starts mid-run, the window's start is rebuilt
from the final ``segments`` (their blocks give the sizes of live
allocations); an allocation inside a segment made before recording began,
and freed before the end, is counted at its rounded size (``approximate``).
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any, Sequence

from torchmem import _core

ACTIONS = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map",
           "segment_unmap", "oom")
MIN_BLOCK = _core.rules.MIN_BLOCK_SIZE  # kMinBlockSize
SMALL_SIZE = _core.rules.SMALL_SIZE  # kSmallSize: requests up to this go to the small pool
SMALL_BUFFER = _core.rules.SMALL_BUFFER  # kSmallBuffer: the small pool's segment size


@dataclass(frozen=True)
class Event:
    """One trace entry, as compared: action, size, offset in its segment (allocations only)."""

    index: int                  # position in the device's trace (snapshot marks included)
    action: str
    size: int
    offset: int | None = None
    frames: tuple[str, ...] = ()

    def key(self) -> tuple[str, int, int | None]:
        return (self.action, self.size, self.offset)

    def describe(self) -> str:
        where = f" at offset {self.offset:,}" if self.offset is not None else ""
        return f"{self.action} {self.size:,} B{where}"


@dataclass
class Peaks:
    allocated: int = 0
    reserved: int = 0
    approximate: int = 0        # allocations whose block size was taken as their rounded size


@dataclass
class Divergence:
    """The first position where two event lists part ways."""

    position: int               # index into the compared (filtered) event lists
    real: Event | None          # None: the real trace ended there
    other: Event | None         # None: the preflight trace ended there
    field: str                  # "action", "size", "offset" or "length"


@dataclass
class Comparison:
    events_real: int
    events_other: int
    matching: int                       # events equal from the start, up to the first divergence
    first: Divergence | None
    first_request: Divergence | None    # the first difference in action or size alone (offsets aside)
    segments_real: list[int]
    segments_other: list[int]
    first_segment: int | None           # index of the first segment whose size differs (or that one side lacks)
    peaks_real: Peaks
    peaks_other: Peaks
    notes: list[str] = field(default_factory=list)

    @property
    def agrees(self) -> bool:
        return self.first is None and self.first_segment is None

    def peak_difference(self, which: str) -> float:
        """(preflight - real) / real for "allocated" or "reserved"; 0 when both are 0."""
        real, other = getattr(self.peaks_real, which), getattr(self.peaks_other, which)
        return (other - real) / real if real else (0.0 if other == 0 else float("inf"))

    def to_json(self) -> dict[str, Any]:
        def ev(e: Event | None) -> dict[str, Any] | None:
            return None if e is None else {"index": e.index, "action": e.action, "size": e.size,
                                           "offset": e.offset, "frames": list(e.frames)}

        return {
            "events_real": self.events_real, "events_preflight": self.events_other, "matching": self.matching,
            "first": None if self.first is None else {"position": self.first.position, "field": self.first.field,
                                                      "real": ev(self.first.real), "preflight": ev(self.first.other)},
            "first_request": None if self.first_request is None else {
                "position": self.first_request.position, "field": self.first_request.field,
                "real": ev(self.first_request.real), "preflight": ev(self.first_request.other)},
            "segments_real": self.segments_real, "segments_preflight": self.segments_other,
            "first_segment": self.first_segment,
            "peak_allocated": [self.peaks_real.allocated, self.peaks_other.allocated],
            "peak_reserved": [self.peaks_real.reserved, self.peaks_other.reserved],
            "peak_allocated_difference": self.peak_difference("allocated"),
            "peak_reserved_difference": self.peak_difference("reserved"),
            "approximate_blocks": [self.peaks_real.approximate, self.peaks_other.approximate],
            "notes": self.notes,
        }


def rounded(size: int) -> int:
    """The caching allocator's block size for a request (round_size)."""
    return MIN_BLOCK if size < MIN_BLOCK else MIN_BLOCK * ((size + MIN_BLOCK - 1) // MIN_BLOCK)


def _frames(entry: dict[str, Any], limit: int) -> tuple[str, ...]:
    out = []
    for f in entry.get("frames") or ():
        name = str(f.get("filename", "?"))
        if not name.endswith(".py"):
            continue  # C++ frames of stacks="all"
        out.append(f"{name}:{f.get('line', '?')} ({f.get('name', '?')})")
        if len(out) == limit:
            break
    return tuple(out)


class Layout:
    """Segments and their blocks, kept from the trace: block sizes, offsets, and the peaks.

    Blocks live in a per-segment dict offset -> [size, allocated]. A new
    allocation takes the free block starting at its address and splits it
    as PyTorch's shouldSplit does: the small pool (requests up to 1 MiB)
    splits when at least 512 bytes remain, the large pool when more than
    1 MiB remains. A completed free merges with free neighbours.
    """

    def __init__(self, final_segments: Sequence[dict[str, Any]], device: int) -> None:
        self.starts: list[int] = []
        self.sizes: dict[int, int] = {}
        self.blocks: dict[int, dict[int, list[int]] | None] = {}   # None: layout unknown (made before recording)
        self.known: dict[int, int] = {}    # addr -> block size of blocks live at the end (final segments)
        self.final: dict[int, int] = {}
        for seg in final_segments:
            if seg.get("device", device) != device:
                continue
            self.final[seg["address"]] = seg["total_size"]
            for b in seg.get("blocks", ()):
                if b.get("state") in ("active_allocated", "active_pending_free"):
                    self.known[b["address"]] = b["size"]
        self.live: dict[int, int] = {}     # addr -> counted block size
        self.approximate = 0

    def segment_of(self, addr: int) -> int | None:
        i = bisect.bisect_right(self.starts, addr) - 1
        if i >= 0 and addr < self.starts[i] + self.sizes[self.starts[i]]:
            return self.starts[i]
        return None

    def add_segment(self, addr: int, size: int, fresh: bool) -> None:
        if addr not in self.sizes:
            bisect.insort(self.starts, addr)
        self.sizes[addr] = size
        self.blocks[addr] = {0: [size, 0]} if fresh else None

    def remove_segment(self, addr: int) -> None:
        if addr in self.sizes:
            del self.sizes[addr]
            self.starts.remove(addr)
            self.blocks.pop(addr, None)

    def find(self, addr: int, unmade: dict[int, int]) -> int | None:
        """The segment holding addr; a segment made before recording is taken from the end state or its free."""
        seg = self.segment_of(addr)
        if seg is not None:
            return seg
        for table in (self.final, unmade):
            for start, size in table.items():
                if start <= addr < start + size and start not in self.sizes:
                    self.add_segment(start, size, fresh=False)
                    return start
        return None

    def alloc(self, addr: int, size: int, seg: int | None, counted: bool = True) -> int:
        want = rounded(size)
        blocks = self.blocks.get(seg) if seg is not None else None
        block = None
        if blocks is not None:
            off = addr - seg
            found = blocks.get(off)
            if found is not None and found[1] == 0 and found[0] >= want:
                remaining = found[0] - want
                small = want <= SMALL_SIZE
                if (remaining >= MIN_BLOCK) if small else (remaining > SMALL_SIZE):
                    blocks[off + want] = [remaining, 0]
                    found[0] = want
                found[1] = 1
                block = found[0]
        if block is None:
            block = self.known.get(addr)
        if block is None:
            block = want
            self.approximate += counted
        self.live[addr] = block
        return block

    def free(self, addr: int, seg: int | None, requested: int = 0, counted: bool = True) -> int:
        size = self.live.pop(addr, None)
        if size is None:  # allocated before recording began: its block size is inferred
            size = rounded(requested) if requested else 0
            self.approximate += counted
        blocks = self.blocks.get(seg) if seg is not None else None
        if blocks is not None:
            off = addr - seg
            if off in blocks:
                blocks[off][1] = 0
                self._merge(blocks, off)
        return size

    @staticmethod
    def _merge(blocks: dict[int, list[int]], off: int) -> None:
        after = off + blocks[off][0]
        if after in blocks and blocks[after][1] == 0:
            blocks[off][0] += blocks.pop(after)[0]
        before = max((o for o in blocks if o < off), default=None)
        if before is not None and blocks[before][1] == 0 and before + blocks[before][0] == off:
            blocks[before][0] += blocks.pop(off)[0]


def trace_entries(snapshot: dict[str, Any], device: int = 0) -> list[dict[str, Any]]:
    traces = snapshot.get("device_traces") or []
    return list(traces[device]) if device < len(traces) else []


def events_and_peaks(snapshot: dict[str, Any], device: int = 0, start: int = 0,
                     frames: int = 4) -> tuple[list[Event], list[int], Peaks]:
    """The compared events of one device's trace from entry `start` on, the segment sizes in order, the peaks.

    Entries before `start` (a preflight run records from torch's import)
    only build the layout and the state the window starts from. With
    `start` 0 the trace may begin mid-run: the state when it began is the
    final segments less what the trace did.
    """
    entries = trace_entries(snapshot, device)
    layout = Layout(snapshot.get("segments") or (), device)
    # segments freed in the trace that it never made: they existed when recording began
    made: set[int] = set()
    unmade: dict[int, int] = {}
    for e in entries:
        if e["action"] in ("segment_alloc", "segment_map"):
            made.add(e["addr"])
        elif e["action"] in ("segment_free", "segment_unmap") and e["addr"] not in made:
            unmade.setdefault(e["addr"], e["size"])
    events: list[Event] = []
    segments: list[int] = []
    allocated = reserved = 0
    top_allocated = top_reserved = 0
    for i, e in enumerate(entries):
        if i == start:
            top_allocated, top_reserved = allocated, reserved
        action = e["action"]
        if action not in ACTIONS:
            continue
        addr, size = e.get("addr", 0), e.get("size", 0)
        offset = None
        if action in ("segment_alloc", "segment_map"):
            reserved += size
            if action == "segment_alloc":
                layout.add_segment(addr, size, fresh=True)
        elif action in ("segment_free", "segment_unmap"):
            reserved -= size
            if action == "segment_free":
                layout.find(addr, unmade)
                layout.remove_segment(addr)
        elif action == "alloc":
            seg = layout.find(addr, unmade)
            offset = addr - seg if seg is not None else None
            allocated += layout.alloc(addr, size, seg, counted=i >= start)
        elif action == "free_completed":
            allocated -= layout.free(addr, layout.find(addr, unmade), size, counted=i >= start)
        if i < start:
            continue
        if action in ("segment_alloc", "segment_map"):
            segments.append(size)
        top_allocated = max(top_allocated, allocated)
        top_reserved = max(top_reserved, reserved)
        events.append(Event(i, action, size, offset, _frames(e, frames)))
    if start == 0:  # the state when recording began: the end state less the trace's net change
        base_allocated = max(0, sum(layout.known.values()) - allocated)
        base_reserved = max(0, sum(layout.final.values()) - reserved)
    else:  # the prefix was recorded: the running totals are exact from the first entry
        base_allocated = base_reserved = 0
    peaks = Peaks(base_allocated + top_allocated, base_reserved + top_reserved, layout.approximate)
    return events, segments, peaks


def first_difference(real: Sequence[Event], other: Sequence[Event], offsets: bool = True) -> Divergence | None:
    """The first position where the two event lists differ in action, size or offset, or where one ends."""
    for i, (a, b) in enumerate(zip(real, other)):
        if (a.key() if offsets else a.key()[:2]) != (b.key() if offsets else b.key()[:2]):
            fld = "action" if a.action != b.action else "size" if a.size != b.size else "offset"
            return Divergence(i, a, b, fld)
    if len(real) != len(other):
        n = min(len(real), len(other))
        return Divergence(n, real[n] if n < len(real) else None, other[n] if n < len(other) else None, "length")
    return None


def first_segment_difference(real: Sequence[int], other: Sequence[int]) -> int | None:
    for i, (a, b) in enumerate(zip(real, other)):
        if a != b:
            return i
    return None if len(real) == len(other) else min(len(real), len(other))


def best_shift(real: Sequence[Event], other: Sequence[Event], limit: int = 64) -> int:
    """For two windows that end together (a ring of the last N entries): the shift of their starts, from -limit
    to limit, after which the most requests (action and size) agree from the start. Positive: drop real events."""
    def run(a: Sequence[Event], b: Sequence[Event]) -> int:
        n = 0
        for x, y in zip(a, b):
            if x.key()[:2] != y.key()[:2]:
                break
            n += 1
        return n

    scores = {k: run(real[k:], other) if k >= 0 else run(real, other[-k:]) for k in range(-limit, limit + 1)}
    return max(scores, key=lambda k: (scores[k], -abs(k)))


def compare(real: dict[str, Any], other: dict[str, Any], *, device: int = 0, real_start: int = 0,
            other_start: int = 0, frames: int = 4, shift: int | None = 0) -> Comparison:
    """Compares `other` (preflight's snapshot) against `real`, each from its own first entry of the window.

    `shift` drops that many events from the start of the real window (negative: of preflight's) before
    the events are compared; None finds it with best_shift (windows that end together). Peaks and
    segment sizes cover the whole windows.
    """
    ev_real, seg_real, peaks_real = events_and_peaks(real, device, real_start, frames)
    ev_other, seg_other, peaks_other = events_and_peaks(other, device, other_start, frames)
    if shift is None:
        shift = best_shift(ev_real, ev_other)
    notes = [f"windows aligned by dropping the first {abs(shift)} {'real' if shift > 0 else 'preflight'} events"
             ] if shift else []
    ev_real, ev_other = (ev_real[shift:], ev_other) if shift >= 0 else (ev_real, ev_other[-shift:])
    first = first_difference(ev_real, ev_other)
    matching = first.position if first is not None else len(ev_real)
    if peaks_real.approximate or peaks_other.approximate:
        notes.append(f"block sizes taken as rounded sizes: {peaks_real.approximate} real, "
                     f"{peaks_other.approximate} preflight (allocations in segments made before recording)")
    request = first if first is None or first.field != "offset" else first_difference(ev_real, ev_other, offsets=False)
    return Comparison(len(ev_real), len(ev_other), matching, first, request, seg_real, seg_other,
                      first_segment_difference(seg_real, seg_other), peaks_real, peaks_other, notes)
