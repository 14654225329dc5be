"""Where a request of an expandable stream would map, at any event of a trace: its ranges, block by block.

Note [Where a request of an expandable stream maps]
With expandable_segments:True a request that finds no free block maps
pages (PyTorch's try_allocate_expandable_block; the core's
CachingAllocator::allocate_expandable makes the same choice).
find_expandable_block takes the unmapped blocks of the request's stream
and pool in address order (BlockPool.unmapped); each may start one block
lower, where the block below it is free. The first whose run of free and
unmapped bytes holds the request is the candidate. With no candidate a new
range is reserved (a request larger than a range reserves one at each
attempt, before and after the cache's release).

The trace shows the maps and unmaps, and the live blocks. An alloc entry
holds the bytes asked for, not the block's size; under expandable segments
a block is always split off the start of its free block (should_split: any
remainder of min_block_size or more), so its size is PyTorch's round_size
of those bytes (_core.rules.round_sizes, from the core). `RangeRoom` takes
each live block at that size, and a start block at the size the start state
gives it. A block whose free waits on an event counts as live until its
free completes. The candidate then maps the unmapped pages under what the
request still lacks: from the free block below it, each unmapped gap up to
the rest in whole pages, each free block above a gap taken as it is
(allocate_expandable). `Placement.map_bytes` is that sum: what the request
asked of the card. `RangeRoom` is the one walk of a trace's maps:
expandable_ranges.py reads the ranges live at each failure and those the
maps open, and the ranges a failure would have reserved; kept_ranges.py
the ranges a request passed over; memory_limit.py the bytes, to tell the
card's refusal from the memory fraction's.
"""
from __future__ import annotations

import bisect
from typing import NamedTuple

from torchmem import _core
from torchmem.replay.capacity import SMALL_PAGE, range_size
from torchmem.replay.start_state import StartRange, StartState
from torchmem.replay.trace_pass import TracePass
from torchmem.formats.trace_types import (ALLOC, FAILED_ALLOC, FREE, FREE_AT_SYNC, POOL, RELEASE_SEGMENT, SEGMENT_ADDRESS,
                                  SURVIVED_FAILED_ALLOC)

SMALL_REQUEST = _core.rules.SMALL_SIZE  # requests up to 1 MiB use the small pool
ALLOCATING = (ALLOC, FAILED_ALLOC, SURVIVED_FAILED_ALLOC)  # ops that settle the device's offers (Replayer::allocate)


def map_events(b: TracePass) -> list[tuple[int, str, int, int, int, int]] | None:
    """(position, action, addr, size, stream, pool) of every map and unmap, in trace order; None when the
    events and b.maps are out of step (skipped bad entries)."""
    cols = b.events
    pools = request_pools(cols.ops, cols.ids)
    out = []
    k = 0
    for pos, op in enumerate(cols.ops):
        if op == SEGMENT_ADDRESS and cols.sizes[pos] == 0:
            if k >= len(b.maps) or b.maps[k][0] != "segment_map" or b.maps[k][1] != cols.addrs[pos]:
                return None
        elif op == RELEASE_SEGMENT:
            if k >= len(b.maps) or b.maps[k][0] != "segment_unmap" or b.maps[k][1] != cols.addrs[pos]:
                continue  # a fixed segment's segment_free
        else:
            continue
        action, addr, size, stream = b.maps[k]
        k += 1
        out.append((pos, action, addr, size, stream, pools[pos]))
    return out if k == len(b.maps) else None


def request_pools(ops: list[int], ids: list[int]) -> list[int]:
    """The replay's pool of the request each event belongs to: a map's is the request after it (the
    trace enters a request's pool at the request, after the maps it made)."""
    now, at_request = 0, []
    for op, id_ in zip(ops, ids):
        if op == POOL:
            now = id_
        at_request.append(now)
    out = [0] * len(ops)
    following = at_request[-1] if ops else 0
    for pos in range(len(ops) - 1, -1, -1):
        if ops[pos] in ALLOCATING:
            following = at_request[pos]
        out[pos] = following
    return out


class _Range:
    """One expandable range: its bounds, key and mapped runs ([lo, hi), sorted, disjoint)."""

    def __init__(self, base: int, end: int, key: tuple[int, int, bool]) -> None:
        self.base, self.end, self.key = base, end, key
        self.runs: list[list[int]] = []

    def map(self, lo: int, hi: int) -> None:
        self.runs.append([lo, hi])
        self.runs.sort()
        merged: list[list[int]] = []
        for run in self.runs:
            if merged and run[0] <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], run[1])
            else:
                merged.append(run)
        self.runs = merged

    def unmap(self, lo: int, hi: int) -> None:
        out = []
        for a, b in self.runs:
            out += [[a, min(b, lo)]] if a < lo else []
            out += [[max(a, hi), b]] if b > hi else []
        self.runs = [run for run in out if run[0] < run[1]]

    def gaps(self) -> list[tuple[int, int]]:
        """The unmapped blocks: [lo, hi) between and after the mapped runs."""
        out, at = [], self.base
        for a, b in self.runs:
            if a > at:
                out.append((at, a))
            at = max(at, b)
        return out + ([(at, self.end)] if at < self.end else [])


class Placement(NamedTuple):
    """Where a request would map."""

    # the ranges it would reserve, and keep unmapped where its maps fail: none where a range had room; one
    # where none had; two where it is larger than a range
    new_ranges: int
    # the bytes its maps would take from the card (Note above); None where it is larger than a range
    map_bytes: int | None
    # the base of the range it would map in; None where it reserves one
    base: int | None = None


class RangeRoom:
    """The expandable ranges and live blocks of a pass, walked event by event (Note above).

    `ok` is False where the maps and events are out of step (skipped bad
    entries): then request() answers None.
    """

    def __init__(self, b: TracePass, start: StartState, capacity: int, large_page: int, conf: str) -> None:
        events = map_events(b)
        self.conf = conf
        self.ok = events is not None
        self.cols = b.events
        self.pools = request_pools(self.cols.ops, self.cols.ids)
        self.large_page = large_page
        self.sizes = {True: range_size(capacity, SMALL_PAGE), False: range_size(capacity, large_page)}
        self.ranges = [_start_range(r, b, self.sizes[r.is_small]) for r in start.ranges]
        self.live = {id_: (addr, size) for r in start.ranges for id_, (addr, size, _) in zip(r.ids, r.blocks)}
        self.maps = {pos: (action, addr, size, stream, pool) for pos, action, addr, size, stream, pool in events or []}
        self.pos = 0  # the events before it are walked
        self.opened: list[tuple[int, int, tuple[int, int, bool]]] = []  # (position, base, key): ranges maps opened

    def advance(self, pos: int) -> None:
        """Walks the events before `pos`."""
        cols = self.cols
        for k in range(self.pos, pos):
            if k in self.maps:
                action, addr, size, stream, pool = self.maps[k]
                r = self.range_at(addr)
                if action == "segment_map":
                    if r is None:
                        key = (pool, stream, size < self.large_page)
                        r = _Range(addr, addr + self.sizes[key[2]], key)
                        self.ranges.append(r)
                        self.opened.append((k, addr, key))
                    r.map(addr, addr + size)
                elif r is not None:
                    r.unmap(addr, addr + size)
                    if not r.runs:  # none of its pages mapped: PyTorch gives the range back
                        self.ranges.remove(r)
            elif cols.ops[k] == ALLOC:
                self.live[cols.ids[k]] = (cols.addrs[k], cols.sizes[k])
            elif cols.ops[k] in (FREE, FREE_AT_SYNC):
                self.live.pop(cols.ids[k], None)
        self.pos = max(self.pos, pos)

    def request_key(self, pos: int) -> tuple[int, int, bool]:
        """The (pool, stream, is_small) of the request at event `pos`: the ranges it may map in."""
        return (self.pools[pos], self.cols.streams[pos], self.cols.sizes[pos] <= SMALL_REQUEST)

    def keep(self, base: int, key: tuple[int, int, bool]) -> None:
        """Adds a range no page of which is mapped (kept_ranges.py)."""
        self.ranges.append(_Range(base, base + self.sizes[key[2]], key))

    def range_at(self, addr: int) -> _Range | None:
        return next((r for r in self.ranges if r.base <= addr < r.end), None)

    def request(self, pos: int, size: int, stream: int) -> Placement | None:
        """Where a request of `size` bytes on `stream`, in the pool in force at event `pos`, would map now."""
        if not self.ok:
            return None
        small = size <= SMALL_REQUEST
        mine = sorted((r for r in self.ranges if r.key == (self.pools[pos], stream, small)), key=lambda r: r.base)
        inside = [(a, n) for a, n in self.live.values() if any(r.base <= a < r.end for r in mine)]
        rounded = _core.rules.round_sizes([n for _, n in inside] + [size], self.conf)
        blocks = sorted((a, a + n) for (a, _), n in zip(inside, rounded))
        return _placement(mine, blocks, rounded[-1], self.sizes[small], SMALL_PAGE if small else self.large_page)


def oom_placements(b: TracePass, start: StartState, capacity: int, large_page: int,
                   conf: str) -> list[Placement | None]:
    """For each OOM of the pass (b.ooms, in order): where its request would have mapped at the failure; None
    where the trace does not tell (RangeRoom.ok). `conf`: the recorded settings, which round the blocks."""
    room = RangeRoom(b, start, capacity, large_page, conf)
    out = []
    for o in b.ooms:
        room.advance(o.index)
        out.append(room.request(o.index, o.size, o.stream))
    return out


def _start_range(r: StartRange, b: TracePass, size: int) -> _Range:
    out = _Range(r.base, r.base + size, (b.pool_ids.get(r.pool, 0), r.stream, r.is_small))
    for addr, length in r.runs:
        out.map(addr, addr + length)
    return out


def _placement(ranges: list[_Range], blocks: list[tuple[int, int]], size: int, range_bytes: int,
               page: int) -> Placement:
    """find_expandable_block's candidate for a request of `size` bytes (rounded) among `ranges` (in address
    order), `blocks` the live blocks in them ([start, end), sorted), and what it maps; else how many ranges the
    request reserves, and the pages of a new one."""
    starts = [a for a, _ in blocks]
    for r in ranges:
        for lo, _ in r.gaps():
            k = bisect.bisect_right(blocks, (lo, lo)) - 1  # the last block starting below lo
            below = max(blocks[k][1] if k >= 0 and blocks[k][1] <= lo else r.base, _run_start(r, lo))
            k = bisect.bisect_left(starts, lo)  # the first block above lo
            above = min(starts[k], r.end) if k < len(starts) else r.end
            if above - below >= size:  # the free block below joins
                return Placement(0, _map_bytes(r, starts, lo - below, lo, size, page), r.base)
    if size > range_bytes:
        return Placement(2, None)
    return Placement(1, -(-size // page) * page)


def _run_start(r: _Range, lo: int) -> int:
    """Where the mapped run ending at `lo` starts (`lo` where none does)."""
    return max((a for a, end in r.runs if end == lo), default=lo)


def _map_bytes(r: _Range, starts: list[int], covered: int, lo: int, size: int, page: int) -> int:
    """The bytes a request of `size` maps from the gap at `lo` on, with `covered` free bytes below it: each gap
    up to what it still lacks, in whole pages; the free bytes above a gap, to the next block or gap, count."""
    mapped = 0
    gaps = [g for g in r.gaps() if g[0] >= lo]
    for n, (glo, ghi) in enumerate(gaps):
        take = min(-(-(size - covered) // page) * page, ghi - glo)
        mapped, covered = mapped + take, covered + take
        if covered >= size:
            break
        k = bisect.bisect_left(starts, ghi)
        following = min(starts[k] if k < len(starts) else r.end, gaps[n + 1][0] if n + 1 < len(gaps) else r.end)
        covered += following - ghi
        if covered >= size:
            break
    return mapped
