"""The planner with several streams: liveness extended by reads in flight on
other streams, every method and sharing checked against brute-force liveness,
the lower bound checked against brute-force optima, CSV columns, the fx
frontend's stream assignment, bad input."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
import torch.fx
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from tests.support.brute_streams import all_syncs, brute_before, brute_optimal_height, brute_valid, live_at_once, \
    random_stream_buffers
from torchmem.plan import Buffer, Sync, lifetimes, load_csv, lower_bound, save_csv, solve
from torchmem.plan.fx import analyze, plan_graph

METHODS = ["naive", "greedy", "sweep", "bottom_up", "portfolio", "search", "auto"]
SHARINGS = ["shared", "per_stream", "auto"]


def side_read() -> list[Buffer]:
    """x (stream 0, steps 0-1) is read on stream 1 at step 4; stream 1 syncs
    back to stream 0 before step 6. y and z are produced on stream 0 at 5 and 6."""
    return [
        Buffer("x", 0, 2, 64, 0, [(1, 4)], [Sync(0, 0, 1, 4), Sync(1, 4, 0, 6)]),
        Buffer("y", 5, 7, 64, 0),
        Buffer("z", 6, 8, 64, 0),
    ]


def test_a_read_in_flight_keeps_the_buffer_until_the_sync_back() -> None:
    bs = side_read()
    life = lifetimes(bs)
    assert life[0].own == 6  # the sync back, not the last use on stream 0 (step 1)
    assert [lt.own for lt in life[1:]] == [7, 8]
    plan = solve(bs, method="search")
    assert plan.validate() and plan.sharing in ("shared", "per_stream")
    # y may not take x's bytes (x is still being read on stream 1); z may.
    assert plan.offset_of("x") != plan.offset_of("y")
    assert plan.height == plan.lower_bound == 128
    # Without the streams, x ends at 2 and the bound is one buffer lower.
    plain = [Buffer(b.id, b.lower, b.upper, b.size) for b in bs]
    assert lower_bound(plain) == 128 and lower_bound(bs) == 128
    assert lower_bound([plain[0], plain[1]]) == 64 < lower_bound([bs[0], bs[1]]) == 128


def test_plans_that_ignore_the_read_in_flight_are_rejected() -> None:
    bs = side_read()
    plan = solve(bs)
    plan.offsets = [0, 0, 64]  # y on x's bytes while stream 1 may still read x
    assert not plan.validate()
    assert "'x'" in plan.validation_error() and "'y'" in plan.validation_error()
    assert not brute_valid(bs, plan.offsets)
    plan.offsets = [0, 64, 0]  # z on x's bytes: after the sync back, fine
    assert plan.validate() and brute_valid(bs, plan.offsets)


def test_another_allocating_stream_must_also_catch_up() -> None:
    # a lives on stream 0 over [0, 2); b is produced on stream 1 at step 3 with
    # no sync from stream 0: they may run at once, so they may not share.
    a, b = Buffer("a", 0, 2, 8, 0), Buffer("b", 3, 5, 8, 1)
    plan = solve([a, b], method="search")
    assert plan.height == 16 and plan.validate()
    with_sync = [Buffer("a", 0, 2, 8, 0, syncs=[Sync(0, 1, 1, 3)]), b]
    plan = solve(with_sync, method="search", sharing="shared")
    assert plan.height == 8 and plan.validate()
    assert brute_valid(with_sync, plan.offsets)


@pytest.mark.parametrize("seed", range(12))
def test_every_method_and_sharing_is_valid_on_random_schedules(seed: int) -> None:
    rng = random.Random(seed)
    bs = random_stream_buffers(rng, rng.randint(1, 14), rng.randint(1, 3))
    lb = lower_bound(bs)
    for method in METHODS:
        for sharing in SHARINGS:
            alignment = rng.choice([1, 4])
            plan = solve(bs, method=method, sharing=sharing, time_limit=0.3, alignment=alignment)
            sizes = [-(-b.size // alignment) * alignment for b in bs]
            assert brute_valid(bs, plan.offsets, sizes), (method, sharing, plan.offsets)
            assert plan.validate(), plan.validation_error()
            assert plan.height >= plan.lower_bound
            if alignment == 1:
                assert plan.lower_bound == lb


@pytest.mark.parametrize("seed", range(25))
def test_lower_bound_is_below_the_brute_force_optimum(seed: int) -> None:
    rng = random.Random(100 + seed)
    bs = random_stream_buffers(rng, rng.randint(2, 6), rng.randint(2, 3), horizon=10)
    optimum = brute_optimal_height(bs)
    assert lower_bound(bs) <= optimum
    plan = solve(bs, method="search", time_limit=2)
    assert optimum <= plan.height
    if plan.optimal:
        assert plan.height == optimum


def test_the_bound_counts_only_buffers_that_are_live_at_once() -> None:
    rng = random.Random(5)
    for _ in range(20):
        bs = random_stream_buffers(rng, 12, 3)
        syncs = all_syncs(bs)
        life = lifetimes(bs)
        for t in {b.lower for b in bs}:
            at = [b for b, lt in zip(bs, life) if b.lower <= t < lt.bound and b.size > 0]
            assert all(live_at_once(syncs, a, b) for i, a in enumerate(at) for b in at[i + 1:])


def test_validate_agrees_with_brute_force_on_random_placements() -> None:
    rng = random.Random(9)
    for _ in range(40):
        bs = random_stream_buffers(rng, rng.randint(1, 10), 3)
        plan = solve(bs, method="greedy")
        for _ in range(5):
            plan.offsets = [rng.randrange(0, 120) for _ in bs]
            assert plan.validate() == brute_valid(bs, plan.offsets)


def test_happens_before_matches_brute_force() -> None:
    from torchmem import _core

    rng = random.Random(3)
    for _ in range(30):
        syncs = []
        for _ in range(rng.randint(0, 10)):
            a, b = rng.sample(range(4), 2)
            after = rng.randrange(20)
            syncs.append(Sync(a, after, b, after + rng.randint(1, 6)))
        queries = [(rng.randrange(4), rng.randrange(30), rng.randrange(4), rng.randrange(30)) for _ in range(60)]
        got = _core.planner.happens_before([tuple(s) for s in syncs], queries)
        assert got == [brute_before(syncs, *q) for q in queries]


def test_one_stream_input_is_planned_as_before() -> None:
    bs = [Buffer(i, i % 7, i % 7 + 1 + i % 5, 16 * (1 + i * 7 % 11)) for i in range(40)]
    for method in ("greedy", "sweep", "bottom_up"):
        assert solve(bs, method=method).height == solve(bs, method=method, sharing="per_stream").height
    assert solve(bs).sharing == ""


@st.composite
def schedules(draw):
    seed = draw(st.integers(0, 10**6))
    n = draw(st.integers(0, 16))
    streams = draw(st.integers(1, 4))
    return random_stream_buffers(random.Random(seed), n, streams)


@settings(max_examples=60, deadline=None)
@given(schedules(), st.sampled_from(["greedy", "sweep", "bottom_up", "portfolio", "auto"]),
       st.sampled_from(SHARINGS))
def test_property_plans_respect_stream_liveness(bs, method: str, sharing: str) -> None:
    plan = solve(bs, method=method, sharing=sharing, time_limit=0.2)
    assert brute_valid(bs, plan.offsets)
    assert plan.validate()
    assert plan.height >= plan.lower_bound == lower_bound(bs)


@pytest.mark.parametrize(
    "bs, message",
    [
        ([Buffer("x", 0, 2, 8, 0, [(1, 4)])], r"buffer 'x' is read on stream 1 at step 4, but no synchronisation"),
        ([Buffer("x", 0, 2, 8, 0, [(1, 4)], [Sync(0, 0, 1, 4)])], r"buffer 'x' .*could never be released"),
        ([Buffer("x", 0, 2, 8, 0, [(1, 4)], [Sync(0, 0, 1, 4), Sync(1, 6, 0, 6)])], "after < before"),
        ([Buffer("x", 0, 2, 8, 0, [], [Sync(1, 2, 1, 4)])], "cannot wait for itself"),
        ([Buffer("x", 3, 5, 8, 0, [(0, 1)])], r"buffer 'x' is read on stream 0 at step 1, before its producer"),
    ],
)
def test_bad_schedules_name_the_buffer(bs, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        solve(bs)
    with pytest.raises(ValueError, match=message):
        lower_bound(bs)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"stream": -1}, "stream must be in"),
        ({"stream": 1.5}, "stream must be an integer"),
        ({"reads": [(1,)]}, r"a read must be \(stream, step\)"),
        ({"reads": "1@x"}, "bad read"),
        ({"syncs": [(0, 1, 2)]}, r"a sync must be \(src, after, dst, before\)"),
        ({"syncs": "0@1-1@2"}, "bad sync"),
    ],
)
def test_bad_stream_fields_raise_value_error(kwargs, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Buffer("x", 0, 2, 8, **kwargs)


def test_unknown_sharing() -> None:
    with pytest.raises(ValueError, match="unknown sharing"):
        solve(side_read(), sharing="sometimes")


def test_csv_stream_columns_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "streams.csv"
    path.write_text("id,lower,upper,size,stream,reads,syncs\n"
                    "x,0,2,64,0,1@4,0@0>1@4;1@4>0@6\n"
                    "y,5,7,64,0,,\n"
                    "z,6,8,64,1,,\n")
    bs = load_csv(path)
    assert bs[0].reads == ((1, 4),) and bs[0].syncs == (Sync(0, 0, 1, 4), Sync(1, 4, 0, 6))
    assert bs[2].stream == 1
    plan = solve(bs)
    out = tmp_path / "solution.csv"
    save_csv(plan, out)
    assert out.read_text().splitlines()[0] == "id,lower,upper,size,offset,stream,reads,syncs"
    again = load_csv(out)
    assert again == bs


def test_old_csv_files_still_load(tmp_path: Path) -> None:
    path = tmp_path / "old.csv"
    path.write_text("id,lower,upper,size,offset\n1,0,3,4,0\n2,3,9,4,0\n")
    bs = load_csv(path)
    assert [(b.id, b.stream, b.reads, b.syncs) for b in bs] == [(1, 0, (), ()), (2, 0, (), ())]


@pytest.mark.parametrize(
    "row, message",
    [
        ("x,0,2,8,one,,", ":2: stream must be an integer"),
        ("x,0,2,8,0,1-4,", ":2: bad read"),
        ("x,0,2,8,0,,0@1>1", ":2: bad sync"),
        ("x,0,2,8,-3,,", ":2: buffer 'x': stream must be in"),
    ],
)
def test_malformed_stream_columns_name_the_line(tmp_path: Path, row: str, message: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text("id,lower,upper,size,stream,reads,syncs\n" + row + "\n")
    with pytest.raises(ValueError, match=message):
        load_csv(path)


class Branches(nn.Module):
    def forward(self, x):
        a1 = x * 2
        b1 = x * 3          # on stream 1
        a2 = a1.sum(dim=1)
        b2 = b1.sum(dim=1)  # on stream 1
        return a2 + b2


def test_fx_stream_assignment_per_node() -> None:
    gm = torch.fx.symbolic_trace(Branches())
    a = analyze(gm, torch.randn(64, 64))
    streams = {"mul_1": 1, "sum_2": 1}
    bs = {b.id: b for b in a.buffers(streams=streams)}
    assert bs["mul_1"].stream == 1 and bs["sum_2"].stream == 1 and bs["mul"].stream == 0
    assert bs["sum_2"].reads and bs["sum_2"].reads[0].stream == 0  # read by the add on stream 0
    syncs = all_syncs(list(bs.values()))
    assert Sync(0, a.names.index("x"), 1, a.names.index("mul_1")) in syncs  # stream 1 waits for the input
    gp = plan_graph(gm, analysis=a, streams=streams)
    assert gp.plan.validate() and brute_valid(gp.plan.buffers, gp.plan.offsets)
    single = plan_graph(gm, analysis=a)
    assert gp.plan.lower_bound >= single.plan.lower_bound
    with pytest.raises(ValueError, match="node 'nope'"):
        a.buffers(streams={"nope": 1})
    with pytest.raises(ValueError, match="stream must be in"):
        a.buffers(streams={"mul_1": -1})


def test_fx_every_node_on_its_own_stream_stays_valid() -> None:
    gm = torch.fx.symbolic_trace(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16), nn.Tanh()))
    a = analyze(gm, torch.randn(8, 16))
    streams = {name: k % 3 for k, name in enumerate(a.names)}
    bs = a.buffers(streams=streams)
    for sharing in SHARINGS:
        plan = solve(bs, sharing=sharing)
        assert plan.validate() and brute_valid(bs, plan.offsets)


def test_cli_reports_streams(tmp_path: Path, capsys) -> None:
    from torchmem.cli import main

    path = tmp_path / "s.csv"
    path.write_text("id,lower,upper,size,stream,reads,syncs\nx,0,2,64,0,1@4,0@0>1@4;1@4>0@6\ny,5,7,64,0,,\n")
    assert main(["plan", str(path), "--json", "--quiet", "--sharing", "per_stream"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["streams"] == [0, 1] and out["sharing"] == "per_stream" and out["valid"] is True
    assert out["height"] == out["lower_bound"] == 128
    bad = tmp_path / "bad.csv"
    bad.write_text("id,lower,upper,size,stream,reads,syncs\nx,0,2,64,0,1@4,\n")
    assert main(["plan", str(bad)]) == 1
    assert "buffer 'x' is read on stream 1" in capsys.readouterr().err
    assert main(["plan", str(path), "--stages", "2"]) == 2  # a bad argument for a CSV
    assert ".pt2" in capsys.readouterr().err
