"""The state of a snapshot's allocator when recording began (Note [Start state] in csrc/core/policy/native/caching_replay.cpp).

Most snapshots written on a GPU begin mid-run. The segments that existed
when recording began are those the trace frees without having made them,
the final segments it never made, and the expandable pages mapped then (the
final ones with the trace's maps undone backwards). The blocks live then are
those the trace frees without having allocated them, and the final
segments' live blocks it never allocated. A block's size is the final
segment's where it is still live at the end; else where the first
allocation placed right after it shows it ended; else the recorded
settings' rules (fixed by the core, once).
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Callable, Mapping

from torchmem.replay.capacity import LARGE_PAGE, SMALL_PAGE, range_size
from torchmem.replay.entries import LIVE_STATES, SMALL_SEGMENT, int_field
from torchmem.replay.trace_pass import DEFAULT_POOL, TracePass, pool_id_field
from torchmem.formats.trace_types import TraceError
from torchmem import _core
from torchmem.sizes import fmt_size


@dataclass
class StartSegment:
    """A segment that existed when recording began, with its live blocks."""

    addr: int
    size: int
    stream: int
    is_small: bool
    blocks: list[tuple[int, int, int]] = field(default_factory=list)  # (addr, size or 0 = infer, requested)
    ids: list[int] = field(default_factory=list)                      # trace ids of the blocks
    pool: tuple[int, int] = DEFAULT_POOL  # the private pool that held it (segment_pool_id, or its segment_free's pool_id)


@dataclass
class StartRange:
    """The range of an expandable segment when recording began: its mapped runs and live blocks."""

    base: int
    stream: int
    is_small: bool
    runs: list[tuple[int, int]] = field(default_factory=list)     # (addr, size) of mapped pages
    blocks: list[tuple[int, int, int]] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    pool: tuple[int, int] = DEFAULT_POOL  # the private pool that held it

    def as_segments(self) -> list[StartSegment]:
        """Each mapped run as a fixed segment (when the range cannot be rebuilt as one)."""
        out = []
        for addr, size in self.runs:
            seg = StartSegment(addr, size, self.stream, self.is_small, pool=self.pool)
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
    # Ids of blocks live when recording began whose free still waits at the end (active_pending_free in the
    # final segments): requested before recording began, or in the trace, whose pass leaves a start block's
    # request out. The replay requests them before the first event, so that they end as PyTorch's did.
    pending_frees: list[int] = field(default_factory=list)
    # The private pools to make before the start segments are restored, in the replay's order (index 1 on):
    # the trace's pools, then those only the start state holds. Empty where no start segment is in one.
    pools: list[tuple[int, int]] = field(default_factory=list)

    def order_pools(self, trace_pools: Mapping[tuple[int, int], int]) -> None:
        """Sets `pools` from the trace's pool ids and their indices (TracePass.pool_ids)."""
        if all(seg.pool == DEFAULT_POOL for seg in [*self.segments, *self.ranges]):
            return
        self.pools = [pid for pid, _ in sorted(trace_pools.items(), key=lambda item: item[1]) if pid != DEFAULT_POOL]
        for seg in [*self.segments, *self.ranges]:
            if seg.pool != DEFAULT_POOL and seg.pool not in self.pools:
                self.pools.append(seg.pool)

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
                f"{self.live_blocks} live blocks, {fmt_size(self.requested)} requested in "
                f"{fmt_size(self.reserved)} reserved")


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


def rebuild_start_state(snapshot: dict, b: TracePass, bad_entry: Callable[[int, str], None]) -> tuple[StartState, int]:
    """Segments and live blocks when recording began, from the pass and the final segments, and the highest
    address the final segments reach. A final segment that contradicts the trace goes to `bad_entry` (entry, what)."""
    # addr -> [size, stream, is_small, expandable, pool]: the segments that existed when recording began
    start_segments: dict[int, list] = {a: [s, st, s == SMALL_SEGMENT, False, b.start_pools.get(a, DEFAULT_POOL)]
                                       for a, (s, st) in b.start_segments.items()}
    final, highest = _read_final_segments(snapshot, b, bad_entry, start_segments)
    _add_start_runs(start_segments, final, b)
    _report_unmatched(final, b, bad_entry)

    state = StartState()
    order, by_addr, expandable_runs = _start_segments_by_addr(start_segments)
    blocks = _blocks_live_at_start(b, final.survivors)
    _place_start_blocks(state, blocks, order, by_addr, expandable_runs, final.pending_at_end, b, bad_entry)
    capacity = _card_capacity(b, start_segments)
    ranges = _group_expandable_runs(expandable_runs, by_addr, capacity)
    _lower_bases(ranges, b, capacity)
    if capacity is not None:
        fit_between(ranges, capacity)
    state.segments = [by_addr[a] for a in order if a in by_addr]
    state.ranges = ranges
    return state, highest


@dataclass(frozen=True)
class _FinalSegments:
    """What the final segments tell of the start, checked against the trace's pass (filled as they are read)."""

    # addr -> (size, requested): live at start and at the end
    survivors: dict[int, tuple[int, int]] = field(default_factory=dict)
    # survivors whose free waits on other streams (active_pending_free)
    pending_at_end: set[int] = field(default_factory=set)
    # addr -> (size, entry index): segments the trace makes and never frees, not yet met in the final segments
    still_made: dict[int, tuple[int, int]] = field(default_factory=dict)
    final_mapped: _Ranges = field(default_factory=_Ranges)  # the final expandable pages (the start's: _add_start_runs)
    # range start -> (stream, is_small, pool), expandable
    pool_of: dict[int, tuple[int, bool, tuple[int, int]]] = field(default_factory=dict)
    # addr -> id: blocks the trace leaves live, not yet met in the final segments
    live_at_end: dict[int, int] = field(default_factory=dict)


def _read_final_segments(snapshot: dict, b: TracePass, bad_entry: Callable[[int, str], None],
                         start_segments: dict[int, list]) -> tuple[_FinalSegments, int]:
    """Reads the final segments against the pass, adding the start segments they show; the highest address reached."""
    final = _FinalSegments(still_made=dict(b.segments), live_at_end=dict(b.live))
    segments = snapshot.get("segments")
    if not isinstance(segments, list):
        raise TraceError(f"{b.name}: no segments list")
    highest = 0
    for n, seg in enumerate(segments):
        highest = max(highest, _read_final_segment(seg, f"{b.name}: segment {n}", b, bad_entry, start_segments, final))
    return final, highest


def _read_final_segment(seg: object, where: str, b: TracePass, bad_entry: Callable[[int, str], None],
                        start_segments: dict[int, list], final: _FinalSegments) -> int:
    """Reads one final segment and its blocks into `final` and `start_segments`; its end, 0 for another device's."""
    if not isinstance(seg, dict):
        raise TraceError(f"{where}: not a segment (expected a dict)")
    if seg.get("device", b.device) != b.device:
        return 0
    addr, size = int_field(seg, "address", where), int_field(seg, "total_size", where)
    blocks = seg.get("blocks")
    if not isinstance(blocks, list):
        raise TraceError(f"{where}: blocks must be a list")
    made = final.still_made.pop(addr, None)
    if made is not None and made[0] != size and not seg.get("is_expandable"):
        bad_entry(made[1], f"segment_alloc of {made[0]} bytes at 0x{addr:x}, but the final segments give {size}")
    expandable = bool(seg.get("is_expandable"))
    stream = int_field(seg, "stream", where) if "stream" in seg else 0
    if expandable:  # its pages mapped at the start are found below, from all the maps and unmaps
        final.final_mapped.add(addr, size)
        final.pool_of[addr] = (stream, seg.get("segment_type") == "small",
                               pool_id_field(seg.get("segment_pool_id")) or DEFAULT_POOL)
    elif made is None:
        start_segments[addr] = [size, stream, seg.get("segment_type") == "small", False,
                                pool_id_field(seg.get("segment_pool_id")) or DEFAULT_POOL]
    for k, block in enumerate(blocks):
        _read_final_block(block, f"{where} block {k}", made, b, bad_entry, final)
    return addr + size


def _read_final_block(block: object, bwhere: str, made: tuple[int, int] | None, b: TracePass,
                      bad_entry: Callable[[int, str], None], final: _FinalSegments) -> None:
    """Reads one block of a final segment: a live one the trace never allocates survives from the start."""
    if not isinstance(block, dict):
        raise TraceError(f"{bwhere}: not a block (expected a dict)")
    baddr = int_field(block, "address", bwhere)
    state = block.get("state")
    if state not in LIVE_STATES:
        return
    if final.live_at_end.pop(baddr, None) is not None:
        return
    if baddr in b.seen:
        bad_entry(len(b.events), f"the final segments show 0x{baddr:x} allocated, but the trace frees it last")
        return
    if made is not None:
        bad_entry(made[1], f"the final segments show 0x{baddr:x} allocated in a segment the trace made, "
                             "but the trace never allocates it")
        return
    final.survivors[baddr] = (int_field(block, "size", bwhere), int_field(block, "requested_size", bwhere)
                              if "requested_size" in block else 0)
    if state == "active_pending_free":
        final.pending_at_end.add(baddr)


def _add_start_runs(start_segments: dict[int, list], final: _FinalSegments, b: TracePass) -> None:
    """Adds to `start_segments` the expandable pages mapped at the start, one entry per run."""
    # Expandable segments: the pages mapped at the start are the final ones with the trace's maps
    # undone backwards. Each run's stream and pool are those of the first unmap that touches it (a
    # range given back during the trace may serve another stream's range later, at the same
    # addresses), else those of the final segment that still holds it.
    final_mapped = final.final_mapped
    for action, addr, size, stream in reversed(b.maps):
        (final_mapped.remove if action == "segment_map" else final_mapped.add)(addr, size)
    finals = sorted(final.pool_of)
    runs = final_mapped.runs()
    first_unmap = _first_unmaps(runs, b.maps, b.map_pools)
    for (start, end), first in zip(runs, first_unmap):
        k = bisect.bisect_right(finals, start) - 1
        stream, is_small, pool = first or (final.pool_of[finals[k]] if k >= 0
                                           else (0, (end - start) % LARGE_PAGE != 0, DEFAULT_POOL))
        start_segments[start] = [end - start, stream, is_small, True, pool]


def _report_unmatched(final: _FinalSegments, b: TracePass, bad_entry: Callable[[int, str], None]) -> None:
    """Sends to `bad_entry` each live block and each made segment of the trace that the final segments lack."""
    for addr, id_ in final.live_at_end.items():
        bad_entry(len(b.events), f"the trace allocates 0x{addr:x} and never frees it, but the final segments "
                                     "show no live block there")
    for addr, (_, i) in final.still_made.items():
        bad_entry(i, f"segment_alloc at 0x{addr:x}, a segment the trace never frees, is missing from the final segments")


def _start_segments_by_addr(start_segments: dict[int, list]) -> tuple[list[int], dict[int, StartSegment], list[int]]:
    """The start segments' addresses in order, each as a StartSegment, and those of the expandable runs."""
    order = sorted(start_segments)
    by_addr: dict[int, StartSegment] = {}
    expandable_runs: list[int] = []
    for addr in order:
        size, stream, is_small, expandable, pool = start_segments[addr]
        by_addr[addr] = StartSegment(addr, size, stream, is_small, pool=pool)
        if expandable:
            expandable_runs.append(addr)
    return order, by_addr, expandable_runs


def _blocks_live_at_start(b: TracePass,
                          survivors: dict[int, tuple[int, int]]) -> list[tuple[int, int, int, int | None]]:
    """(addr, size or 0 = infer, requested, trace id or None) of each block live at the start, by address."""
    blocks: list[tuple[int, int, int, int | None]] = [(a, 0, req, id_) for a, (id_, req, _) in b.freed_at_start.items()]
    blocks += [(a, size, req, None) for a, (size, req) in survivors.items()]
    blocks.sort()
    return blocks


def _place_start_blocks(state: StartState, blocks: list[tuple[int, int, int, int | None]], order: list[int],
                        by_addr: dict[int, StartSegment], expandable_runs: list[int], pending_at_end: set[int],
                        b: TracePass, bad_entry: Callable[[int, str], None]) -> None:
    """Puts each block live at the start, sized where the trace shows it and with an id, in its start segment."""
    next_id = b.next_id
    sizes = _sizes_from_later_allocs(blocks, order, by_addr, b, set(expandable_runs))
    for (addr, size, requested, id_), known in zip(blocks, sizes):
        size = size or known
        k = bisect.bisect_right(order, addr) - 1
        seg = by_addr.get(order[k]) if k >= 0 else None
        if seg is None or addr >= seg.addr + seg.size:
            entry = b.freed_at_start.get(addr, (0, 0, len(b.events)))[2]
            bad_entry(entry, f"a block at 0x{addr:x}, live when recording began, lies in no segment that existed then")
            continue
        if id_ is None:
            id_, next_id = next_id, next_id + 1
        seg.blocks.append((addr, size, requested))
        seg.ids.append(id_)
        if addr in pending_at_end:
            state.pending_frees.append(id_)


def _card_capacity(b: TracePass, start_segments: dict[int, list]) -> int | None:
    """The card's memory where the trace has an OOM, else None."""
    capacity = None
    if b.ooms:  # the card's memory: what PyTorch held at the first OOM plus what the card still had free
        held = sum(size for size, *_ in start_segments.values())
        capacity = held + b.ooms[0].reserved_delta + b.ooms[0].device_free
    return capacity


def _group_expandable_runs(expandable_runs: list[int], by_addr: dict[int, StartSegment],
                           capacity: int | None) -> list[StartRange]:
    """Takes the expandable runs out of `by_addr` and groups them into the start's expandable ranges."""
    # Mapped runs of one stream and pool that no run of another lies between belong to one expandable
    # range (two, where they span more than one range of the card, when an OOM tells its size), which
    # begins at the lowest address the recording maps in it while it lives.
    ranges: list[StartRange] = []
    for addr in expandable_runs:
        run = by_addr.pop(addr)
        last = ranges[-1] if ranges else None
        if (last is None or (last.stream, last.is_small, last.pool) != (run.stream, run.is_small, run.pool)
                or (capacity is not None and run.addr + run.size - last.base > _range_size(capacity, run.is_small))):
            ranges.append(StartRange(addr, run.stream, run.is_small, pool=run.pool))
        group = ranges[-1]
        group.runs.append((run.addr, run.size))
        group.blocks += run.blocks
        group.ids += run.ids
    return ranges


def _first_unmaps(runs: list[tuple[int, int]], maps: tuple[tuple[str, int, int, int], ...],
                  pools: tuple[tuple[int, int], ...]) -> list[tuple[int, bool, tuple[int, int]] | None]:
    """(stream, is_small, pool) of the first unmap that touches each of `runs` (sorted, disjoint), or None."""
    starts = [start for start, _ in runs]
    out: list[tuple[int, bool, tuple[int, int]] | None] = [None] * len(runs)
    left = len(runs)
    for (action, addr, size, stream), pool in zip(maps, pools):
        if action != "segment_unmap" or not left:
            continue
        k = max(0, bisect.bisect_right(starts, addr) - 1)
        while k < len(runs) and runs[k][0] < addr + size:
            if out[k] is None and addr < runs[k][1]:
                out[k] = (stream, size % LARGE_PAGE != 0, pool)
                left -= 1
            k += 1
    return out


def _range_size(capacity: int, is_small: bool) -> int:

    return range_size(capacity, SMALL_PAGE if is_small else LARGE_PAGE)


def fit_between(ranges: list[StartRange], capacity: int) -> None:
    """Lowers a start range's base, on its page grid, where its range (9/8 of the card) would reach the
    next start range: PyTorch's ranges never overlap, so its base lies at least that far below the next
    one's (and at or above the end of the one before; its pages mapped then stay inside it)."""
    ordered = sorted(ranges, key=lambda r: r.base)
    previous_end = 0
    for r, following in zip(ordered, [*ordered[1:], None]):
        page = SMALL_PAGE if r.is_small else LARGE_PAGE
        size = range_size(capacity, page)
        if following is not None and r.base + size > following.base:
            lowest = min(a for a, _ in r.runs)
            highest = max(a + n for a, n in r.runs)
            base = lowest - -(-(lowest - (following.base - size)) // page) * page
            if base >= previous_end and base + size >= highest:
                r.base = base
        previous_end = r.base + size


def rebase(ranges: list[StartRange], b: TracePass, capacity: int) -> None:
    """Places the start ranges again, now that the ranges' spacing tells the card (`capacity`): each base
    from its lowest page mapped at the start, lowered by the trace's maps as far as a range on that card
    reaches (_lower_bases). Without an OOM, the first placement knew no card, and took a map a whole
    range below a start range for that range's lower pages."""
    for r in ranges:
        r.base = min(a for a, _ in r.runs)
    _lower_bases(ranges, b, capacity)


def _lower_bases(ranges: list[StartRange], b: TracePass, capacity: int | None = None) -> None:
    """Lowers each start range's base to the lowest page the trace maps in it before giving it back.

    A map below a live start range of its stream and pool, with no other
    range's lowest page in between, is in that range (a range maps from its
    base up, so its pages below the start's are the first ones the trace
    maps there), unless a range based there could not reach the range's
    pages mapped at the start (9/8 of `capacity`, the card, where an OOM or
    the ranges' spacing tells it: rebase): then, as a map that opens a range of its own, it counts as
    one too (a stream keeps more than one range where a request did not fit
    the first). A range whose last pages are unmapped is given back (its
    addresses may serve another range later): a range the trace opens below
    it, with no live range between, lowers its base (_lower_given_back).
    """
    live = [[r.base, 0, (r.stream, r.is_small, r.pool), r] for r in ranges]  # [lowest page, -, key, StartRange or None]
    mapped = {id(x): sum(size for _, size in x[3].runs) for x in live}  # bytes mapped now
    gone: list[StartRange] = []  # start ranges given back
    for (action, addr, size, stream), pool in zip(b.maps, b.map_pools):
        below = [x for x in live if x[0] <= addr]
        owner = max(below, key=lambda x: x[0]) if below else None
        if action == "segment_unmap":
            if owner is not None:
                mapped[id(owner)] = mapped.get(id(owner), 0) - size
                if mapped[id(owner)] <= 0:
                    live.remove(owner)
                    if isinstance(owner[3], StartRange):
                        gone.append(owner[3])
            continue
        key = (stream, size % LARGE_PAGE != 0, pool)
        if owner is not None and owner[2] == key:
            mapped[id(owner)] = mapped.get(id(owner), 0) + size
            continue
        above = [x for x in live if x[0] > addr]
        nearest = min(above, key=lambda x: x[0]) if above else None
        if nearest is not None and nearest[2] == key and isinstance(nearest[3], StartRange) \
                and (capacity is None or _reaches(addr, nearest[3], capacity)):
            nearest[0] = nearest[3].base = addr  # the start range's pages below those mapped at the start
            mapped[id(nearest)] = mapped.get(id(nearest), 0) + size
            continue
        fresh = [addr, 0, key, None]  # a range the trace opens
        live.append(fresh)
        mapped[id(fresh)] = size
        _lower_given_back(gone, addr, nearest[0] if nearest is not None else None, capacity)


def _lower_given_back(gone: list[StartRange], addr: int, next_live: int | None, capacity: int | None) -> None:
    """The first range the trace opens after start ranges were given back, at `addr`: below one of them, with
    no live range between, it took the hole that start range left (the driver reserves the lowest hole that
    fits), so that range's base lies at or above `addr`, and is lowered to it (ranges lie side by side where
    the driver reserves them in turn). Later ranges may have taken other holes: they lower none."""
    above = [r for r in gone if r.base > addr and (next_live is None or r.base < next_live)
             and (r.base - addr) % (SMALL_PAGE if r.is_small else LARGE_PAGE) == 0  # its pages on its grid
             and (capacity is None or _reaches(addr, r, capacity))]
    if above:
        min(above, key=lambda r: r.base).base = addr
    gone.clear()  # the holes left so far were there for this range: a later one tells less


def _reaches(base: int, r: StartRange, capacity: int) -> bool:
    """Whether a range based at `base` on a card of `capacity` bytes holds every page `r` mapped at the start."""
    return max(a + n for a, n in r.runs) - base <= _range_size(capacity, r.is_small)


def _sizes_from_later_allocs(blocks: list, order: list[int], by_addr: dict, b: TracePass,
                             expandable: set[int]) -> list[int]:
    """Exact sizes of blocks live at the start and freed later, where the trace shows them (0 elsewhere).

    At the start, the space after such a block X, up to the next live block,
    is one free block beginning where X ends. An allocation always takes the
    beginning of the free block it is given, so the first allocation the
    trace places in that space while X is still live sits exactly at X's end.
    In an expandable range, an unmap in that space (a release of the free
    pages after X) cuts the free block: there the trace does not show X's end.
    """
    allocs = sorted(b.allocs)
    alloc_addrs = [a for a, _ in allocs]
    unmaps = [(addr, addr + size) for action, addr, size, _ in b.maps if action == "segment_unmap"]
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
        freed_at = b.freed_at_start[addr][2] if addr in b.freed_at_start else len(b.events)
        first = None
        for j in range(bisect.bisect_right(alloc_addrs, addr), bisect.bisect_left(alloc_addrs, limit)):
            a, i = allocs[j]
            if i < freed_at and (first is None or i < first[1]):
                first = (a, i)
        if first and seg is not None and seg.addr in expandable and any(
                lo < first[0] and addr < hi for lo, hi in unmaps):
            first = None  # pages between X and the allocation were released: the rules size X instead
        out.append(first[0] - addr if first else 0)
    return out


def fix_block_sizes(start: StartState, conf: str, where: str, skip: bool) -> int:
    """Fixes the sizes still unknown (0) by the recorded settings' rules, once: a replay under
    other settings must start from the blocks the recorded ones made.

    A segment whose blocks the rules cannot place raises TraceError naming
    `where` ("FILE: device D"); with `skip` its blocks are dropped instead,
    and the count of such segments is returned.
    """
    dropped = 0

    for r in list(start.ranges):
        runs_end = max(a + size for a, size in r.runs)
        capacity = max(runs_end - r.base, sum(size for _, size in r.runs)) + LARGE_PAGE
        probe = _core.Replayer(capacity, 0, conf)
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
        probe = _core.Replayer(seg.size + SMALL_PAGE, 0, conf)
        try:
            probe.restore(seg.addr, seg.size, seg.stream, seg.is_small, seg.blocks, seg.ids)
        except ValueError as exc:
            if not skip:
                raise TraceError(f"{where}: the state when recording began: {exc}") from None
            dropped += 1
            seg.blocks, seg.ids = [], []
            continue
        sizes = {blk["address"]: blk["size"] for s in probe.segments() for blk in s["blocks"] if blk["allocated"]}
        seg.blocks = [(addr, sizes[addr], requested) for addr, _, requested in seg.blocks]
    return dropped
