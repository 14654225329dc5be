"""Where an expandable range that existed when recording began is based (start_state._lower_bases).

A start range shows only the pages mapped when recording began; its base
lies at or below the lowest of them. The trace's later maps lower it. The
native cases, recorded mid-run on the fake GPU, are in tests/fakegpu/fixed/
(start-range-second-range.json, start-range-given-back.json).
"""
from __future__ import annotations

from types import SimpleNamespace

from torchmem.replay.capacity import range_size
from torchmem.replay.start_state import StartRange, _lower_bases

MiB, GiB = 1 << 20, 1 << 30
PAGE = 20 * MiB
CARD = 8 * GiB
RANGE = range_size(CARD, PAGE)  # 9/8 of the card, on the page grid
BASE = 0x7F0000000000 + 100 * RANGE  # well above zero, on the page grid


def _maps(*maps: tuple[str, int, int, int]) -> SimpleNamespace:
    """The trace pass's maps and unmaps (action, addr, size, stream), all in the default pool."""
    return SimpleNamespace(maps=list(maps), map_pools=[(0, 0)] * len(maps))


def _range(lowest: int, size: int = 60 * MiB, stream: int = 1) -> StartRange:
    return StartRange(lowest, stream, False, runs=[(lowest, size)])


def test_a_map_below_a_live_start_range_of_its_stream_lowers_its_base():
    r = _range(BASE + 10 * PAGE)
    _lower_bases([r], _maps(("segment_map", BASE, PAGE, 1)), CARD)
    assert r.base == BASE


def test_a_map_a_whole_range_below_opens_a_second_range():
    """A stream keeps a second range where a request did not fit the first: a range based at the map could
    not reach the start range's pages, so the start range keeps its base."""
    r = _range(BASE + RANGE)
    _lower_bases([r], _maps(("segment_map", BASE, PAGE, 1)), CARD)
    assert r.base == BASE + RANGE
    # Without the card's size (no OOM), the map is taken as the start range's lower pages.
    _lower_bases([r], _maps(("segment_map", BASE, PAGE, 1)), None)
    assert r.base == BASE


def test_a_range_opened_below_a_start_range_given_back_takes_its_hole():
    """The start range's last pages are unmapped (it is given back); the next range opened below it, with no
    live range between, lies where the driver found the hole the start range left: at its base."""
    r = _range(BASE + 5 * PAGE, size=PAGE, stream=0)
    _lower_bases([r], _maps(("segment_unmap", BASE + 5 * PAGE, PAGE, 0), ("segment_map", BASE, 3 * PAGE, 0)), CARD)
    assert r.base == BASE


def test_a_range_opened_below_a_live_range_leaves_a_given_back_one_above_it():
    above = _range(BASE + 5 * PAGE, size=PAGE, stream=0)
    between = _range(BASE + 3 * PAGE, size=PAGE, stream=2)
    _lower_bases([between, above], _maps(("segment_unmap", BASE + 5 * PAGE, PAGE, 0),
                                         ("segment_map", BASE, PAGE, 0)), CARD)
    assert above.base == BASE + 5 * PAGE and between.base == BASE + 3 * PAGE
