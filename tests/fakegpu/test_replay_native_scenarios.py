"""The scenarios of tests/replay/test_replay_exact.py, recorded by PyTorch's own allocator instead of torchmem's.

The CPU tier's replay tests replay snapshots that torchmem's allocator wrote
(tests/support/replay_recording.py), so a rule torchmem gets wrong both when it
records and when it replays cannot fail them. Here each scenario runs as an
oracle workload (ops: tests/support/oracle_child.py) under PyTorch's
native caching allocator on the fake GPU, and torchmem's replay of the native
snapshot, given no hints, must reproduce it: every entry of the trace at its
native address, the final segments block by block and PyTorch's statistics
(oracle.compare returns []), plus what each scenario is about (the start
state rebuilt, the OOM reproduced, the releases made, ...). Where the replay
is known to differ, the test is xfail(strict=True) and names what differs.

All workloads run once, in one fixture (one process per setting).
"""
from __future__ import annotations

import copy
import json
import pickle

import pytest
import torch

from tests.fakegpu.helpers import run_json
from tests.support.replay_recording import random_workload
from tests.support.subprocess_runner import ok, run_torchmem
from torchmem import replay as sim
from torchmem.formats.snapshot_format import snapshot_from_replay
from tests.support import oracle
from torchmem.replay.memory_limit import conf_fraction
from torchmem.formats.trace_types import TraceError

MiB = 1 << 20
GiB = 1 << 30


ORACLE_OPS = {"alloc": "a", "free": "f", "empty_cache": "e"}


def mixed(seed: int, steps: int, streams: int = 1, empty_cache_every: int = 0, large: float = 0.3) -> list:
    """tests/support/replay_recording.random_workload as oracle ops: mixed sizes, random frees, ids never reused."""
    return [[ORACLE_OPS[op[0]], *op[1:]] for op in random_workload(seed, steps, streams, empty_cache_every, large)]


def record_stream_ops(rounds: int = 40) -> list:
    """Two streams: each block is made on stream 0, used on stream 1 (held back) and freed at once;
    its free completes only when stream 1's work does, every fifth round."""
    ops: list = [["h", 1]]
    for i in range(rounds):
        ops += [["a", 2 * i, 3 * MiB, 0], ["a", 2 * i + 1, 3 * MiB, 1], ["u", 2 * i, 1], ["f", 2 * i]]
        if i % 5 == 4:
            ops += [["c", 1], ["h", 1]]
    return ops


W = oracle.Workload
SCENARIOS: dict[str, oracle.Workload] = {}
FROM_EMPTY = ["", "max_split_size_mb:64", "roundup_power2_divisions:4", "expandable_segments:True"]
for _conf in FROM_EMPTY:
    for _seed in (1, 2):
        SCENARIOS[f"empty[{_conf}][{_seed}]"] = W(_seed, _conf, 4 * GiB, mixed(_seed, 1500))
MID_WAY = ["", "max_split_size_mb:64", "roundup_power2_divisions:4"]
for _conf in MID_WAY:
    for _cut in (1, 400, 1000):
        SCENARIOS[f"mid[{_conf}][{_cut}]"] = W(7, _conf, 4 * GiB, mixed(7, 1800, empty_cache_every=700),
                                              record_at=_cut)
# A job that dies of its OOM: large requests until one fails, and nothing after it.
_ops = mixed(3, 1500, large=0.5)
SCENARIOS["oom"] = W(3, "", 4 * GiB, _ops + [["o", 4 * GiB, 0]])
SCENARIOS["oom-mid"] = W(3, "", 4 * GiB, _ops + [["o", 4 * GiB, 0]], record_at=500)
# A program that catches its OOMs and goes on.
SCENARIOS["caught"] = W(11, "", 1 * GiB, mixed(11, 2500, large=0.5))
SCENARIOS["caught-mid"] = W(11, "", 1 * GiB, mixed(11, 2500, large=0.5), record_at=800)
# An OOM under a memory fraction: the card had room.
SCENARIOS["fraction"] = W(3, "", 8 * GiB, mixed(3, 2500, large=0.5) + [["o", 3 * GiB, 0]], fraction=0.3)
# The setting's fraction (recorded in the snapshot's config string), and the program's over it (not recorded);
# a fraction with garbage collection, whose threshold is a share of the fraction's limit.
SCENARIOS["fraction-setting"] = W(3, "per_process_memory_fraction:0.4", 8 * GiB,
                                  mixed(3, 2500, large=0.5) + [["o", 3 * GiB, 0]])
SCENARIOS["fraction-over-setting"] = W(3, "per_process_memory_fraction:0.4", 8 * GiB,
                                       mixed(3, 2500, large=0.5) + [["o", 3 * GiB, 0]], fraction=0.3)
SCENARIOS["fraction-gc"] = W(9, "garbage_collection_threshold:0.6", 4 * GiB,
                             mixed(9, 2500, large=0.6) + [["o", 2 * GiB, 0]], fraction=0.5)
SCENARIOS["empty_cache"] = W(5, "", 4 * GiB, mixed(5, 2000, empty_cache_every=300))
SCENARIOS["record_stream"] = W(0, "", 1 * GiB, record_stream_ops())
SCENARIOS["expandable-empty_cache"] = W(6, "expandable_segments:True", 4 * GiB,
                                        mixed(6, 2000, empty_cache_every=400))
for _seed, _every in ((6, 0), (8, 300)):
    for _cut in (300, 1200):
        SCENARIOS[f"expandable-mid[{_seed}][{_cut}]"] = W(_seed, "expandable_segments:True", 4 * GiB,
                                                         mixed(_seed, 2000, empty_cache_every=_every), record_at=_cut)
for _card in (24, 40):
    SCENARIOS[f"expandable-card[{_card}]"] = W(3, "expandable_segments:True", _card * GiB, mixed(3, 2000, streams=2))
SCENARIOS["expandable-one-range"] = W(0, "expandable_segments:True", 24 * GiB,
                                      [["a", i, 4096 * (i % 200 + 1), 0] for i in range(600)]
                                      + [["f", i] for i in range(0, 600, 3)])
CONF_STRING = ["max_split_size_mb:64,max_non_split_rounding_mb:128", "large_segment_size_mb:64",
               "expandable_segments:True,large_segment_size_mb:64"]
for _conf in CONF_STRING:
    SCENARIOS[f"conf-string[{_conf}]"] = W(5, _conf, 8 * GiB, mixed(5, 2000, large=0.6))
# No OOM on a 141 GiB card, with more than 80 GiB held at once (the fake GPU's memory is never touched).
SCENARIOS["held-over-80GiB"] = W(4, "", 141 * GiB, [["a", 10_000 + i, 10 * GiB, 0] for i in range(10)]
                                 + [["f", 10_000 + i] for i in range(10)] + mixed(4, 500))
# tests/allocator/test_caching_rules.py::test_split_segments_are_not_released_on_retry, under PyTorch's allocator.
SCENARIOS["retry"] = W(0, "", 60 * MiB, [["a", 0, 2 * MiB, 0]] + [["a", i, 12 * MiB, 0] for i in (1, 2, 3)]
                       + [["f", 1], ["f", 2], ["f", 3], ["a", 4, 30 * MiB, 0]])

# The program's empty_cache() just before a request the recording never held room for, and a real retry: with
# stacks (PyTorch's default context="all"), and the first without.
_cached = [["a", 0, 600 * MiB, 0], ["f", 0]]
SCENARIOS["empty_cache-then-request"] = W(0, "", 1 * GiB, _cached + [["e"], ["a", 1, 700 * MiB, 0]], stacks=True)
SCENARIOS["empty_cache-then-request-no-stacks"] = W(0, "", 1 * GiB, _cached + [["e"], ["a", 1, 700 * MiB, 0]])
SCENARIOS["retry-with-stacks"] = W(0, "", 1 * GiB, _cached + [["a", 1, 700 * MiB, 0]], stacks=True)


# Scenarios whose replay differs from PyTorch's allocator: what differs.
# (expandable-mid[8][300] and [1200] differed until a start block in an expandable range was no longer sized
# across pages released after it: start_state._sizes_from_later_allocs.)
# (caught, caught-mid and empty_cache differed until the replay of a 2.13+ snapshot tied equal free blocks by
# segment age: test_the_tie_by_segment_age_is_what_made_them_differ.)
AGED = ("caught", "caught-mid", "empty_cache")
DIVERGES = {
    "empty_cache-then-request-no-stacks": "retry-count (tests/support/deviations.py): without stacks, the "
                                          "program's empty_cache() before a request over the most the recording "
                                          "held is taken as the allocator's retry (num_alloc_retries 0 vs 1)",
}


@pytest.fixture(scope="module")
def native(tmp_path_factory):
    """name -> (workload, native snapshot path, PyTorch's report), every scenario run once."""
    runs = {}
    # The 141 GiB card runs in a process of its own: run_native starts each process on its largest card, and
    # Control.set_total changes what cudaMemGetInfo reports but not the device properties' total memory,
    # from which PyTorch's memory fraction takes its limit (the fraction scenario, 0.3 of an 8 GiB card,
    # was granted 3 GiB in a process started on 141 GiB).
    for group in ([n for n in SCENARIOS if n != "held-over-80GiB"], ["held-over-80GiB"]):
        out = tmp_path_factory.mktemp("native")
        reports = oracle.run_native([SCENARIOS[n] for n in group], out)
        runs.update({n: (SCENARIOS[n], out / f"{i}.pickle", reports[i]) for i, n in enumerate(group)})
    return runs


def replayed_conf(conf: str, snap: dict) -> str:
    """The settings a replay of `snap` uses: the recorded ones and, for a torch 2.13+ snapshot (its settings
    carry max_cached_size), the tie between equal free blocks by segment age."""
    aged = "max_cached_size" in snap["allocator_settings"]
    return sim.normalize_conf(",".join(filter(None, [conf, "reuse_order:segment" if aged else ""])))


def load(path) -> dict:
    with open(path, "rb") as f:
        return pickle.load(f)


def entries(snapshot: dict, action: str) -> list[dict]:
    return [e for e in snapshot["device_traces"][0] if e["action"] == action]


def recorded(native, name: str):
    """The workload, its native snapshot, the snapshot's path and PyTorch's report."""
    w, path, report = native[name]
    assert "error" not in report, report
    return w, load(path), path, report


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=DIVERGES[n]))
                                  if n in DIVERGES else n for n in SCENARIOS])
def test_native_scenario_replays_exactly(native, name):
    """Every trace entry at its native address, the final segments block by block, PyTorch's statistics."""
    w, _, path, report = recorded(native, name)
    assert oracle.compare(path, report, w) == []


# ---------------------------------------------------------------- from empty, mid-way


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("conf", FROM_EMPTY)
def test_trace_from_empty_replays_address_by_address(native, conf, seed):
    w, snap, path, _ = recorded(native, f"empty[{conf}][{seed}]")
    assert snap["allocator_settings"]["expandable_segments"] == ("expandable_segments" in conf)
    result = sim.replay(str(path))
    assert result.conf_source == "recorded" and sim.normalize_conf(result.conf) == replayed_conf(conf, snap)
    assert result.exact and result.fidelity["placements_matched"] == len(entries(snap, "alloc"))


@pytest.mark.parametrize("cut", [1, 400, 1000])
@pytest.mark.parametrize("conf", MID_WAY)
def test_run_recorded_mid_way_starts_from_the_rebuilt_state(native, conf, cut):
    w, snap, path, _ = recorded(native, f"mid[{conf}][{cut}]")
    result = sim.replay(str(path))
    assert result.start is not None and result.start.segments, "memory was live when recording began"
    assert result.exact
    # The start state's reserved bytes: the final segments with the trace's segment changes undone.
    final = sum(s["total_size"] for s in snap["segments"])
    made = (sum(e["size"] for e in entries(snap, "segment_alloc"))
            - sum(e["size"] for e in entries(snap, "segment_free")))
    assert result.start.reserved == final - made


def test_mid_run_without_the_start_state_would_not_be_exact(native, tmp_path):
    """The comparison can fail: the native trace, starting empty, is refused or lands elsewhere."""
    _, snap, _, _ = recorded(native, "mid[][1000]")
    path = tmp_path / "emptied.pickle"
    path.write_bytes(pickle.dumps(dict(snap, segments=[])))
    with pytest.raises(TraceError, match="lies in no segment|final segments show no live block"):
        sim.replay(str(path))
    lost = sim.replay(str(path), skip_bad_events=True)
    assert not lost.exact and lost.fidelity["placements_differed"] > 0


# ---------------------------------------------------------------- OOMs


@pytest.mark.parametrize("name", ["oom", "oom-mid"])
def test_oom_is_reproduced_with_the_inferred_capacity(native, name):
    w, snap, path, report = recorded(native, name)
    ooms = entries(snap, "oom")
    assert len(ooms) == 1 and snap["device_traces"][0][-1]["action"] == "oom" and report["oom_caught"] == 1
    result = sim.replay(str(path))
    assert result.capacity_source == "oom" and not result.completed
    assert result.oom["recorded"] and result.recorded_oom["reproduced"]
    assert result.recorded_oom["replay_reserved"] == result.recorded_oom["reserved"]
    # A bigger card completes the trace: the failed request succeeds.
    bigger = sim.replay(str(path), capacity="16GiB")
    assert bigger.completed and bigger.fidelity["failed_alloc_succeeded"] is not None
    assert not bigger.recorded_oom["reproduced"]


@pytest.mark.parametrize("name", ["caught", "caught-mid"])
def test_a_program_that_catches_its_ooms_is_replayed_past_each(native, name):
    w, snap, path, report = recorded(native, name)
    trace = snap["device_traces"][0]
    oom_entries = [i for i, e in enumerate(trace) if e["action"] == "oom"]
    assert len(oom_entries) > 50 and report["oom_caught"] >= len(oom_entries)
    result = sim.replay(str(path))
    assert [o["entry"] for o in result.recorded_ooms] == oom_entries
    assert all(o["reproduced"] for o in result.recorded_ooms)
    assert result.completed == any(e["action"] == "alloc" for e in trace[oom_entries[-1]:])


def test_an_oom_under_a_memory_fraction_is_reproduced(native):
    w, snap, path, _ = recorded(native, "fraction")
    oom = entries(snap, "oom")[0]
    assert oom["device_free"] > 4 * GiB  # the card had room: the fraction refused
    result = sim.replay(str(path))
    assert result.capacity_source == "oom" and result.capacity == 8 * GiB
    # The fraction is not in the snapshot: the replay's lies between the recorded peak and the refusal.
    assert result.recorded.fraction_from == "inferred"
    limit = int(conf_fraction(result.conf) * result.capacity)
    assert int(0.3 * 8 * GiB) <= limit < oom_reserved(oom) + oom["size"] + 2 * MiB
    assert result.recorded_oom["reproduced"]


def oom_reserved(oom: dict) -> int:
    return 8 * GiB - oom["device_free"]


@pytest.mark.parametrize("name", ["fraction-setting", "fraction-over-setting", "fraction-gc"])
def test_a_fraction_of_the_setting_or_the_program_is_replayed(native, name):
    w, snap, path, report = recorded(native, name)
    oom = entries(snap, "oom")[-1]
    card = oom_reserved(oom) + oom["device_free"]
    fraction = w.fraction or 0.4
    # PyTorch refused where reserved + the segment would pass its limit, with room on the card.
    assert oom["device_free"] > 2 * GiB and oom_reserved(oom) + oom["size"] > int(fraction * card)
    result = sim.replay(str(path))
    assert result.recorded_oom["reproduced"] and oracle.compare(path, report, w) == []
    # The setting's own fraction is taken as recorded; the program's (not in the snapshot) is inferred.
    assert result.recorded.fraction_from == ("inferred" if w.fraction else "config")
    if not w.fraction:
        assert conf_fraction(result.conf) == 0.4
    if "garbage_collection" in w.conf:
        # The collector released cached segments before PyTorch's limit was reached: the releases the
        # replay made are the recording's.
        assert result.fidelity["releases_made"] == len(entries(snap, "segment_free")) > 0
        assert result.fidelity["releases_missed"] == 0


# ---------------------------------------------------------------- empty_cache, streams


def test_empty_cache_calls_are_replayed(native):
    w, snap, path, _ = recorded(native, "empty_cache")
    trace = snap["device_traces"][0]
    releases = sum(e["action"] == "segment_free" for e in trace)
    calls = sum(1 for a, b in zip(trace, trace[1:]) if b["action"] == "segment_free" and a["action"] != "segment_free")
    assert 3 <= calls <= sum(op == ["e"] for op in w.ops)  # a call with nothing cached leaves no entry
    result = sim.replay(str(path))
    assert result.recorded.empty_cache_calls == calls
    assert result.fidelity["releases_made"] == releases and result.fidelity["releases_missed"] == 0


def test_frees_take_effect_at_free_completed(native, tmp_path):
    """record_stream on a held stream: PyTorch's free is requested at once and completes late."""
    w, snap, path, _ = recorded(native, "record_stream")
    trace = snap["device_traces"][0]
    assert len({e["stream"] for e in entries(snap, "alloc")}) == 2
    requested, late = {}, 0
    for i, e in enumerate(trace):
        if e["action"] == "free_requested":
            requested[e["addr"]] = i
        elif e["action"] == "free_completed":
            late += any(x["action"] == "alloc" for x in trace[requested.pop(e["addr"]):i])
    assert late >= 20  # the scenario is real: allocations come between a free's request and its completion
    result = sim.replay(str(path))
    assert result.exact  # every placement; its statistics: test_native_scenario_replays_exactly[record_stream]
    # Freeing at free_requested instead reuses blocks too early, and the replay lands elsewhere.
    early = copy.deepcopy(snap)
    early["device_traces"][0] = [e for e in trace if e["action"] != "free_completed"]
    (tmp_path / "early.pickle").write_bytes(pickle.dumps(early))
    assert sim.replay(str(tmp_path / "early.pickle"), skip_bad_events=True).fidelity["placements_differed"] > 0


# ---------------------------------------------------------------- expandable segments


def test_expandable_segments_with_empty_cache_unmaps_the_same_pages(native):
    w, snap, path, _ = recorded(native, "expandable-empty_cache")
    unmaps = entries(snap, "segment_unmap")
    assert unmaps and entries(snap, "segment_map")
    result = sim.replay(str(path))
    assert result.exact and result.fidelity["releases_made"] == len(unmaps)


@pytest.mark.parametrize("cut", [300, 1200])
@pytest.mark.parametrize("seed", [6, 8])
def test_expandable_segments_begun_mid_run_rebuild_their_ranges(native, seed, cut):
    w, snap, path, _ = recorded(native, f"expandable-mid[{seed}][{cut}]")
    result = sim.replay(str(path))
    assert result.start.ranges and result.start.reserved > 0
    # The pages mapped when recording began: the final ones with the trace's maps and unmaps undone.
    final = sum(b["size"] for s in snap["segments"] for b in s["blocks"])
    maps = sum(e["size"] for e in entries(snap, "segment_map")) - sum(e["size"] for e in entries(snap, "segment_unmap"))
    assert result.start.reserved == final - maps


@pytest.mark.parametrize("card", [24, 40])
def test_expandable_card_size_is_inferred_from_the_recorded_ranges(native, card):
    w, snap, path, _ = recorded(native, f"expandable-card[{card}]")
    result = sim.replay(str(path))
    assert result.capacity_source == "expandable"
    assert abs(result.capacity - card * GiB) <= 20 * MiB
    assert result.exact
    assert not sim.replay(str(path), capacity="80GiB").exact  # the inference matters


def test_one_expandable_range_keeps_the_default_capacity(native):
    w, snap, path, _ = recorded(native, "expandable-one-range")
    result = sim.replay(str(path))
    assert result.capacity_source == "default" and result.capacity == 80 * GiB and result.exact


def test_a_run_that_held_more_than_80_gib_replays_on_what_it_held(native):
    """No OOM on a 141 GiB card: the default capacity grows to the recording's peak, not an OOM at 80 GiB."""
    w, snap, path, report = recorded(native, "held-over-80GiB")
    peak = report["stats"]["reserved_bytes.all.peak"]
    assert peak > 100 * GiB and not entries(snap, "oom")
    result = sim.replay(str(path))
    assert result.capacity_source == "default" and result.capacity == peak
    assert result.completed and result.oom is None and result.exact


# ---------------------------------------------------------------- settings, retries


@pytest.mark.parametrize("conf", CONF_STRING)
def test_settings_without_a_field_come_from_the_recorded_conf_string(native, conf, tmp_path):
    w, snap, path, _ = recorded(native, f"conf-string[{conf}]")
    result = sim.replay(str(path))
    assert sim.normalize_conf(result.conf) == replayed_conf(conf, snap)
    # They matter: without them the same trace is placed elsewhere.
    dropped = dict(snap, allocator_settings=dict(snap["allocator_settings"], PYTORCH_CUDA_ALLOC_CONF=""))
    (tmp_path / "dropped.pickle").write_bytes(pickle.dumps(dropped))
    assert not sim.replay(str(tmp_path / "dropped.pickle"), capacity=w.card).exact


def test_split_segments_are_not_released_on_retry(native):
    """tests/allocator/test_caching_rules.py's case under PyTorch's allocator: one retry frees both whole segments."""
    w, snap, path, report = recorded(native, "retry")
    stats = report["stats"]
    assert stats["num_alloc_retries"] == 1 and stats["num_device_free"] == 2 and stats["num_device_alloc"] == 4
    assert sorted(s["total_size"] for s in snap["segments"]) == [20 * MiB, 30 * MiB]
    assert [e["size"] for e in entries(snap, "segment_free")] == [12 * MiB, 12 * MiB]
    result = sim.replay(str(path))
    assert result.exact and result.stats["num_device_free"] == 2
    # No OOM tells the card; the release run before a segment that passes the most the recording held is
    # taken as the allocator's retry (torchmem/replay/retries.py).
    assert result.stats["num_alloc_retries"] == 1


def test_stacks_tell_the_programs_empty_cache_from_a_retry(native):
    """The same releases before the same request: the program's empty_cache() (no retry) or PyTorch's own
    release after a failed cudaMalloc (a retry). A trace with stacks tells them apart by the releases' stack
    (torchmem/replay/release_runs.py); without, the card's size would have to, and no OOM tells it here."""
    for name, retries in (("empty_cache-then-request", 0), ("retry-with-stacks", 1)):
        _, snap, path, report = recorded(native, name)
        assert report["stats"]["num_alloc_retries"] == retries
        [release] = entries(snap, "segment_free")
        assert release.get("frames"), "recorded with stacks"
        result = sim.replay(str(path))
        assert result.exact and result.stats["num_alloc_retries"] == retries
    _, snap, path, report = recorded(native, "empty_cache-then-request-no-stacks")
    [release] = entries(snap, "segment_free")
    assert not release.get("frames") and report["stats"]["num_alloc_retries"] == 0
    assert sim.replay(str(path)).stats["num_alloc_retries"] == 1  # the open retry-count deviation


@pytest.mark.parametrize("name", AGED)
def test_the_tie_by_segment_age_is_what_made_them_differ(native, name):
    """torch 2.13+ ties equal free blocks by their segment's age: its snapshots replay exactly with that tie
    (what a plain replay now uses) and not with the tie by address."""
    w, snap, path, _ = recorded(native, name)
    if "max_cached_size" not in snap["allocator_settings"]:
        pytest.skip(f"torch {torch.__version__} ties equal free blocks by address")
    result = sim.replay(str(path))
    assert "reuse_order:segment" in result.conf
    assert result.exact and result.fidelity["placements_matched"] == len(entries(snap, "alloc"))
    by_address = sim.replay(str(path), conf=",".join(filter(None, [w.conf, "reuse_order:address"])),
                            follow_recording=True)
    assert not by_address.exact


# ---------------------------------------------------------------- the snapshot's form, the settings replayed


def test_json_snapshot_reads_like_the_pickle(native, tmp_path):
    w, snap, path, report = recorded(native, "mid[][400]")
    as_json = tmp_path / "snap.json"
    as_json.write_text(json.dumps(snap))
    trace = snap["device_traces"][0]
    result = sim.replay(str(as_json), history=len(trace) + 1000)
    assert result.exact and result.start is not None
    assert oracle._entries(snapshot_from_replay(result)["device_traces"][0]) == oracle._entries(trace)
    assert oracle._layout(result.segments) == oracle._layout(snap["segments"])


def test_other_settings_replay_from_the_same_start_without_following(native):
    w, snap, path, _ = recorded(native, "mid[][1000]")
    result = sim.replay(str(path), conf="expandable_segments:True")
    assert result.fidelity is None and not result.exact
    assert result.start.reserved > 0
    result.replayer.check_invariants()


# ---------------------------------------------------------------- recorded by a script: several devices, no history

MIXED_SCRIPT = """
import json, pickle, random, sys, torch
def mixed(seed, steps, device, large=0.3):
    rng, live, n = random.Random(seed), {}, 0
    for _ in range(steps):
        if live and rng.random() < 0.45:
            live.pop(rng.choice(list(live)))
            continue
        kind = rng.random()
        size = (rng.choice([4, 512, 70_000, 1 << 20]) + rng.randrange(512) if kind < 1 - large
                else rng.randrange(1 << 20, 10 << 20) if kind < 1 - large / 3 else rng.randrange(10 << 20, 200 << 20))
        try:
            live[n] = torch.empty(size, dtype=torch.uint8, device=device)
        except torch.OutOfMemoryError:
            return live, True
        n += 1
    return live, False
"""


@pytest.mark.parametrize("conf", ["", "expandable_segments:True"])
def test_a_snapshot_without_history_rebuilds_its_final_state(tmp_path, conf):
    """torch.cuda.memory_snapshot() without _record_memory_history(): segments only, no trace."""
    path = tmp_path / "snap.pickle"
    live = run_json(MIXED_SCRIPT + f"""
live, _ = mixed(3, 2000, "cuda")
snap = torch.cuda.memory._snapshot()
pickle.dump(snap, open({str(path)!r}, "wb"))
print(json.dumps(sum(t.numel() for t in live.values())))
""", card="24GiB", env={"PYTORCH_CUDA_ALLOC_CONF": conf})
    snap = load(path)
    assert all(not t for t in snap["device_traces"]) and snap["segments"]
    result = sim.replay(str(path))
    assert result.completed and result.events == 0
    # What PyTorch held: its blocks are the requests rounded; the replay holds the same blocks.
    held = sum(b["size"] for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated")
    assert held >= live and result.stats["allocated_bytes"]["all"]["current"] == held
    layout = oracle._layout
    assert layout(snapshot_from_replay(result)["segments"]) == layout(snap["segments"])
    proc = ok(run_torchmem("replay", str(path), timeout=120))
    assert "The snapshot has no trace" in proc.stdout


def test_two_devices_default_to_the_one_with_an_oom(tmp_path):
    path = tmp_path / "snap.pickle"
    ooms = run_json(MIXED_SCRIPT + f"""
from torchmem.fakegpu import Control
Control().set_total(1, "2GiB")
torch.cuda.memory._record_memory_history(context=None, stacks="python", max_entries=1_000_000)
a, oom0 = mixed(11, 800, "cuda:0")
b, oom1 = mixed(12, 3000, "cuda:1", large=0.6)
torch.cuda.memory._dump_snapshot({str(path)!r})
print(json.dumps([oom0, oom1]))
""", card="80GiB", devices=2)
    assert ooms == [False, True]
    snap = load(path)
    traces = snap["device_traces"]
    assert len(traces) == 2 and traces[0] and traces[1][-1]["action"] == "oom"
    assert sum(e["action"] == "oom" for e in traces[0]) == 0
    result = sim.replay(str(path))
    assert result.recorded.device == 1 and result.recorded.devices == [(0, len(traces[0])), (1, len(traces[1]))]
    assert result.recorded_oom["reproduced"] and not result.completed
    first = sim.replay(str(path), device=0, history=len(traces[0]) + 100)
    assert first.recorded.device == 0 and first.completed and first.exact
    replayed = snapshot_from_replay(first)["device_traces"][0]
    assert oracle._entries(replayed) == oracle._entries(traces[0])
    assert oracle._layout(first.segments) == oracle._layout(s for s in snap["segments"] if s["device"] == 0)
    with pytest.raises(TraceError, match="no device 2"):
        sim.replay(str(path), device=2)


# ---------------------------------------------------------------- advise, on a native recording


def test_advise_on_a_native_snapshot_recorded_mid_run_with_an_oom(native):
    """tests/replay/test_advise.py::test_snapshot_recorded_mid_run_with_an_oom on PyTorch's recording."""
    from torchmem.replay import advise
    from torchmem.replay.advise import GRID

    w, snap, path, _ = recorded(native, "oom-mid")
    trace = sim.load_trace(str(path))
    rows = advise(trace, combine=0)
    assert all(r.capacity == w.card for r in rows)  # the card: reserved + device_free at the OOM
    recorded_row = next(r for r in rows if r.recorded)
    assert not recorded_row.completes and recorded_row.min_capacity > w.card
    for row in rows:
        assert sim.replay(trace, row.min_capacity, row.conf).completed, row
        assert not sim.replay(trace, row.min_capacity - GRID, row.conf).completed, row


def test_other_settings_over_a_native_start_never_corrupt_the_allocator(native):
    """tests/replay/test_advise.py's rebuilt-start check, on PyTorch's recording: every replay runs and stays sound."""
    from torchmem.replay import candidates

    w, snap, path, _ = recorded(native, "oom-mid")
    trace = sim.load_trace(str(path))
    # Around the least memory the recorded setting needs (the OOM's request is the whole card, so no
    # capacity near the card completes): some capacities run out of memory and some complete.
    need = sim.min_capacity(trace, "")
    assert trace.start.reserved < need - 300 * MiB
    outcomes = {}
    for conf in candidates(""):
        for capacity in range(need - 300 * MiB, need + 300 * MiB, 26 * MiB):
            result = sim.replay(trace, capacity, conf)
            result.replayer.check_invariants()
            outcomes.setdefault(conf, set()).add(result.completed)
    assert outcomes[""] == {True, False}
