"""Faithfulness of a replay to its recording: exact replay of snapshots (start
state, recorded addresses, OOM, empty_cache, streams, devices).

Snapshots are written by torchmem's own allocator in PyTorch's format
(tests/support/replay_recording.py), cut to begin mid-run, and replayed; the replay
must put every allocation at its recorded address and end in the recorded
final segments. A recording torchmem wrote cannot catch a rule torchmem gets
wrong both ways: tests/fakegpu/test_replay_native_scenarios.py records the
same scenarios with PyTorch's own allocator on the fake GPU and holds the
replay to those (each test here names its counterpart).
tests/replay/test_native_fixtures.py does the same against decisions PyTorch's
allocator made on real GPUs.
"""
import pickle

import pytest

from tests.support.subprocess_runner import ok, torchmem_here
from tests.support.replay_recording import (
    GiB, MiB, alloc_addresses, begin_mid_run, random_workload, record, segment_layout,
)
from torchmem import replay as sim
from torchmem.formats.snapshot_format import snapshot_from_replay
from torchmem.replay.memory_limit import conf_fraction
from torchmem.formats.trace_types import TraceError


def write(tmp_path, snapshot, name="snap.pickle"):
    path = tmp_path / name
    path.write_bytes(pickle.dumps(snapshot))
    return str(path)


def assert_exact(result, snapshot, device=0):
    f = result.fidelity
    assert f is not None, "a replay of a snapshot under its own settings follows the recording"
    assert f["placements_differed"] == 0 and f["first_difference"] is None, f
    assert f["segments_missed"] == 0, f
    assert f["placements_matched"] == len(alloc_addresses(snapshot, device))
    assert result.exact
    result.replayer.check_invariants()
    if result.completed:
        final = [s for s in snapshot["segments"] if s.get("device", 0) == device]
        assert segment_layout(result.segments) == segment_layout(final)


@pytest.mark.parametrize("conf", ["", "max_split_size_mb:64", "roundup_power2_divisions:4", "expandable_segments:True"])
@pytest.mark.parametrize("seed", [1, 2])
def test_trace_from_empty_replays_address_by_address(tmp_path, conf, seed):
    """Native counterpart: the test of this name in tests/fakegpu/test_replay_native_scenarios.py."""
    snap = record(random_workload(seed, 2500), conf, capacity=4 * GiB)
    # The card's size: expandable segments reserve 9/8 of it per range, which fixes where the next range begins.
    result = sim.replay(write(tmp_path, snap), capacity="4GiB", history=1 << 20)
    assert result.conf_source == "recorded" and sim.normalize_conf(result.conf) == sim.normalize_conf(conf)
    assert_exact(result, snap)
    replayed = snapshot_from_replay(result)
    assert alloc_addresses(replayed) == alloc_addresses(snap)


@pytest.mark.parametrize("conf", ["", "max_split_size_mb:64", "roundup_power2_divisions:4"])
@pytest.mark.parametrize("cut", [1, 400, 1500, 3000])
def test_run_recorded_mid_way_starts_from_the_rebuilt_state(tmp_path, conf, cut):
    """Native counterpart: the test of this name in tests/fakegpu/test_replay_native_scenarios.py."""
    full = record(random_workload(7, 3000, empty_cache_every=700), conf)
    snap = begin_mid_run(full, cut)
    result = sim.replay(write(tmp_path, snap))
    assert result.start is not None and result.start.segments, "memory was live when recording began"
    assert_exact(result, snap)
    # The rebuilt state is the allocator's state at the cut: same reserved bytes.
    reserved_at_cut = sum(e["size"] * (1 if e["action"] == "segment_alloc" else -1)
                          for e in full["device_traces"][0][:cut] if e["action"] in ("segment_alloc", "segment_free"))
    assert result.start.reserved == reserved_at_cut


def test_mid_run_without_the_start_state_would_not_be_exact(tmp_path):
    """The comparison can fail: the same trace, starting empty, lands elsewhere.

    Native counterpart: the test of this name in tests/fakegpu/test_replay_native_scenarios.py.
    """
    full = record(random_workload(7, 3000), "")
    snap = begin_mid_run(full, 1500)
    result = sim.replay(write(tmp_path, snap))
    assert_exact(result, snap)
    emptied = dict(snap, segments=[])
    path = write(tmp_path, emptied, "empty.pickle")
    with pytest.raises(TraceError, match="lies in no segment|final segments show no live block"):
        sim.replay(path)
    # Read past the entries that refer to the lost state, the replay runs and lands elsewhere.
    lost = sim.replay(path, skip_bad_events=True, history=1 << 20)
    assert not lost.exact
    assert lost.fidelity["placements_differed"] > 0 and lost.fidelity["first_difference"] is not None
    recorded = [(e["size"], e["addr"]) for e in snap["device_traces"][0] if e["action"] == "alloc"]
    replayed = [(e["size"], e["addr"]) for e in snapshot_from_replay(lost)["device_traces"][0]
                if e["action"] == "alloc"]
    assert [size for size, _ in replayed] == [size for size, _ in recorded]  # the same requests, in order
    assert sum(a != b for a, b in zip(replayed, recorded)) > len(recorded) // 10  # many of them elsewhere


def test_oom_is_reproduced_with_the_inferred_capacity(tmp_path):
    """Native counterpart: the test of this name in tests/fakegpu/test_replay_native_scenarios.py."""
    snap = record(random_workload(3, 4000, large=0.5), "", capacity=3 * GiB)
    ooms = [e for e in snap["device_traces"][0] if e["action"] == "oom"]
    assert len(ooms) == 1 and "device_free" in ooms[0]
    for cut in (0, 900):
        result = sim.replay(write(tmp_path, begin_mid_run(snap, cut)))
        assert result.capacity_source == "oom" and result.capacity == 3 * GiB
        assert not result.completed and result.oom["recorded"]
        assert result.oom["size"] == ooms[0]["size"]
        native = result.recorded_oom
        assert native["reproduced"] and native["replay_reserved"] == native["reserved"]
        assert result.to_json()["capacity_source"] == "oom"
    # A bigger card completes the trace: the failed request succeeds and is freed.
    bigger = sim.replay(write(tmp_path, snap), capacity="16GiB")
    assert bigger.completed and bigger.capacity_source == "given"
    assert bigger.fidelity["failed_alloc_succeeded"] is not None
    assert not bigger.recorded_oom["reproduced"]


@pytest.mark.parametrize("cut", [0, 1200])
def test_a_program_that_catches_its_ooms_is_replayed_past_each(tmp_path, cut):
    """Every OOM the program survived is reproduced at its entry, and the trace goes on after it.

    Native counterpart: the test of this name in tests/fakegpu/test_replay_native_scenarios.py.
    """
    full = record(random_workload(11, 4000, large=0.5), "", capacity=1 * GiB, catch_oom=True)
    snap = begin_mid_run(full, cut) if cut else full
    entries = snap["device_traces"][0]
    oom_entries = [i for i, e in enumerate(entries) if e["action"] == "oom"]
    assert len(oom_entries) > 50
    result = sim.replay(write(tmp_path, snap))
    assert_exact(result, snap)
    assert [o["entry"] for o in result.recorded_ooms] == oom_entries
    assert all(o["reproduced"] for o in result.recorded_ooms)
    # It stops at the last OOM only if no request follows it; every allocation before is compared.
    asked_again = any(e["action"] == "alloc" for e in entries[oom_entries[-1]:])
    assert result.completed == asked_again
    assert result.fidelity["placements_matched"] == sum(e["action"] == "alloc" for e in entries[: None if asked_again else oom_entries[-1]])
    # Under other settings the replay stops at the first OOM, as before.
    other = sim.replay(write(tmp_path, snap), conf="max_split_size_mb:64")
    assert not other.completed and other.survived_ooms == []


def remove_fraction(conf: str) -> str:
    return ",".join(i for i in conf.split(",") if i and not i.startswith("per_process_memory_fraction"))


@pytest.mark.parametrize("cut", [0, 900])
def test_an_oom_under_a_memory_fraction_is_reproduced(tmp_path, cut):
    """The GPU had room (device_free) but a memory fraction refused: the replay infers a fraction that refuses.

    Native counterpart: the test of this name in tests/fakegpu/test_replay_native_scenarios.py.
    """
    full = record(random_workload(3, 4000, large=0.5), "", capacity=8 * GiB, fraction=0.3)
    snap = begin_mid_run(full, cut) if cut else full
    oom_entry = next(e for e in snap["device_traces"][0] if e["action"] == "oom")
    assert oom_entry["device_free"] > 4 * GiB  # the card had room
    result = sim.replay(write(tmp_path, snap))
    # The card: reserved + device_free at the OOM; the fraction's limit: at least the recorded one (every
    # segment fit under it), below reserved + the segment refused.
    assert result.capacity_source == "oom" and result.capacity == result.recorded_oom["reserved"] + oom_entry["device_free"]
    assert result.recorded.fraction_from == "inferred"
    limit = int(conf_fraction(result.conf) * result.capacity)
    assert int(0.3 * 8 * GiB) <= limit < result.recorded_oom["reserved"] + oom_entry["size"] + 2 * MiB
    assert_exact(result, snap)
    assert result.recorded_oom["reproduced"]
    # The card alone (no fraction) would not reproduce it.
    roomy = sim.replay(write(tmp_path, snap), conf=remove_fraction(result.conf))
    assert not roomy.recorded_oom["reproduced"]


def test_empty_cache_calls_are_replayed(tmp_path):
    """Native counterpart: the test of this name in tests/fakegpu/test_replay_native_scenarios.py."""
    work = random_workload(5, 2000, empty_cache_every=300)
    snap = record(work, "")
    entries = snap["device_traces"][0]
    releases = sum(e["action"] == "segment_free" for e in entries)
    calls = sum(1 for a, b in zip(entries, entries[1:]) if b["action"] == "segment_free" and a["action"] != "segment_free")
    assert calls >= 3
    result = sim.replay(write(tmp_path, snap))
    assert result.recorded.empty_cache_calls == calls
    assert result.fidelity["releases_made"] == releases and result.fidelity["releases_missed"] == 0
    assert_exact(result, snap)
    # Under other settings the program's calls are replayed as empty_cache().
    other = sim.replay(write(tmp_path, snap), conf="max_split_size_mb:100")
    assert other.fidelity is None and other.replayer.fidelity["empty_cache_calls"] == calls
    # Without them the replay keeps cached segments the GPU released, and drifts.
    frees = [e for e in snap["device_traces"][0] if e["action"] == "segment_free"]
    assert frees
    kept = dict(snap, device_traces=[[e for e in snap["device_traces"][0] if e["action"] != "segment_free"]])
    with pytest.raises(TraceError, match="missing from the final segments|final segments"):
        sim.replay(write(tmp_path, kept, "kept.pickle"))


def test_frees_take_effect_at_free_completed(tmp_path):
    """Two streams; each free is requested right after its block's alloc and completes later, as a
    record_stream free does. Self-recorded: torchmem's simulated allocator has no record_stream, so the
    requests are moved by hand. Native counterpart, with real record_stream and a stream held back:
    tests/fakegpu/test_replay_native_scenarios.py."""
    work = []
    for i in range(40):
        # Even ids on stream 0 are freed a step later; odd ids on stream 1 stay live.
        work += [("alloc", 2 * i, 3 * MiB, 0), ("alloc", 2 * i + 1, 3 * MiB, 1)]
        if i >= 1:
            work.append(("free", 2 * (i - 1)))
    snap = record(work, "")
    entries = snap["device_traces"][0]
    assert {e["stream"] for e in entries if e["action"] == "alloc"} == {0, 1}
    # Move each free_requested back to just after its block's alloc; free_completed stays where it was.
    pending = [e for e in entries if e["action"] == "free_requested"]
    requests = {e["addr"]: [] for e in pending}
    for e in pending:
        requests[e["addr"]].append(e)
    out = []
    for e in entries:
        if e["action"] == "free_requested":
            continue
        out.append(e)
        if e["action"] == "alloc" and requests.get(e["addr"]):
            out.append(requests[e["addr"]].pop(0))
    late = dict(snap, device_traces=[out])
    result = sim.replay(write(tmp_path, late))
    assert_exact(result, late)
    # Freeing at free_requested instead would reuse blocks too early.
    early = dict(late, device_traces=[[e for e in out if e["action"] != "free_completed"]])
    diverged = sim.replay(write(tmp_path, early, "early.pickle"), skip_bad_events=True)
    assert diverged.fidelity["placements_differed"] > 0 and not diverged.exact
    # The second stream matters: the same trace with every block on stream 0 is placed elsewhere too.
    one = dict(late, device_traces=[[dict(e, stream=0) for e in out]],
               segments=[dict(seg, stream=0) for seg in late["segments"]])
    assert sim.replay(write(tmp_path, one, "one.pickle"), skip_bad_events=True).fidelity["placements_differed"] > 0


def test_two_devices_default_to_the_one_with_an_oom(tmp_path):
    """Native counterpart: the test of this name in tests/fakegpu/test_replay_native_scenarios.py."""
    a = record(random_workload(11, 800), "", device=0)
    b = record(random_workload(12, 3000, large=0.6), "", capacity=2 * GiB, device=1)
    both = {"segments": a["segments"] + b["segments"],
            "device_traces": [a["device_traces"][0], b["device_traces"][1]],
            "allocator_settings": a["allocator_settings"]}
    path = write(tmp_path, both)
    result = sim.replay(path)
    assert result.recorded.device == 1 and result.recorded.devices == [(0, len(a["device_traces"][0])),
                                                                       (1, len(b["device_traces"][1]))]
    assert result.recorded_oom["reproduced"]
    first = sim.replay(path, device=0)
    assert first.recorded.device == 0 and first.completed
    assert_exact(first, both, device=0)
    with pytest.raises(TraceError, match="no device 2"):
        sim.replay(path, device=2)


def test_json_snapshot_reads_like_the_pickle(tmp_path):
    """Native counterpart: the test of this name in tests/fakegpu/test_replay_native_scenarios.py."""
    import json

    snap = begin_mid_run(record(random_workload(4, 1500), ""), 600)
    path = tmp_path / "snap.json"
    path.write_text(json.dumps(snap))
    result = sim.replay(str(path))
    assert_exact(result, snap)


def test_other_settings_replay_from_the_same_start_without_following(tmp_path):
    """Native counterpart: the test of this name in tests/fakegpu/test_replay_native_scenarios.py."""
    snap = begin_mid_run(record(random_workload(9, 3000), ""), 1000)
    path = write(tmp_path, snap)
    result = sim.replay(path, conf="expandable_segments:True")
    assert result.fidelity is None and not result.exact
    assert result.start.reserved > 0
    result.replayer.check_invariants()


# --- bad input: a clear error naming the entry, or counted warnings --------------------------------

def _entry(action, addr=1 << 40, size=512, **kw):
    return dict(action=action, addr=addr, size=size, stream=0, time_us=0, frames=[], **kw)


@pytest.mark.parametrize("entries, segments, fragment", [
    ([_entry("teleport")], [], "entry 0: unknown action 'teleport'"),
    ([_entry("oom")], [], "entry 0: oom entry without device_free"),
    ([_entry("alloc", size=0)], [], "entry 0: alloc of 0 bytes"),
    ([_entry("alloc", addr=-5)], [], "entry 0: addr must be a non-negative integer"),
    (["not a dict"], [], "entry 0: not a trace entry"),
    ([_entry("segment_alloc", size=2 * MiB), _entry("alloc")], [],
     "never frees it, but the final segments show no live block there"),
    ([_entry("segment_alloc", size=2 * MiB)], [], "missing from the final segments"),
    ([_entry("free_completed")], [], "lies in no segment that existed then"),
    ([_entry("segment_alloc", size=2 * MiB), _entry("alloc"), _entry("free_completed"), _entry("free_completed")], [],
     "entry 3: free_completed of 0x10000000000, which is not allocated (freed twice)"),
])
def test_bad_snapshots_name_the_entry(tmp_path, entries, segments, fragment):
    path = write(tmp_path, {"segments": segments, "device_traces": [entries]})
    with pytest.raises(TraceError) as info:
        sim.replay(path, "1GiB")
    assert path in str(info.value) and fragment in str(info.value)
    # --skip-bad-events turns each into a counted warning, never a crash.
    result = sim.replay(path, "1GiB", skip_bad_events=True)
    assert any("skipped" in n and "bad trace entries" in n for n in result.notes)


def test_truncated_snapshot_pickle(tmp_path):
    # Self-recorded: what is tested is the reading of a damaged file, not a decision of the allocator.
    data = pickle.dumps(record(random_workload(1, 200), ""))
    path = tmp_path / "t.pickle"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceError, match="truncated file"):
        sim.replay(str(path))


def test_capacity_below_the_start_state_is_a_clear_error(tmp_path):
    # Self-recorded: what is tested is the error on a capacity the start state cannot fit in.
    snap = begin_mid_run(record(random_workload(7, 3000), ""), 2000)
    with pytest.raises(ValueError, match="smaller than the memory held when recording began"):
        sim.replay(write(tmp_path, snap), capacity="64MiB")


def test_expandable_segments_with_empty_cache_unmaps_the_same_pages(tmp_path):
    """Native counterpart: the test of this name in tests/fakegpu/test_replay_native_scenarios.py."""
    snap = record(random_workload(6, 2500, empty_cache_every=400), "expandable_segments:True", capacity=4 * GiB)
    entries = snap["device_traces"][0]
    assert any(e["action"] == "segment_unmap" for e in entries) and any(e["action"] == "segment_map" for e in entries)
    result = sim.replay(write(tmp_path, snap), capacity="4GiB")
    assert_exact(result, snap)
    assert result.fidelity["releases_made"] == sum(e["action"] == "segment_unmap" for e in entries)


@pytest.mark.parametrize("seed, empty_cache_every", [(6, 0), (8, 300)])
def test_expandable_segments_begun_mid_run_replay_exactly(tmp_path, seed, empty_cache_every):
    """Native counterpart: test_expandable_segments_begun_mid_run_rebuild_their_ranges in
    tests/fakegpu/test_replay_native_scenarios.py."""
    full = record(random_workload(seed, 2500, empty_cache_every=empty_cache_every), "expandable_segments:True",
                  capacity=4 * GiB)
    for cut in (300, 1200, 2000):
        snap = begin_mid_run(full, cut)
        result = sim.replay(write(tmp_path, snap), capacity="4GiB")
        # The pages mapped when recording began: the final ones with the trace's maps undone.
        mapped = sum(e["size"] * (1 if e["action"] == "segment_map" else -1)
                     for e in full["device_traces"][0][:cut] if e["action"] in ("segment_map", "segment_unmap"))
        assert result.start.reserved == mapped and result.start.ranges
        # No stacks recorded: a retry may read as the program's empty_cache(), and the replay says so; nothing else.
        assert all("the snapshot cannot tell" in n for n in result.notes), result.notes
        assert_exact(result, snap)
        if result.recorded_oom is not None:
            assert result.recorded_oom["reproduced"]


@pytest.mark.parametrize("card_gib, cut", [(24, 0), (24, 1500), (40, 0), (141, 800)])
def test_expandable_card_size_is_inferred_from_the_recorded_ranges(tmp_path, card_gib, cut):
    """No OOM and no --capacity: the ranges' spacing tells the card, and the replay stays exact.

    Native counterpart: the test of this name in tests/fakegpu/test_replay_native_scenarios.py.
    """
    full = record(random_workload(3, 3000, streams=2), "expandable_segments:True", capacity=card_gib * GiB)
    snap = begin_mid_run(full, cut) if cut else full
    path = write(tmp_path, snap)
    result = sim.replay(path)
    if card_gib < 80:
        assert result.capacity_source == "expandable"
        assert abs(result.capacity - card_gib * GiB) <= 20 * MiB
    else:  # an 80 GiB card's ranges fit between these: the default stays
        assert result.capacity_source == "default" and result.capacity == 80 * GiB
    assert_exact(result, snap)
    # The inference matters: an 80 GiB card's ranges (90 GiB each) cover the next recorded range.
    if card_gib < 80:
        assert not sim.replay(path, capacity="80GiB").exact


def test_one_expandable_range_keeps_the_default_capacity(tmp_path):
    """Native counterpart: the test of this name in tests/fakegpu/test_replay_native_scenarios.py."""
    small_only = [("alloc", i, 4096 * (i % 200 + 1), 0) for i in range(600)] + [("free", i) for i in range(0, 600, 3)]
    snap = record(small_only, "expandable_segments:True", capacity=24 * GiB)
    result = sim.replay(write(tmp_path, snap))
    assert result.capacity_source == "default" and result.capacity == 80 * GiB
    assert_exact(result, snap)


def test_a_run_that_held_more_than_80_gib_replays_on_what_it_held(tmp_path):
    """No OOM on a 141 GiB card: the default capacity grows to the recording's peak, not an OOM at 80 GiB.

    Native counterpart: the test of this name in tests/fakegpu/test_replay_native_scenarios.py.
    """
    big = [("alloc", i, 10 * GiB, 0) for i in range(10)] + [("free", i) for i in range(10)]
    snap = record(big + random_workload(4, 500), "", capacity=141 * GiB)
    result = sim.replay(write(tmp_path, snap))
    reserved = peak = 0
    for e in snap["device_traces"][0]:
        if e["action"] in ("segment_alloc", "segment_free"):
            reserved += e["size"] if e["action"] == "segment_alloc" else -e["size"]
            peak = max(peak, reserved)
    assert peak > 100 * GiB
    assert result.capacity_source == "default" and result.capacity == peak
    assert result.completed and result.oom is None
    assert_exact(result, snap)


@pytest.mark.parametrize("conf", ["max_split_size_mb:64,max_non_split_rounding_mb:128",
                                  "large_segment_size_mb:64", "expandable_segments:True,large_segment_size_mb:64"])
def test_settings_without_a_field_come_from_the_recorded_conf_string(tmp_path, conf):
    """allocator_settings has no field for these keys: its PYTORCH_CUDA_ALLOC_CONF string gives them.

    Native counterpart: the test of this name in tests/fakegpu/test_replay_native_scenarios.py.
    """
    snap = record(random_workload(5, 3000, large=0.6), conf, capacity=8 * GiB)
    result = sim.replay(write(tmp_path, snap), capacity="8GiB")
    assert sim.normalize_conf(result.conf) == sim.normalize_conf(conf)
    assert_exact(result, snap)
    # They matter: without them the same trace is placed elsewhere.
    dropped = dict(snap, allocator_settings=dict(snap["allocator_settings"], PYTORCH_CUDA_ALLOC_CONF=""))
    assert not sim.replay(write(tmp_path, dropped, "dropped.pickle"), capacity="8GiB").exact


def test_expandable_range_that_cannot_be_rebuilt_falls_back_to_fixed_segments(tmp_path):
    # Hand-made: PyTorch never records two runs of one range 100 GiB apart; the fallback is torchmem's own.
    # Two mapped runs of one stream and pool, 100 GiB apart: no range of 9/8 of an 8 GiB card holds both.
    base = 1 << 44
    segs = [{"address": a, "total_size": 20 * MiB, "stream": 0, "segment_type": "large", "is_expandable": True,
             "blocks": [{"address": a, "size": 4 * MiB, "requested_size": 4 * MiB, "state": "active_allocated"},
                        {"address": a + 4 * MiB, "size": 16 * MiB, "requested_size": 0, "state": "inactive"}]}
            for a in (base, base + 100 * GiB)]
    snap = {"segments": segs, "device_traces": [[]],
            "allocator_settings": {"expandable_segments": True, "max_split_size": -1}}
    result = sim.replay(write(tmp_path, snap), capacity="8GiB")
    assert any("rebuilt as fixed segments" in n for n in result.notes)
    assert result.start.reserved == 40 * MiB and result.stats["allocated_bytes"]["all"]["current"] == 8 * MiB
    result.replayer.check_invariants()


@pytest.mark.parametrize("conf", ["", "expandable_segments:True"])
def test_a_snapshot_without_history_rebuilds_its_final_state(tmp_path, conf):
    """torch.cuda.memory_snapshot() without _record_memory_history(): segments only, no trace.

    Native counterpart: the test of this name in tests/fakegpu/test_replay_native_scenarios.py.
    """
    full = record(random_workload(3, 3000, streams=2), conf, capacity=24 * GiB)
    snap = dict(full, device_traces=[[]])
    path = write(tmp_path, snap)
    result = sim.replay(path)
    assert result.completed and result.events == 0
    live = sum(b["size"] for s in full["segments"] for b in s["blocks"] if b["state"] == "active_allocated")
    assert result.stats["allocated_bytes"]["all"]["current"] == live
    assert segment_layout(snapshot_from_replay(result)["segments"]) == segment_layout(full["segments"])
    proc = ok(torchmem_here("replay", path))
    assert "The snapshot has no trace" in proc.stdout


def test_pools_taken_from_the_final_segments_are_named_in_the_notes(tmp_path):
    # Self-recorded, a pool set by hand on one final segment, as torch 2.11 records pools (no pool_id in
    # the trace). Native snapshots with CUDA graphs and MemPools: tests/fakegpu/test_replay_private_pools.py.
    snap = record(random_workload(3, 600), "", capacity=4 * GiB)
    for seg in snap["segments"]:
        seg["segment_pool_id"] = (0, 0)
    assert not any("private pools" in n for n in sim.replay(write(tmp_path, snap)).notes)
    pooled = next(seg for seg in snap["segments"] if any(b["state"] == "active_allocated" for b in seg["blocks"]))
    pooled["segment_pool_id"] = (1, 0)
    result = sim.replay(write(tmp_path, snap, "pooled.pickle"))
    assert any(n.startswith("1 private pool ") and "final segment" in n for n in result.notes), result.notes
    assert (1, 0) in {tuple(seg["segment_pool_id"]) for seg in result.segments}
