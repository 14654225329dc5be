"""Expandable ranges reserved before recording began and never mapped, rebuilt into the start state.

Note [Ranges kept unmapped from before recording]
A request that fails keeps the range it reserved, unmapped (Note
[Expandable ranges in a snapshot]), and PyTorch gives a range back only
when a release unmaps its last page. So when recording begins a range may
hold no page at all: nothing in the trace frees or unmaps in it, and the
start state (start_state.py) cannot see it. A later request of its stream
and pool maps there first, as find_expandable_block takes the unmapped
blocks in address order. The trace shows it as a map that opens a range at
a base while a range of that stream and pool above the base had room for
the request (range_room.py): PyTorch would have mapped there, had nothing
lain below. `kept_ranges()` adds such a range, unmapped, at the map's
base. Where a request of that stream and pool failed earlier in the trace,
the range may be the one that request reserved (failure_offers places it
then), and none is added; nor where a whole range at that base would
overlap a range live then.
"""
from __future__ import annotations

from torchmem.replay.range_room import ALLOCATING, SMALL_REQUEST, RangeRoom
from torchmem.replay.start_state import StartRange, StartState
from torchmem.replay.trace_pass import DEFAULT_POOL, TracePass
from torchmem.formats.trace_types import FAILED_ALLOC, SURVIVED_FAILED_ALLOC


def kept_ranges(b: TracePass, start: StartState, capacity: int, large_page: int, conf: str) -> list[StartRange]:
    """The ranges of the Note above, in trace order: each unmapped, based where the trace first maps in it."""
    room = RangeRoom(b, start, capacity, large_page, conf)
    if not room.ok:
        return []
    cols = b.events
    pools = {index: pool for pool, index in b.pool_ids.items()}
    failed = [(pos, room.request_key(pos)) for pos, op in enumerate(cols.ops) if op in (FAILED_ALLOC, SURVIVED_FAILED_ALLOC)]
    out = []
    for pos, (action, addr, _, stream, pool) in sorted(room.maps.items()):
        room.advance(pos)
        request = _request_after(cols.ops, pos)
        if action != "segment_map" or room.range_at(addr) is not None or request is None:
            continue
        small = cols.sizes[request] <= SMALL_REQUEST
        key = (pool, stream, small)
        if any(at < pos and k == key for at, k in failed):
            continue
        placed = room.request(pos, cols.sizes[request], stream)
        end = addr + room.sizes[small]
        if placed is None or placed.base is None or placed.base < addr or \
                any(r.base < end and addr < r.end for r in room.ranges):
            continue
        room.keep(addr, key)
        out.append(StartRange(addr, stream, small, pool=pools.get(pool, DEFAULT_POOL)))
    return out


def _request_after(ops: tuple[int, ...], pos: int) -> int | None:
    """The position of the request a map at `pos` served: the next allocation or failed one."""
    return next((k for k in range(pos + 1, len(ops)) if ops[k] in ALLOCATING), None)
