"""torchmem advise: the least memory each setting needs, and the setting that avoids an OOM."""
import gzip
import json
import pickle
from pathlib import Path

import pytest

from tests.support.replay_recording import GiB, begin_mid_run, random_workload, record
from torchmem.replay import workloads
from torchmem import replay as sim
from torchmem.cli import main
from torchmem.replay import advise, snapshot_trace
from torchmem.replay.advise import GRID

NATIVE = Path(__file__).parents[1] / "data" / "native"


def check_min_capacity_holds(trace, rows):
    for row in rows:
        assert row.min_capacity is not None and row.min_capacity % GRID == 0
        at = sim.replay(trace, row.min_capacity, row.conf)
        assert at.completed, row
        below = row.min_capacity - GRID
        if below > 0:
            try:
                failed = not sim.replay(trace, below, row.conf).completed
            except ValueError:  # the start state alone does not fit
                failed = True
            assert failed, f"{row.conf}: completes 2 MiB below its min_capacity"


def test_fragmentation_oom_is_avoided_by_another_setting():
    trace = workloads.fragmenting_training()
    rows = advise(trace, "80GiB", combine=2)
    by_conf = {r.conf: r for r in rows}
    default = by_conf[""]
    assert not default.recorded and not default.completes  # the demo's OOM at 80 GiB; events carry no settings
    best = rows[0]
    assert best.completes and best.min_capacity < default.min_capacity
    assert [r.min_capacity for r in rows] == sorted(r.min_capacity for r in rows)
    check_min_capacity_holds(trace, rows)


def test_snapshot_recorded_mid_run_with_an_oom(tmp_path):
    """Native counterpart: test_advise_on_a_native_snapshot_recorded_mid_run_with_an_oom in
    tests/fakegpu/test_replay_native_scenarios.py."""
    snap = begin_mid_run(record(random_workload(3, 4000, large=0.5), "", capacity=3 * GiB), 700)
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(snap))
    trace = sim.load_trace(str(path))
    rows = advise(trace, combine=0)
    assert all(r.capacity == 3 * GiB for r in rows)  # the capacity the OOM implies
    recorded = next(r for r in rows if r.recorded)
    assert not recorded.completes and recorded.min_capacity > 3 * GiB
    check_min_capacity_holds(trace, rows)


def test_native_fixture_needs_more_than_its_card():
    with gzip.open(NATIVE / "nesta_gitu.json.gz", "rt") as f:
        trace = snapshot_trace(json.load(f), "nesta")
    rows = advise(trace, combine=0)
    assert not any(r.completes for r in rows)  # live tensors alone exceed the card: no setting helps
    check_min_capacity_holds(trace, rows[:3])


def test_cli_json_lists_settings_best_first(tmp_path, capsys):
    snap = record(random_workload(2, 1500), "")
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(snap))
    assert main(["advise", str(path), "--json", "--try", "max_split_size_mb:32"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {"conf", "min_capacity", "peak_reserved", "completes"} <= set(rows[0])
    assert any(r["conf"] == "max_split_size_mb:32" for r in rows)
    assert [r["min_capacity"] for r in rows] == sorted(r["min_capacity"] for r in rows)


def test_cli_text(tmp_path, capsys):
    path = tmp_path / "t.pickle"
    path.write_bytes(pickle.dumps(record(random_workload(3, 4000, large=0.5), "", capacity=3 * GiB)))
    assert main(["advise", str(path), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "Least memory each setting needs" in out and "[the run's]" in out and "expandable_segments:True" in out


@pytest.mark.parametrize("argv, status, fragment", [
    (["advise", "{d}/none.pickle"], 1, "no such file"),
    (["advise", "{d}/s.pickle", "--try", "max_split_size_mb:x"], 2, "argument --try: allocator config: bad value 'x'"),
    (["advise", "{d}/s.pickle", "--capacity", "lots"], 2, "argument --capacity: 'lots' is not a size"),
    (["advise", "{d}/s.pickle", "--device", "3"], None, "no device 3"),
])
def test_cli_bad_input(tmp_path, capsys, argv, status, fragment):
    (tmp_path / "s.pickle").write_bytes(pickle.dumps(record(random_workload(1, 200), "")))
    try:
        got = main([a.replace("{d}", str(tmp_path)) for a in argv] + ["--no-progress"])
    except SystemExit as exc:  # argparse: a bad option
        got = exc.code
    assert got == status if status is not None else got in (1, 2)
    err = capsys.readouterr().err
    assert fragment in err and len(err.strip().splitlines()) == 1


def test_other_settings_over_a_rebuilt_start_never_corrupt_the_allocator(tmp_path):
    """A start state made under one setting, replayed under others near the OOM (found a crash once:
    max_split_size_mb released a split block of the rebuilt state as if it were a whole segment).

    Native counterpart: test_other_settings_over_a_native_start_never_corrupt_the_allocator in
    tests/fakegpu/test_replay_native_scenarios.py.
    """
    from torchmem.replay import candidates

    snap = begin_mid_run(record(random_workload(3, 4000, large=0.5), "", capacity=3 * GiB), 700)
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(snap))
    trace = sim.load_trace(str(path))
    # Every capacity tried holds the start state (1.7 GiB), so every replay must run: one that raises fails.
    assert trace.start.reserved < 3 * GiB - 300 * (1 << 20)
    outcomes = {}
    for conf in candidates(""):
        for capacity in range(3 * GiB - 300 * (1 << 20), 3 * GiB + 300 * (1 << 20), 26 * (1 << 20)):
            result = sim.replay(trace, capacity, conf)
            result.replayer.check_invariants()
            outcomes.setdefault(conf, set()).add(result.completed)
    # Near the OOM: under the recorded setting some of these capacities run out of memory and some complete.
    assert outcomes[""] == {True, False}
    assert len(outcomes) == len(candidates("")) > 1


def _release_before_a_segment(stacks: bool) -> dict:
    """A 600 MiB segment freed and released, then a 700 MiB segment: without Python stacks the release may
    have been the program's empty_cache() or the allocator's retry (tests/support/indistinguishable.py)."""
    MiB, low, high = 1 << 20, 0x7F0000000000, 0x7F0040000000
    frames = [{"filename": "train.py", "line": 1, "name": "step"}] if stacks else []
    entry = lambda action, addr, size: {"action": action, "addr": addr, "size": size * MiB, "stream": 0,
                                        "frames": frames}
    trace = [entry("segment_alloc", low, 600), entry("alloc", low, 600), entry("free_requested", low, 600),
             entry("free_completed", low, 600), entry("segment_free", low, 600), entry("segment_alloc", high, 700),
             entry("alloc", high, 700)]
    segment = {"address": high, "total_size": 700 * MiB, "stream": 0, "segment_type": "large", "device": 0,
               "allocated_size": 700 * MiB, "active_size": 700 * MiB, "requested_size": 700 * MiB,
               "blocks": [{"address": high, "size": 700 * MiB, "requested_size": 700 * MiB,
                           "state": "active_allocated"}]}
    return {"segments": [segment], "device_traces": [trace], "allocator_settings": {}}


@pytest.mark.parametrize("stacks", [False, True])
def test_advise_marks_every_row_where_the_recording_could_not_settle_a_release(stacks):
    from torchmem.replay.advise import search
    from torchmem.replay.advise_words import verdict

    trace = snapshot_trace(_release_before_a_segment(stacks), "snap")
    rows = [search(trace, conf, capacity="1GiB") for conf in ("", "max_split_size_mb:64")]
    assert all(r.guessed_at == (None if stacks else 5) for r in rows)
    assert all(("[guess]" in r.summary()) != stacks for r in rows)
    marked = [line for line in verdict(rows) if "[guess]" in line]
    assert marked == ([] if stacks else [
        "Rows marked [guess] rest on a choice the snapshot cannot settle, first at entry 5: whether a run of "
        "releases before a new segment was an allocation retry."])
