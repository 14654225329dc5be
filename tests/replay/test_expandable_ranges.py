"""The card's size behind expandable ranges.

PyTorch reserves an expandable range of 9/8 of the card rounded up to the
page (2 MiB small, 20 MiB large). The expected sizes here come from that
rule, written out in the test; the figures of a 4 GiB card (4608 and 4620
MiB) are those the fake GPU's native runs show
(tests/fakegpu/test_replay_expandable_ranges.py holds the replay to them).
"""
from __future__ import annotations

from torchmem.replay.capacity import card_from_spacing, expandable_capacity, largest_capacity_within, range_size

MiB = 1 << 20
GiB = 1 << 30


def pytorch_range(card: int, page: int) -> int:
    reach = card + card // 8
    return (reach + page - 1) // page * page


def test_range_sizes_are_pytorchs():
    for card in (1 * GiB, 2 * GiB, 4 * GiB, 8 * GiB, 80 * GiB, 24 * 10**9):
        assert range_size(card, 2 * MiB) == pytorch_range(card, 2 * MiB)
        assert range_size(card, 20 * MiB) == pytorch_range(card, 20 * MiB)
    assert range_size(4 * GiB, 2 * MiB) == 4608 * MiB and range_size(4 * GiB, 20 * MiB) == 4620 * MiB


def test_each_kind_of_range_bounds_the_card_by_its_own_size():
    # A 4 GiB card's ranges side by side: large (4620 MiB), large, small (4608 MiB), small, large.
    bases = [0, 4620, 9240, 13848, 18456]
    kinds = [False, False, True, True, False]
    ranges = [(b * MiB, small, nxt * MiB if nxt is not None else None)
              for b, small, nxt in zip(bases, kinds, [*bases[1:], None])]
    assert expandable_capacity(ranges, 80 * GiB) == 4 * GiB
    # One bound for both kinds (the distance after a small range taken for a large one) gives less.
    assert largest_capacity_within(4608 * MiB) < 4 * GiB


def test_a_large_range_alone_tells_the_card_to_within_a_large_page():
    # Only a large range followed by another: every card whose large range is 2320 MiB fits (2 GiB among them).
    capacity = expandable_capacity([(0, False, 2320 * MiB), (2320 * MiB, True, None)], 80 * GiB)
    assert range_size(capacity, 20 * MiB) == 2320 * MiB and capacity >= 2 * GiB
    assert range_size(capacity + 2 * MiB, 20 * MiB) > 2320 * MiB  # the largest such card


def test_no_range_above_another_tells_nothing():
    assert expandable_capacity([(0, False, None)], 80 * GiB) is None
    assert expandable_capacity([(0, False, 100 * GiB)], 80 * GiB) is None  # the default's ranges fit


def test_the_card_from_two_ranges_side_by_side():
    """A 2 GiB card: a large range (2,320 MiB) with a small one right above it; what the process could hold
    at an OOM (2,006 MiB, 42 MiB held by the CUDA context) would size ranges 60 MiB short."""
    card = card_from_spacing([(0, False, 2320 * MiB), (2320 * MiB, True, None)])
    assert card is not None and range_size(card, 20 * MiB) == 2320 * MiB >= range_size(2 * GiB, 20 * MiB)
    assert range_size(2006 * MiB, 20 * MiB) < 2320 * MiB
    assert card_from_spacing([(0, False, None)]) is None  # one range tells nothing


def test_a_range_opened_where_a_later_failure_may_have_reserved_it_shows_nothing():
    """Note [Expandable ranges in a snapshot], FailureOffers.unreserved: failures at 5 and 15, each reserving one
    range. The range the trace opens at 20 stands at the base offered to the failure at 15: it may be that
    failure's. The failure at 5, offered no base, kept its range elsewhere, and nothing contradicts it."""
    from torchmem.replay.expandable_ranges import _unreserved

    assert _unreserved([(20, 0xB000)], [(5, []), (15, [0xB000])], {5: 1, 15: 1}) == []
    # A second range at the same base is reserved anew: the failure at 5 would have had one kept with room.
    assert _unreserved([(20, 0xB000), (30, 0xB000)], [(5, []), (15, [0xB000])], {5: 1, 15: 1}) == [5]
    # A failure whose offered bases place all it reserved keeps none unmapped: nothing to contradict.
    assert _unreserved([(30, 0xC000)], [(5, [0xA000])], {5: 1}) == []
    # One that reserves two, with one base offered, does.
    assert _unreserved([(30, 0xC000)], [(5, [0xA000])], {5: 2}) == [5]
    # A failure whose own map waits (None) may place any one opening.
    assert _unreserved([(30, 0xC000)], [(5, []), (10, None)], {5: 1}) == []
