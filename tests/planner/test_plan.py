"""The static memory planner: solve(), loaders, bad input, the command line."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.support.subprocess_runner import torchmem_here
from torchmem.plan import Buffer, buffers_from_trace, load_csv, lower_bound, save_csv, solve

DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "dsa"
if not DATA.exists():
    DATA = Path("/work/shared/data/dsa")
EXAMPLE = DATA / "minimalloc" / "examples" / "input.12.csv"
CHALLENGING = DATA / "minimalloc" / "challenging"
needs_data = pytest.mark.skipif(not EXAMPLE.exists(), reason="shared planning data not present")


def brute_force_height(buffers: list[Buffer]) -> int:
    """Optimal height by trying every order of the bottom-up placement
    (canonical placements are reached by some order); tiny inputs only."""
    import itertools

    best = None
    for perm in itertools.permutations(range(len(buffers))):
        offsets = [0] * len(buffers)
        for k, i in enumerate(perm):
            b = buffers[i]
            top = 0
            for j in perm[:k]:
                o = buffers[j]
                if o.lower < b.upper and b.lower < o.upper:
                    top = max(top, offsets[j] + o.size)
            offsets[i] = top
        h = max(off + b.size for off, b in zip(offsets, buffers))
        best = h if best is None else min(best, h)
    return best


def test_five_buffer_example_is_placed_at_height_12() -> None:
    bs = [Buffer("b1", 0, 3, 4), Buffer("b2", 3, 9, 4), Buffer("b3", 0, 9, 4), Buffer("b4", 9, 21, 4),
          Buffer("b5", 0, 21, 4)]
    plan = solve(bs)
    assert plan.height == 12 and plan.lower_bound == 12 and plan.optimal
    assert plan.validate()
    # b1 and b2 share bytes (b1 ends when b2 starts).
    assert plan.offset_of("b1") == plan.offset_of("b2") or plan.offset_of("b4") in (plan.offset_of("b1"),
                                                                                    plan.offset_of("b2"))


@pytest.mark.parametrize("method", ["naive", "greedy", "sweep", "bottom_up", "portfolio", "search", "auto"])
def test_every_method_gives_a_valid_plan_not_below_the_bound(method: str) -> None:
    bs = [Buffer(i, i % 7, i % 7 + 1 + i % 5, 16 * (1 + i * 7 % 11)) for i in range(60)]
    plan = solve(bs, method=method, time_limit=2)
    assert plan.validate()
    assert plan.height >= plan.lower_bound == lower_bound(bs)
    if method == "naive":
        assert plan.height == sum(b.size for b in bs)


def test_search_matches_brute_force_on_small_instances() -> None:
    import random

    rng = random.Random(7)
    for _ in range(25):
        n = rng.randint(2, 6)
        bs = []
        for i in range(n):
            lo = rng.randint(0, 5)
            bs.append(Buffer(i, lo, lo + rng.randint(1, 4), rng.choice([1, 2, 3, 5, 8])))
        plan = solve(bs, method="search", time_limit=5)
        assert plan.validate()
        assert plan.optimal
        assert plan.height == brute_force_height(bs)


def test_overlap_in_time_means_disjoint_bytes() -> None:
    plan = solve([Buffer("a", 0, 2, 10), Buffer("b", 1, 3, 10), Buffer("c", 2, 4, 10)])
    a, b, c = (plan.offset_of(x) for x in "abc")
    assert abs(a - b) >= 10 and abs(b - c) >= 10
    assert plan.height == 20  # a and c may share bytes: [0,2) and [2,4) do not overlap


def test_alignment_rounds_offsets_and_sizes() -> None:
    bs = [Buffer(i, i, i + 3, 100 + i) for i in range(10)]
    plan = solve(bs, alignment=64)
    assert all(off % 64 == 0 for off in plan.offsets)
    assert plan.validate()
    assert plan.height % 64 == 0 and plan.lower_bound == lower_bound([Buffer(b.id, b.lower, b.upper, 128) for b in bs])


def test_zero_size_buffers_and_empty_input() -> None:
    plan = solve([Buffer("z", 0, 5, 0), Buffer("a", 0, 5, 8)])
    assert plan.height == 8 and plan.validate()
    empty = solve([])
    assert empty.height == 0 and empty.offsets == []


def test_accepts_tuples_and_dicts() -> None:
    plan = solve([("a", 0, 2, 4), {"id": "b", "lower": 1, "upper": 3, "size": 4}])
    assert plan.height == 8


@pytest.mark.parametrize(
    "bad, message",
    [
        ([("a", 0, 2, -1)], "negative size"),
        ([("a", 2, 2, 1)], "lower 2 >= upper 2"),
        ([("a", 3, 1, 1)], "lower 3 >= upper 1"),
        ([("a", 0, 1, 1), ("a", 0, 1, 1)], "duplicate"),
        ([("a", 0, 1.5, 1)], "integer"),
        ([("a", 0, 1)], "expected"),
        ([("a", 0, 1, 2**70)], "63 bits"),
        ([("a", 0, 1, 2**61), ("b", 0, 1, 2**61), ("c", 0, 1, 2**61)], "2\\*\\*62"),
    ],
)
def test_bad_buffers_raise_value_error(bad, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        solve(bad)


@pytest.mark.parametrize("limit", [0, -1, 0.0])
def test_time_limit_must_be_positive(limit) -> None:
    with pytest.raises(ValueError, match="time limit"):
        solve([("a", 0, 1, 1)], time_limit=limit)


def test_unknown_method_and_bad_alignment() -> None:
    with pytest.raises(ValueError, match="unknown method"):
        solve([("a", 0, 1, 1)], method="magic")
    with pytest.raises(ValueError, match="alignment"):
        solve([("a", 0, 1, 1)], alignment=0)


def test_validate_reports_a_conflict() -> None:
    plan = solve([("a", 0, 2, 4), ("b", 1, 3, 4)])
    plan.offsets = [0, 2]
    assert not plan.validate()
    assert "'a'" in plan.validation_error() and "'b'" in plan.validation_error()


@needs_data
def test_csv_round_trip(tmp_path: Path) -> None:
    bs = load_csv(EXAMPLE)
    assert [b.id for b in bs] == ["b1", "b2", "b3", "b4", "b5"]
    plan = solve(bs)
    out = tmp_path / "solution.csv"
    save_csv(plan, out)
    lines = out.read_text().splitlines()
    assert lines[0] == "id,lower,upper,size,offset" and len(lines) == 6
    assert lines[1].startswith("b1,0,3,4,")


@pytest.mark.parametrize(
    "text, where",
    [
        ("id,lower,upper,size\n1,0,3,4\n2,0,x,4\n", ":3:"),
        ("id,lower,upper,size\n1,0,3\n", ":2:"),
        ("id,lower,upper,size\n1,0,3,4\n2,5,3,4\n", ":3:"),
        ("id,lower,upper,size\n1,0,3,-4\n", ":2:"),
        ("id,lower,upper,size\n1,0,3,4\n1,0,3,4\n", ":3:"),
        ("name,start,end,bytes\n1,0,3,4\n", ":1:"),
        ("", "empty"),
    ],
)
def test_malformed_csv_names_the_line(tmp_path: Path, text: str, where: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(ValueError, match=where):
        load_csv(path)


def test_buffers_from_trace() -> None:
    events = [
        {"op": "alloc", "id": 1, "size": 100},
        {"op": "alloc", "id": 2, "size": 50},
        {"op": "free", "id": 1},
        {"op": "alloc", "id": 1, "size": 70},  # id reused after its free
        {"op": "free", "id": 2},
        {"op": "alloc", "id": 3, "size": 10},  # never freed: live to the end
    ]
    bs = buffers_from_trace(events)
    assert {(b.id, b.lower, b.upper, b.size) for b in bs} == {
        (1, 0, 2, 100), (2, 1, 4, 50), ((1, 1), 3, 6, 70), (3, 5, 6, 10)}
    plan = solve(bs)
    assert plan.validate() and plan.height == lower_bound(bs) == 150


@pytest.mark.parametrize(
    "events, message",
    [
        ([{"op": "free", "id": 1}], "not allocated"),
        ([{"op": "alloc", "id": 1, "size": 4}, {"op": "alloc", "id": 1, "size": 4}], "twice"),
        ([{"op": "alloc", "id": 1, "size": -4}], "size"),
        ([{"op": "resize", "id": 1}], "op must be"),
        (["alloc"], "mapping"),
    ],
)
def test_bad_traces_raise_value_error(events, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        buffers_from_trace(events)


@needs_data
@pytest.mark.parametrize("name, height", [("C", 1_039_360), ("F", 1_048_576), ("H", 1_048_576)])
def test_challenging_instances_reach_their_optimum(name: str, height: int) -> None:
    bs = load_csv(CHALLENGING / f"{name}.1048576.csv")
    greedy = solve(bs, method="greedy")
    plan = solve(bs, time_limit=20)
    assert plan.validate()
    assert plan.height == plan.lower_bound == height and plan.optimal
    assert greedy.height > 1.25 * height


def test_fast_methods_scale() -> None:
    import random
    import time

    rng = random.Random(1)
    bs = []
    for i in range(20000):
        lo = rng.randint(0, 40000)
        bs.append(Buffer(i, lo, lo + rng.randint(1, 200), rng.randint(1, 1 << 20)))
    for method in ("greedy", "sweep", "bottom_up"):
        start = time.perf_counter()
        plan = solve(bs, method=method)
        assert time.perf_counter() - start < 5
        assert plan.validate() and plan.height >= plan.lower_bound


def _cli(*args: str) -> subprocess.CompletedProcess:
    return torchmem_here("plan", *args)


@needs_data
def test_cli_json_and_solution_file(tmp_path: Path) -> None:
    out = tmp_path / "sol.csv"
    r = _cli(str(EXAMPLE), "--json", "--out", str(out))
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    assert result["height"] == 12 and result["lower_bound"] == 12 and result["valid"] is True
    assert result["optimal"] is True and "method" in result and result["seconds"] >= 0
    assert out.read_text().startswith("id,lower,upper,size,offset")


def test_cli_errors_are_clear(tmp_path: Path, capsys) -> None:
    from torchmem.cli import main

    bad = tmp_path / "bad.csv"
    bad.write_text("id,lower,upper,size\n1,0,3,4\n2,0,3,oops\n")
    assert main(["plan", str(bad)]) == 1
    assert "bad.csv:3:" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:  # a bad argument: argparse, exit status 2
        main(["plan", str(bad), "--time-limit", "0"])
    assert exit_info.value.code == 2 and "argument --time-limit: must be > 0" in capsys.readouterr().err
    assert main(["plan", str(tmp_path / "missing.csv")]) == 1
    assert "missing.csv" in capsys.readouterr().err


def test_cli_text_output_and_progress(tmp_path: Path, capsys) -> None:
    from torchmem.cli import main

    path = tmp_path / "x.csv"
    path.write_text("id,lower,upper,size\na,0,2,8\nb,1,3,8\nc,2,4,8\n")
    assert main(["plan", str(path), "--method", "search"]) == 0
    out, err = capsys.readouterr()
    assert "height       16" in out and "valid        True" in out
    assert "height 16" in err  # a progress line on stderr
