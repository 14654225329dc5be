"""The memory fraction a recording ran under, bounded by its trace (torchmem/replay/memory_limit.py).

Native recordings with fractions, set through the API and the config, are
replayed in tests/fakegpu/test_replay_native_scenarios.py; these check the
bounds and the choice on hand-made figures.
"""
from __future__ import annotations

import pytest

from torchmem.replay.memory_limit import (LimitBounds, bounds, card_for_fraction, conf_fraction, highest_fraction,
                                          infer_fraction, limit_of)

MiB = 1 << 20
GiB = 1 << 30
LARGE = 20 * MiB


def test_every_segment_made_raises_the_lower_bound_to_reserved_plus_its_request():
    b = bounds([(0, 100 * MiB), (100 * MiB, 300 * MiB), (50 * MiB, 20 * MiB)], [], LARGE)
    assert b == LimitBounds(400 * MiB, None)


def test_an_oom_with_room_on_the_card_bounds_the_limit_from_above_and_one_without_does_not():
    # 250 MiB asks for 250 MiB (a multiple of 2 MiB); 5 MiB asks for a 20 MiB segment.
    b = bounds([(0, 100 * MiB)], [(600 * MiB, 250 * MiB, 1 * GiB), (700 * MiB, 5 * MiB, 1 * GiB),
                                  (100 * MiB, 4 * GiB, 1 * GiB)], LARGE)
    assert b == LimitBounds(100 * MiB, 720 * MiB)  # min(850, 720); the 4 GiB one had no room: the card refused


def test_the_configured_fraction_is_kept_when_the_trace_allows_it():
    b = LimitBounds(3 * GiB, 4 * GiB)
    assert infer_fraction(8 * GiB, b, 0.4) == (0.4, "config")            # 3.2 GiB lies in [3, 4)
    assert infer_fraction(None, LimitBounds(3 * GiB, None), 0.4) == (0.4, "config")  # no card known: nothing contradicts


def test_a_fraction_the_trace_contradicts_is_replaced_by_the_highest_that_fits():
    b = LimitBounds(2 * GiB, 3 * GiB)
    fraction, source = infer_fraction(8 * GiB, b, 0.4)  # 3.2 GiB: PyTorch refused below it, so the program set another
    assert source == "inferred"
    assert limit_of(fraction, 8 * GiB) < 3 * GiB <= limit_of(fraction, 8 * GiB) + 2  # just under the refusal


def test_no_fraction_without_a_refusal_or_a_card():
    assert infer_fraction(8 * GiB, LimitBounds(2 * GiB, None), None) == (None, "none")
    assert infer_fraction(None, LimitBounds(2 * GiB, 3 * GiB), None) == (None, "none")
    assert highest_fraction(8 * GiB, LimitBounds(3 * GiB, 3 * GiB)) is None  # empty bounds


@pytest.mark.parametrize("conf, fraction", [("per_process_memory_fraction:0.5", 0.5),
                                            ("max_split_size_mb:64,per_process_memory_fraction:0.93", 0.93),
                                            ("max_split_size_mb:64", None), ("per_process_memory_fraction:x", None)])
def test_conf_fraction(conf, fraction):
    assert conf_fraction(conf) == fraction


def test_a_configured_fraction_below_every_segment_made_implies_memory_held_by_others():
    """0.6 of what the process could hold (1,000 MiB) is below the 650 MiB the trace reserved: the card was
    larger and the rest held outside PyTorch; the least card whose limit allows 650 MiB is 650 / 0.6."""
    MiB = 1 << 20
    no_refusal = LimitBounds(lo=650 * MiB, hi=None)
    card = card_for_fraction(0.6, 1000 * MiB, no_refusal)
    assert card is not None and int(0.6 * card) >= 650 * MiB > int(0.6 * (card - 1))
    # A refusal by the limit at 700 MiB changes nothing: the least card still fits below it.
    assert card_for_fraction(0.6, 1000 * MiB, LimitBounds(lo=650 * MiB, hi=700 * MiB)) == card
    # A fraction that fits what the process could hold needs no other card.
    assert card_for_fraction(0.6, 1100 * MiB, no_refusal) is None


def test_a_map_asks_the_limit_for_its_requests_alloc_size_not_its_pages():
    """PyTorch checks a request's alloc_size against the limit before it maps; the pages it maps may be more
    (20 MiB pages) or fewer (a free block at the range's end covers part). A fixed segment asks its size."""
    from types import SimpleNamespace

    from torchmem.replay.snapshot_trace import _creation_needs

    made = SimpleNamespace(creations=[(0, 360 * MiB, 350 * MiB + 1), (0, 20 * MiB, 100 * MiB), (0, 40 * MiB, None),
                                      (0, 20 * MiB, 0)])
    assert _creation_needs(made, LARGE) == [352 * MiB, 100 * MiB, 40 * MiB, 0]


def test_with_expandable_segments_an_oom_tells_only_where_the_card_had_room_for_whole_pages():
    # 12 MiB asks for 12 MiB, but a map takes a 20 MiB page: with 12 MiB free the card itself refused.
    oom = [(1006 * MiB, 12 * MiB, 12 * MiB)]
    assert bounds([], oom, LARGE).hi == 1018 * MiB
    assert bounds([], oom, LARGE, maps_pages=True).hi is None
    # With room for the page, the limit refused.
    assert bounds([], [(1006 * MiB, 12 * MiB, 20 * MiB)], LARGE, maps_pages=True).hi == 1018 * MiB
    # A small request maps a 2 MiB page: 512 KiB asks for 2 MiB.
    assert bounds([], [(100 * MiB, 512 << 10, 2 * MiB)], LARGE, maps_pages=True).hi == 102 * MiB


def test_an_oom_with_room_for_the_request_but_not_its_pages_is_listed_as_untold():
    # 67 MiB asks 68 MiB: 76 MiB free fits it, not the 80 MiB of whole pages; 50 MiB free fits neither.
    b = bounds([], [(900 * MiB, 67 * MiB, 76 * MiB), (900 * MiB, 67 * MiB, 50 * MiB)], LARGE, maps_pages=True)
    assert b.hi is None and b.untold == (0,)
    assert bounds([], [(900 * MiB, 67 * MiB, 76 * MiB)], LARGE).untold == ()  # fixed segments: told


def _expandable_oom(device_free: int) -> dict:
    """A 900 MiB range with 10 MiB free at its tail, then an OOM of 67 MiB with `device_free` on the card."""
    base = 0x7F0000000000
    trace = [{"action": "segment_map", "addr": base, "size": 900 * MiB, "stream": 0, "frames": []},
             {"action": "alloc", "addr": base, "size": 890 * MiB, "stream": 0, "frames": []},
             {"action": "oom", "addr": device_free, "size": 67 * MiB, "device_free": device_free, "stream": 0,
              "frames": []}]
    blocks = [{"address": base, "size": 890 * MiB, "requested_size": 890 * MiB, "state": "active_allocated"},
              {"address": base + 890 * MiB, "size": 10 * MiB, "requested_size": 0, "state": "inactive"}]
    segment = {"address": base, "total_size": 900 * MiB, "stream": 0, "segment_type": "large", "device": 0,
               "allocated_size": 890 * MiB, "active_size": 890 * MiB, "requested_size": 890 * MiB,
               "is_expandable": True, "blocks": blocks}
    return {"segments": [segment], "device_traces": [trace], "allocator_settings": {"expandable_segments": True}}


@pytest.mark.parametrize("free, fraction", [(50, False), (58, False), (60, True), (76, True)])
def test_an_oom_bounds_the_fraction_where_the_card_had_room_for_the_pages_its_maps_take(free, fraction):
    """The 67 MiB request joins the 10 MiB free at the range's tail and maps 60 MiB (range_room.py): with that
    much free on the card, the memory fraction refused it."""
    from torchmem.replay.snapshot_trace import snapshot_trace

    trace = snapshot_trace(_expandable_oom(free * MiB), "snap")
    assert ("per_process_memory_fraction" in trace.recorded.conf) == fraction
    assert not any("out-of-memory with" in n for n in trace.notes)


def _gap_oom(device_free: int) -> dict:
    """A 200 MiB range: blocks A (90 MiB) and D (60 MiB at 140 MiB) live, 10 MiB free above A, and the 40 MiB
    below D given back by empty_cache(); then an OOM of 45 MiB with `device_free` on the card."""
    base = 0x7F0000000000
    blocks = [(base, 90), (base + 90 * MiB, 10), (base + 100 * MiB, 40), (base + 140 * MiB, 60)]
    trace = [{"action": "segment_map", "addr": base, "size": 200 * MiB, "stream": 0, "frames": []}]
    trace += [{"action": "alloc", "addr": a, "size": n * MiB, "stream": 0, "frames": []} for a, n in blocks]
    trace += [{"action": "free_completed", "addr": blocks[k][0], "size": blocks[k][1] * MiB, "stream": 0,
               "frames": []} for k in (2, 1)]
    trace += [{"action": "segment_unmap", "addr": base + 100 * MiB, "size": 40 * MiB, "stream": 0, "frames": []},
              {"action": "oom", "addr": device_free, "size": 45 * MiB, "device_free": device_free, "stream": 0,
               "frames": []}]

    def segment(addr: int, parts: list[tuple[int, int, bool]]) -> dict:
        used = sum(n for _, n, live in parts if live) * MiB
        return {"address": addr, "total_size": sum(n for _, n, _ in parts) * MiB, "stream": 0,
                "segment_type": "large", "device": 0, "allocated_size": used, "active_size": used,
                "requested_size": used, "is_expandable": True,
                "blocks": [{"address": a, "size": n * MiB, "requested_size": n * MiB if live else 0,
                            "state": "active_allocated" if live else "inactive"} for a, n, live in parts]}

    segments = [segment(base, [(base, 90, True), (base + 90 * MiB, 10, False)]),
                segment(base + 140 * MiB, [(base + 140 * MiB, 60, True)])]
    return {"segments": segments, "device_traces": [trace], "allocator_settings": {"expandable_segments": True}}


@pytest.mark.parametrize("free, fraction", [(30, False), (40, True)])
def test_a_request_maps_from_the_first_gap_with_room_taking_the_free_block_below_it(free, fraction):
    """The 45 MiB request asks the limit for 46 MiB, yet maps only 40 MiB: the gap below D, with the 10 MiB
    free above A (find_expandable_block). 40 MiB free on the card had room for that: the fraction refused."""
    from torchmem.replay.snapshot_trace import snapshot_trace

    trace = snapshot_trace(_gap_oom(free * MiB), "snap")
    assert ("per_process_memory_fraction" in trace.recorded.conf) == fraction


def _unreserved_failure(later: int, size: int = 2000 * MiB) -> dict:
    """A 100 MiB map, an OOM of `size` (2,000 MiB: more than a range of the 1,000 MiB card holds), the range
    given back, then a 40 MiB map `later` bytes above the first range's base."""
    base = 0x7F0000000000
    trace = [{"action": "segment_map", "addr": base, "size": 100 * MiB, "stream": 0, "frames": []},
             {"action": "alloc", "addr": base, "size": 100 * MiB, "stream": 0, "frames": []},
             {"action": "oom", "addr": 900 * MiB, "size": size, "device_free": 900 * MiB, "stream": 0,
              "frames": []},
             {"action": "free_completed", "addr": base, "size": 100 * MiB, "stream": 0, "frames": []},
             {"action": "segment_unmap", "addr": base, "size": 100 * MiB, "stream": 0, "frames": []},
             {"action": "segment_map", "addr": base + later, "size": 40 * MiB, "stream": 0, "frames": []},
             {"action": "alloc", "addr": base + later, "size": 40 * MiB, "stream": 0, "frames": []}]
    blocks = [{"address": base + later, "size": 40 * MiB, "requested_size": 40 * MiB, "state": "active_allocated"}]
    segment = {"address": base + later, "total_size": 40 * MiB, "stream": 0, "segment_type": "large", "device": 0,
               "allocated_size": 40 * MiB, "active_size": 40 * MiB, "requested_size": 40 * MiB,
               "is_expandable": True, "blocks": blocks}
    return {"segments": [segment], "device_traces": [trace], "allocator_settings": {"expandable_segments": True}}


@pytest.mark.parametrize("later, fraction", [(0, True), (20 * MiB, True), (2 * GiB, False)])
def test_a_failure_that_reserved_no_range_was_refused_by_the_memory_fraction(later, fraction):
    """Note [Expandable ranges in a snapshot]: the OOM's request fits no range, so without a fraction it would
    have reserved one and kept it; the 40 MiB request would then have mapped there. A range opened only where
    the first range stood shows none was reserved: a fraction refused the OOM. One opened at an address free at
    the OOM may be the one it reserved, and shows nothing."""
    from torchmem.replay.snapshot_trace import snapshot_trace

    trace = snapshot_trace(_unreserved_failure(later), "snap")
    assert ("per_process_memory_fraction" in trace.recorded.conf) == fraction
    # The OOM asked more than the card: any fraction below 1 refused it.
    assert any(n.startswith("a memory fraction of just under 1 ") for n in trace.notes) == fraction


def test_a_failure_that_fit_a_range_reserved_none_and_shows_nothing():
    # 950 MiB fits the first range's 1,040 unmapped MiB: the card refused its pages there, and no range was reserved.
    trace = snapshot_trace_of(_unreserved_failure(0, 950 * MiB))
    assert "per_process_memory_fraction" not in trace.recorded.conf


def snapshot_trace_of(snapshot: dict):
    from torchmem.replay.snapshot_trace import snapshot_trace

    return snapshot_trace(snapshot, "snap")


def test_a_refusal_of_more_than_the_card_gives_the_largest_fraction_below_1():
    fraction = highest_fraction(GiB, LimitBounds(100 * MiB, 3 * GiB))
    assert fraction is not None and fraction < 1.0 and limit_of(fraction, GiB) == GiB - 1
