"""Where expandable segments reserve their address ranges, recorded by PyTorch's own allocator.

With expandable_segments:True PyTorch reserves an address range of 9/8 of the
card per stream and pool kind, maps pages from its lowest address up, and
gives a range back only when a release unmaps its last pages (Note
[Expandable ranges in a snapshot] in torchmem/replay/expandable_ranges.py).
A snapshot records the maps, never the reservations. Each workload here runs
under PyTorch's native allocator on the fake GPU, and the replay of its
snapshot, given no hints, must put every range where PyTorch did:

- a range reserved by a request that failed (PyTorch keeps it, unmapped) and
  mapped by a later one;
- a range that existed when recording began, given back during the trace,
  whose addresses another stream's range takes; two such ranges side by side;
- ranges recorded next to each other with no OOM to tell the card's size;
- the oracle's own batches, where a kept range must not outlive its workload.
"""
from __future__ import annotations

import importlib
import pickle

import pytest

from torchmem import replay as sim
from tests.support import oracle

MiB = 1 << 20
GiB = 1 << 30
W = oracle.Workload
EXPANDABLE = "expandable_segments:True"

SCENARIOS = {
    # A 2 GiB request on a 1 GiB card fails: each attempt (before and after the cache release) reserves a
    # large range that nothing maps; PyTorch keeps both, and the 100 MiB request maps the lower one.
    "failed-request": W(1, EXPANDABLE, 1 * GiB, [["a", 0, 512 << 10, 0], ["o", 2 * GiB, 0],
                                                 ["a", 1, 512 << 10, 1], ["a", 2, 100 * MiB, 0],
                                                 ["a", 3, 100 * MiB, 1], ["f", 2], ["a", 4, 30 * MiB, 0]]),
    # Recorded from op 4: stream 1's small and large ranges and stream 0's large and small ones exist. Both
    # large ranges are given back (their blocks freed, empty_cache), and stream 0's next large range takes
    # the lowest free addresses: those stream 1's large range had.
    "start-range-given-back": W(2, EXPANDABLE, 1 * GiB,
                                [["a", 0, 512 << 10, 1], ["a", 1, 100 * MiB, 1], ["a", 2, 100 * MiB, 0],
                                 ["a", 9, 256 << 10, 0], ["f", 2], ["f", 1], ["e"], ["a", 4, 100 * MiB, 0],
                                 ["a", 5, 300 << 10, 1]], None, 4),
    # Recorded from op 5: stream 0 has two large ranges side by side (the first, with pages unmapped at both
    # ends, had no room for 610 MiB), and the pages mapped then span more than one range of the card (an
    # OOM in the trace tells its size): the start state holds two ranges, not one.
    "two-start-ranges": W(6, EXPANDABLE, 1 * GiB,
                          [["a", 0, 600 * MiB, 0], ["a", 1, 400 * MiB, 0], ["f", 0], ["e"], ["a", 2, 610 * MiB, 0],
                           ["a", 3, 300 << 10, 0], ["o", 2 * GiB, 0], ["f", 1], ["e"], ["a", 4, 300 * MiB, 0],
                           ["a", 5, 100 * MiB, 0]], None, 5),
    # No OOM: the card's size comes from the ranges' spacing; a small range (4 GiB card: 4608 MiB) sits
    # right below another range, whose size (4620 MiB) is a large range's.
    "spacing": W(3, EXPANDABLE, 4 * GiB, [["a", 0, 20 * MiB, 1], ["a", 1, 20 * MiB, 0], ["a", 2, 300 << 10, 1],
                                          ["a", 3, 300 << 10, 0], ["a", 4, 40 * MiB, 1], ["a", 5, 200 << 10, 0]]),
    # 42 MiB of the 2 GiB card held outside PyTorch, as by a CUDA context: the 1500 MiB request maps its
    # pages at 800-2300 MiB of the large range (2320 MiB: 9/8 of the card), past the 2260 MiB a range of
    # what the process could hold (2006 MiB) would have. The small range right below tells the card.
    "held-by-others": W(7, EXPANDABLE, 2 * GiB, [["a", 0, 300 << 10, 0], ["a", 1, 600 * MiB, 0],
                                                 ["a", 2, 200 * MiB, 0], ["f", 1], ["e"], ["a", 3, 1500 * MiB, 0],
                                                 ["o", 3 * GiB, 0]], held=42 * MiB),
}
# Two workloads in one process, as the oracle runs a setting: the first keeps ranges sized for a 2 GiB card
# (a failed request); the second runs on a 4 GiB card.
BATCH = [W(4, EXPANDABLE, 2 * GiB, [["a", 0, 30 * MiB, 0], ["o", 3 * GiB, 0], ["o", 3 * GiB, 1]]),
         W(5, EXPANDABLE, 4 * GiB, [["a", 0, 30 * MiB, 0], ["a", 1, 30 * MiB, 1], ["a", 2, 500 << 10, 1],
                                    ["a", 3, 300 << 10, 0], ["o", 5 * GiB, 1], ["a", 4, 60 * MiB, 1]])]


@pytest.fixture(scope="module")
def native(tmp_path_factory):
    out = tmp_path_factory.mktemp("ranges")
    names = list(SCENARIOS)
    workloads = [SCENARIOS[n] for n in names] + BATCH
    reports = oracle.run_native(workloads, out)
    return {name: (w, out / f"{i}.pickle", reports[i]) for i, (name, w) in enumerate(zip(names + ["batch-0", "batch-1"],
                                                                                        workloads))}


def entries(path, action: str) -> list[dict]:
    return [e for e in pickle.loads(path.read_bytes())["device_traces"][0] if e["action"] == action]


def range_size(card: int, page: int) -> int:
    return -(-(card + card // 8) // page) * page


@pytest.mark.parametrize("name", [*SCENARIOS, "batch-1"])
def test_the_replay_puts_every_range_where_pytorch_did(native, name):
    w, path, report = native[name]
    assert oracle.compare(path, report, w) == []
    result = sim.replay(str(path))
    assert result.exact, result.fidelity


def test_a_failed_request_reserves_the_range_a_later_one_maps(native):
    w, path, _ = native["failed-request"]
    maps = entries(path, "segment_map")
    small = maps[0]["addr"]
    large = [m for m in maps if m["size"] >= 20 * MiB and m["stream"] == maps[0]["stream"]]
    # PyTorch's facts: the failure's two ranges came right after the small one (the first 1152 MiB), and stream
    # 1's small range after both, so the first large map is in the range the failure reserved.
    assert entries(path, "oom") and large[0]["addr"] == small + range_size(GiB, 2 * MiB)
    stream1_small = [m for m in maps if m["stream"] != maps[0]["stream"] and m["size"] == 2 * MiB][0]
    assert stream1_small["addr"] == large[0]["addr"] + 2 * range_size(GiB, 20 * MiB)
    result = sim.replay(str(path))
    assert result.exact and result.fidelity["segments_missed"] == 0


def test_without_the_offers_at_the_failure_the_range_lands_elsewhere(native, monkeypatch):
    """The offers before a failed request are what puts its range in place (the check can fail)."""
    w, path, report = native["failed-request"]
    monkeypatch.setattr(importlib.import_module("torchmem.replay.snapshot_trace"), "failure_offers",
                        lambda *args: importlib.import_module("torchmem.replay.expandable_ranges").NO_OFFERS)
    assert not sim.replay(str(path)).exact
    assert any(p.startswith("trace differs") for p in oracle.compare(path, report, w))


def test_a_start_range_given_back_is_rebuilt_as_the_range_it_was(native):
    w, path, _ = native["start-range-given-back"]
    unmaps, maps = entries(path, "segment_unmap"), entries(path, "segment_map")
    # PyTorch's facts: stream 1's large range is given back, and stream 0's next large range maps there.
    given_back = [u for u in unmaps if u["size"] == 100 * MiB]
    assert len(given_back) == 2
    reused = [u for u in given_back if any(m["addr"] == u["addr"] and m["stream"] != u["stream"] for m in maps)]
    assert len(reused) == 1
    result = sim.replay(str(path))
    assert not result.start.segments and len(result.start.ranges) == 4  # every start run in its own range
    by_base = {r.base: r for r in result.start.ranges}
    assert by_base[reused[0]["addr"]].stream == reused[0]["stream"]  # the stream that held it then
    assert result.exact and result.fidelity["releases_made"] == len(unmaps)


def test_start_ranges_side_by_side_are_two_ranges(native):
    w, path, _ = native["two-start-ranges"]
    result = sim.replay(str(path))
    large = sorted(r.base for r in result.start.ranges if not r.is_small)
    assert len(large) == 2 and large[1] - large[0] == range_size(GiB, 20 * MiB)  # PyTorch's two, next to each other
    assert not result.start.segments and result.exact


def test_the_card_size_comes_from_each_kind_of_range_spacing(native):
    w, path, _ = native["spacing"]
    assert not entries(path, "oom")
    result = sim.replay(str(path))
    assert result.capacity_source == "expandable" and result.capacity == 4 * GiB
    assert result.exact


def test_a_range_kept_by_one_workload_does_not_serve_the_next(native):
    """The oracle's child gives back the ranges a failed request kept, so the next workload (on another
    card) starts as in a fresh process: its ranges are its own card's size."""
    w, path, _ = native["batch-1"]
    maps = entries(path, "segment_map")
    firsts = sorted({m["addr"] for m in maps if m["size"] >= 20 * MiB})
    assert firsts[1] - firsts[0] == range_size(4 * GiB, 20 * MiB)  # stream 0's range, then stream 1's


def test_the_card_behind_an_oom_is_the_ranges_not_what_the_process_could_hold(native, monkeypatch):
    """Note [The card behind an OOM]: the ranges' spacing gives the card, and the rest is held by others."""
    w, path, report = native["held-by-others"]
    result = sim.replay(str(path))
    assert result.exact and result.capacity == 2 * GiB and result.in_use_by_others == 42 * MiB
    assert result.recorded_oom["reproduced"]
    monkeypatch.setattr(importlib.import_module("torchmem.replay.snapshot_trace"), "card_from_spacing",
                        lambda ranges: None)
    assert not sim.replay(str(path)).exact  # on what the process could hold, the 1500 MiB map lands elsewhere
