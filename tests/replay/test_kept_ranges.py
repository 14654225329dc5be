"""Expandable ranges reserved before recording began and never mapped (torchmem/replay/kept_ranges.py).

The native cases are tests/fakegpu/fixed/kept-range-before-recording.json and the oracle's mid-run
expandable workloads; these check the rule on a hand-made snapshot.
"""
from __future__ import annotations

import pytest

MiB = 1 << 20
GiB = 1 << 30
RANGE = 1160 * MiB  # a large range on a 1 GiB card: 9/8 of it in whole 20 MiB pages
BASE = 0x7F0000000000


def _snapshot(start_range_at: int) -> dict:
    """A range that existed when recording began at `start_range_at` (20 MiB mapped, an 8 MiB block live, freed in
    the trace); the trace's first map, 40 MiB at BASE for a 30 MiB request; then an OOM that gives the card."""
    s = start_range_at
    trace = [{"action": "segment_map", "addr": BASE, "size": 40 * MiB, "stream": 0, "frames": []},
             {"action": "alloc", "addr": BASE, "size": 30 * MiB, "stream": 0, "frames": []},
             {"action": "free_completed", "addr": s, "size": 8 * MiB, "stream": 0, "frames": []},
             {"action": "oom", "addr": 0, "size": 2 * GiB, "device_free": GiB - 60 * MiB, "stream": 0, "frames": []}]

    def segment(addr: int, size: int, used: int) -> dict:
        blocks = [{"address": addr, "size": used, "requested_size": used, "state": "active_allocated"}] if used else []
        blocks.append({"address": addr + used, "size": size - used, "requested_size": 0, "state": "inactive"})
        return {"address": addr, "total_size": size, "stream": 0, "segment_type": "large", "device": 0,
                "allocated_size": used, "active_size": used, "requested_size": used, "is_expandable": True,
                "blocks": blocks}

    segments = sorted([segment(BASE, 40 * MiB, 30 * MiB), segment(s, 20 * MiB, 0)], key=lambda seg: seg["address"])
    return {"segments": segments, "device_traces": [trace], "allocator_settings": {"expandable_segments": True}}


@pytest.mark.parametrize("above, kept", [(True, True), (False, False)])
def test_a_map_below_a_range_with_room_shows_a_range_kept_unmapped_there(above, kept):
    """With the start range above BASE, PyTorch would have served the 30 MiB request there, had no range of the
    stream lain unmapped at BASE: the replay rebuilds one. With it below BASE, the request would have mapped in it
    anyway: the map at BASE is not explained that way, and nothing is added."""
    from torchmem.replay.snapshot_trace import snapshot_trace

    trace = snapshot_trace(_snapshot(BASE + RANGE if above else BASE - RANGE), "snap")
    empty = [r.base for r in trace.start.ranges if not r.runs]
    assert empty == ([BASE] if kept else [])
    assert any("reserved before recording began and never mapped" in n for n in trace.notes) == kept


def test_the_replay_maps_in_the_kept_range_where_pytorch_did():
    from torchmem import snapshot_from_replay
    from torchmem.replay.runner import replay
    from torchmem.replay.snapshot_trace import snapshot_trace

    result = replay(snapshot_trace(_snapshot(BASE + RANGE), "snap"), history=100)
    maps = [(e["action"], e["addr"]) for e in snapshot_from_replay(result)["device_traces"][0]
            if e["action"] == "segment_map"]
    assert maps[0] == ("segment_map", BASE)
