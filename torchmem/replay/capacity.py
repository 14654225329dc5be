"""The card's capacity, as far as a snapshot without an OOM tells it.

With expandable segments, PyTorch reserves for each stream and pool one
address range of 9/8 of the card (rounded up to the pool's page: 2 MiB for
the small pool, 20 MiB for the large one) and maps pages into it from its
start. A replay offers each range its recorded address (Note [Recorded
addresses]), so the simulated ranges must not be larger than the recorded
ones: a range 9/8 of an 80 GiB default spans the next range recorded on a
24 GiB card, which then lands elsewhere and every placement after differs.

`expandable_capacity()` takes each recorded range's base and the lowest
base of a range that lived above it at the same time
(expandable_ranges.recorded_ranges) and gives the largest capacity whose
ranges fit between them, small ranges and large ones each bounded by their
own distances: on the usual layout, where the driver reserves the ranges one
after the other, that is the card's memory exactly when both kinds of range
are followed closely by another, and to within a large page (20 MiB of
range, about 18 MiB of card) when only large ones are.
"""
from __future__ import annotations

from typing import Any, Iterable

from torchmem import _core

DEFAULT_CAPACITY = 80 << 30  # when nothing tells the card: an 80 GiB GPU
SMALL_PAGE = _core.rules.SMALL_BUFFER  # the small pool's segments and expandable pages
LARGE_PAGE = _core.rules.LARGE_BUFFER  # the default large_segment_size
# The address range PyTorch reserves for one expandable segment on a card of `capacity` bytes (the core's rule).
range_size = _core.rules.expandable_range_size
# What PyTorch asks the device for to serve a rounded request (get_allocation_size: the core's rule).
segment_request = _core.rules.allocation_size


def largest_capacity_within(gap: int, small_gap: int | None = None) -> int:
    """The largest capacity (a multiple of 2 MiB) whose large ranges are at most `gap` bytes and whose
    small ranges are at most `small_gap` (default: `gap` too)."""
    small_gap = gap if small_gap is None else small_gap
    capacity = (min(gap, small_gap) * 8 // 9) // SMALL_PAGE * SMALL_PAGE + 20 * SMALL_PAGE
    while capacity > 0 and (range_size(capacity, LARGE_PAGE) > gap or range_size(capacity, SMALL_PAGE) > small_gap):
        capacity -= SMALL_PAGE
    return capacity


def expandable_capacity(ranges: Iterable[tuple[int, bool, int | None]], default: int) -> int | None:
    """A capacity for replaying expandable ranges at their recorded addresses, or None to keep `default`.

    `ranges`: (base, is_small, next base) of each range the recording shows
    (expandable_ranges.recorded_ranges: the next base is the lowest of the
    ranges that lived above it at the same time, or None). Each range's size
    is at most the distance to the next base, a small range's (2 MiB pages)
    and a large one's (20 MiB pages) each their own bound: the capacity is
    the largest under both. None when no range has one above it or
    `default`'s ranges already fit.
    """
    gaps = _gaps(ranges)
    if not gaps:
        return None
    large_gap, small_gap = gaps.get(False, 1 << 62), gaps.get(True, 1 << 62)
    if range_size(default, LARGE_PAGE) <= large_gap and range_size(default, SMALL_PAGE) <= small_gap:
        return None
    capacity = largest_capacity_within(large_gap, small_gap)
    return capacity or None


def card_from_spacing(ranges: Iterable[tuple[int, bool, int | None]]) -> int | None:
    """The largest card whose expandable ranges fit between the recorded ones, or None when no range has one
    above it (`ranges` as for expandable_capacity). Where PyTorch's ranges lie side by side, as the driver
    reserves them, that is the card to within a large page (exactly, with a small range followed closely)."""
    gaps = _gaps(ranges)
    if not gaps:
        return None
    return largest_capacity_within(gaps.get(False, 1 << 62), gaps.get(True, 1 << 62)) or None


def _gaps(ranges: Iterable[tuple[int, bool, int | None]]) -> dict[bool, int]:
    """The least distance from a range's base to the next base above it, per kind (is_small)."""
    gaps: dict[bool, int] = {}
    for base, is_small, following in ranges:
        if following is not None and following > base:
            gaps[is_small] = min(following - base, gaps.get(is_small, following - base))
    return gaps


def recorded_capacity(recorded: Any) -> tuple[int, str]:
    """The capacity to replay a recording on when none is given, and where it comes from.

    `recorded` is a trace's RecordedRun (or None): its capacity when the
    recording tells it ("oom", "expandable"), else 80 GiB or the most the
    recording held, whichever is more ("default").
    """
    if recorded is None:
        return card_of(None, None, 0)
    return card_of(recorded.capacity, recorded.capacity_from, recorded.peak_reserved)


def card_of(capacity: int | None, capacity_from: str | None, peak_reserved: int) -> tuple[int, str]:
    """recorded_capacity() from a recording's capacity, its source and the most it held."""
    if capacity is not None:
        return capacity, capacity_from or "oom"
    return max(DEFAULT_CAPACITY, -(-peak_reserved // SMALL_PAGE) * SMALL_PAGE), "default"
