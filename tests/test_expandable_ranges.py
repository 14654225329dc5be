"""The card's size behind expandable ranges, and the replayer's accounting of the offers at failed requests.

PyTorch reserves an expandable range of 9/8 of the card rounded up to the
page (2 MiB small, 20 MiB large). The expected sizes here come from that
rule, written out in the test; the figures of a 4 GiB card (4608 and 4620
MiB) are those the fake GPU's native runs show
(tests/fakegpu/test_replay_expandable_ranges.py holds the replay to them).
"""
from __future__ import annotations

import numpy as np

from torchmem import _C
from torchmem.replay.capacity import expandable_capacity, largest_capacity_within, range_size
from torchmem.trace_types import ALLOC, RANGE_OFFER, SEGMENT_ADDRESS

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


def follow(conf: str, ops: list[int], sizes: list[int], addrs: list[int]) -> tuple[dict, list[int]]:
    """A replay that follows a recording of these events on a 1 GiB card: its fidelity, and where each id landed."""
    replayer = _C.Replayer(GiB, 0, conf, 1, False, True)
    n = len(ops)
    replayer.run(np.array(ops, dtype=np.uint8), np.arange(n, dtype=np.uint64), np.array(sizes, dtype=np.uint64),
                 np.zeros(n, dtype=np.uint64), np.array(addrs, dtype=np.uint64))
    placed = [b["address"] for s in replayer.segments() for b in s["blocks"] if b["allocated"]]
    return replayer.fidelity, placed


BASE = 64 * GiB  # above any address the simulated device hands out by itself


def test_a_range_offer_left_untaken_is_not_a_recorded_segment_missed():
    """A failed request's range offers are guesses (Note [Expandable ranges in a snapshot]); a recorded
    segment address left untaken is a miss. Fixed segments take neither kind of offer of a range."""
    guess, _ = follow("", [RANGE_OFFER, ALLOC], [0, MiB], [BASE, 0])
    recorded, _ = follow("", [SEGMENT_ADDRESS, ALLOC], [0, MiB], [BASE, 0])
    assert guess["segments_missed"] == 0 and guess["segments_followed"] == 0
    assert recorded["segments_missed"] == 1


def test_a_range_offer_taken_puts_the_range_there_and_counts_as_followed():
    fidelity, placed = follow("expandable_segments:True", [RANGE_OFFER, ALLOC], [0, MiB], [BASE, 0])
    assert placed == [BASE] and fidelity["segments_followed"] == 1 and fidelity["segments_missed"] == 0
