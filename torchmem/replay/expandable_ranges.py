"""Where PyTorch's expandable segments reserved their address ranges, as a snapshot shows it.

Note [Expandable ranges in a snapshot]
With expandable_segments:True, PyTorch (2.11 and 2.14.1, checked on the
fake GPU) reserves one address range per private pool, stream and pool
kind (small or large) when no range it has can take a request
(find_expandable_block): 9/8 of the card, rounded up to the page (2 MiB
small, large_segment_size large). It maps pages from the lowest address a
request fits at, and gives a range back only when a release leaves none of
its pages mapped. A snapshot records no reservation, only the maps: the
first map into a range is at its base. Two things follow for a replay:

- A request that fails reserves a range too (each attempt that finds no
  room: one before and one after the cache is released), and that range,
  never mapped, is kept. A later request of the same stream and pool maps
  its first pages there, at an address the replay cannot have reserved
  then: the replay's range was reserved at the failure, before the trace
  showed where. `failure_offers()` finds, for each failed request, the
  bases of the ranges of its stream and pool that the trace maps first
  later; snapshot_trace.py places them just before the request as
  RANGE_OFFER events, so that a range the replay reserves at the failure
  lands where PyTorch's did. The replayer does not count an offer the
  failure leaves as a recorded address missed (kRangeOffer, replayer.h).
- A range that existed when recording began may be given back during the
  trace and its addresses reused by another stream's range; the start state
  groups the pages mapped then by the range that held them at that moment
  (start_state.py).

A failed request reserves that range only where the memory fraction let it
ask the card. Where no range had room for it (range_room.py), it reserves
one, or two when it is larger than a range. The trace can show each at a
base free at the failure that a later request maps first. Where it shows
fewer than the request reserved, one stays unmapped, and has room for any
later request of its stream and pool. So a later range reserved anew (not
at a base some failure may have reserved) shows the failure reserved none:
the fraction refused it (FailureOffers.unreserved, memory_limit.py).
"""
from __future__ import annotations

from types import MappingProxyType
from typing import Mapping, NamedTuple

from torchmem.replay.range_room import ALLOCATING, RangeRoom, map_events
from torchmem.replay.start_state import StartState
from torchmem.replay.trace_pass import TracePass
from torchmem.formats.trace_types import FAILED_ALLOC, RELEASE_SEGMENT, SEGMENT_ADDRESS, SURVIVED_FAILED_ALLOC


def _overlaps(ranges: list[tuple[int, int]], base: int, end: int) -> bool:
    return any(lo < end and base < hi for lo, hi in ranges)


class FailureOffers(NamedTuple):
    """The range bases to offer before failed requests, and the floor for fresh ranges."""

    offers: list[tuple[int, list[tuple[int, int]]]]  # (position of the failed request, [(base, stream)])
    floor: int  # fresh addresses start above it: every recorded range's end (0: no floor)
    # positions of failed requests that reserved no range, as the later ranges show (the Note above)
    unreserved: tuple[int, ...] = ()


NO_OFFERS = FailureOffers([], 0)


def failure_offers(b: TracePass, start: StartState, capacity: int | None, large_page: int, conf: str,
                   reserves: Mapping[int, int] = MappingProxyType({})) -> FailureOffers:
    """The range bases a failed request may reserve (Note [Expandable ranges in a snapshot]).

    For each failed request of the pass's events, the bases of the ranges of
    its stream and pool that the trace maps first later, each to be offered
    just before it. Nothing when the card's size is not known (`capacity`
    None) or no request failed. `conf`: the recorded settings (RangeRoom).
    `reserves`: how many ranges each failed request (by position) would have
    reserved (range_room.Placement.new_ranges), from which `unreserved`
    follows.
    """
    cols = b.events
    if capacity is None or not any(op in (FAILED_ALLOC, SURVIVED_FAILED_ALLOC) for op in cols.ops):
        return NO_OFFERS
    room = RangeRoom(b, start, capacity, large_page, conf)
    if not room.ok:
        return NO_OFFERS  # out of step with the trace (skipped bad entries): offer nothing
    failures: list[tuple[int, tuple[int, int, bool], list[tuple[int, int]]]] = []  # (position, key, ranges then)
    for pos, op in enumerate(cols.ops):
        if op in (FAILED_ALLOC, SURVIVED_FAILED_ALLOC):
            room.advance(pos)
            failures.append((pos, room.request_key(pos), [(r.base, r.end) for r in room.ranges]))
    room.advance(len(cols.ops))
    fresh: dict[tuple[int, int, bool], list[tuple[int, int]]] = {}  # key -> (position of the first map, base)
    for pos, base, key in room.opened:
        fresh.setdefault(key, []).append((pos, base))
    # A range the replay reserves where nothing was offered (one a failed request reserved and the
    # trace never maps) takes fresh addresses above the floor: above every recorded range's end, so
    # that it never stands where a recorded range is reserved later.
    sizes = room.sizes
    ends = [base + sizes[key[2]] for _, base, key in room.opened]
    floor = max([0, *ends, *(r.end for r in room.ranges)])
    inserts: list[tuple[int, list[tuple[int, int]]]] = []  # (position, [(base, stream)])
    placed: dict[tuple[int, int, bool], list[tuple[int, list[int] | None]]] = {}  # key -> (position, bases)
    for pos, key, live_then in failures:
        if _offer_pending(cols.ops, cols.sizes, pos):
            placed.setdefault(key, []).append((pos, None))  # it may place any one range the trace opens
            continue  # a recorded map waits for this request: its address is the one to take
        later = [base for first, base in fresh.get(key, []) if first > pos]
        offers = [base for base in later if not _overlaps(live_then, base, base + sizes[key[2]])][:3]
        if offers:
            inserts.append((pos, [(base, key[1]) for base in offers]))
        placed.setdefault(key, []).append((pos, _distinct(offers, sizes[key[2]])))
    unreserved = [pos for key, openings in fresh.items()
                  for pos in _unreserved(openings, placed.get(key, []), reserves)]
    return FailureOffers(inserts, floor, tuple(sorted(set(unreserved))))


def _distinct(bases: list[int], size: int) -> list[int]:
    """The bases that can place ranges of `size` bytes, each clear of those placed before it."""
    placed: list[int] = []
    for base in bases:
        if all(base + size <= other or other + size <= base for other in placed):
            placed.append(base)
    return placed


def _unreserved(openings: list[tuple[int, int]], placed: list[tuple[int, list[int] | None]],
                reserves: Mapping[int, int]) -> list[int]:
    """The failures of one stream and pool that reserved no range (Note above).

    `openings`: (position, base) of each range the trace opens; `placed`:
    (position, distinct bases offered, or None for any one) of each failure.
    An opening at a base offered to an earlier failure may be the range it
    reserved, each base once. Any other is a range reserved anew, where no
    range had room: so each earlier failure that would have kept a range at
    no offered base (reserves, more than its bases) kept none.
    """
    left = [(pos, None if bases is None else list(bases)) for pos, bases in placed]
    out: list[int] = []
    for at, base in openings:
        before = [(pos, bases) for pos, bases in left if pos < at]
        owner = next((k for k, (_, bases) in enumerate(before) if bases is not None and base in bases), None)
        if owner is None:
            owner = next((k for k, (_, bases) in enumerate(before) if bases is None), None)
        if owner is not None:
            pos, bases = before[owner]
            if bases is None:
                left.remove((pos, None))
            else:
                bases.remove(base)
            continue
        out += [pos for pos, bases in placed if pos < at and bases is not None and reserves.get(pos, 0) > len(bases)]
    return out


def _offer_pending(ops: list[int], sizes: list[int], pos: int) -> bool:
    """Whether a recorded range address is offered after the last request before `pos`, and no release
    after it: a map before the request's own release was its first try (Note [A failed map's own
    release], trace_pass.py), and the try after the release may reserve a range anew."""
    for k in range(pos - 1, -1, -1):
        if ops[k] in ALLOCATING or ops[k] == RELEASE_SEGMENT:
            return False
        if ops[k] == SEGMENT_ADDRESS:
            return True
    return False


def recorded_ranges(b: TracePass, start: StartState, large_page: int) -> list[tuple[int, bool, int | None]]:
    """Each expandable range the recording shows, without the card's size: (base, is_small, next base).

    `next base` is the lowest base of a range that lived at the same time
    above it (None when no such range was seen), which bounds the range's
    size (capacity.expandable_capacity). A map belongs to the live range
    nearest below it when that range is of its private pool, stream and pool
    kind, else it
    opens a range there (ranges map from their lowest page up); an unmap to
    the live range nearest below it. A range whose last pages are unmapped is
    given back, and its addresses may serve another range later.
    """
    live: list[list] = []  # [base, (pool, stream, is_small), mapped bytes, index into out]
    out: list[list] = []   # [base, is_small, next base]

    def open_range(base: int, key: tuple[int, int, bool], mapped: int) -> None:
        below = [r for r in live if r[0] < base]
        above = [r[0] for r in live if r[0] > base]
        out.append([base, key[2], min(above, default=None)])
        if below:
            lower = out[max(below, key=lambda r: r[0])[3]]
            lower[2] = base if lower[2] is None else min(lower[2], base)
        live.append([base, key, mapped, len(out) - 1])

    for r in sorted(start.ranges, key=lambda r: r.base):
        open_range(r.base, (b.pool_ids.get(r.pool, r.pool), r.stream, r.is_small), sum(s for _, s in r.runs))
    for _, action, addr, size, stream, pool in map_events(b) or []:
        below = [r for r in live if r[0] <= addr]
        owner = max(below, key=lambda r: r[0]) if below else None
        if action == "segment_map":
            key = (pool, stream, size < large_page)
            if owner is None or owner[1] != key:
                open_range(addr, key, size)
            else:
                owner[2] += size
        elif owner is not None:
            owner[2] -= size
            if owner[2] <= 0:
                live.remove(owner)
    return [(base, small, nxt) for base, small, nxt in out]
