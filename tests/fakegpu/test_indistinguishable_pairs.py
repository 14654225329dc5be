"""Pairs of native runs whose snapshots are equal, yet PyTorch continued them differently.

Each pair (tests.support.indistinguishable) runs under PyTorch's own
allocator on the fake GPU. The test holds it to what makes it a proof that
the snapshot cannot tell the two runs apart: equal snapshots (but for
timestamps), different outcomes, and a replay that is exact on at most one
of them, where the other shows the pair's named deviation.
"""
from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch

from tests.support import oracle
from tests.support.deviations import DEVIATIONS, classify
from tests.support.indistinguishable import PAIRS, Pair, first_difference, snapshot_view


def _native(workloads: list[oracle.Workload], folder: Path) -> tuple[list[dict], list[dict]]:
    reports = oracle.run_native(workloads, folder)
    for report in reports:
        assert "error" not in report, report["error"]
    snapshots = [pickle.loads((folder / f"{i}.pickle").read_bytes()) for i in range(len(workloads))]
    return reports, snapshots


def _skip_before(pair: Pair) -> None:
    release = tuple(int(x) for x in torch.__version__.split(".")[:2])
    if release < pair.since:
        pytest.skip(f"torch {torch.__version__}'s allocator does not behave so; the pair holds from "
                    f"torch {pair.since[0]}.{pair.since[1]}")


def _last_alloc(snapshot: dict) -> tuple[int, int]:
    entry = [e for e in snapshot["device_traces"][0] if e["action"] == "alloc"][-1]
    return entry["addr"], entry["size"]


@pytest.mark.parametrize("pair", PAIRS, ids=[f"{p.deviation}-{i}" for i, p in enumerate(PAIRS)])
def test_pair_leaves_one_snapshot_and_two_outcomes(pair: Pair, tmp_path):
    _skip_before(pair)
    (tmp_path / "full").mkdir()
    reports, snapshots = _native([pair.first, pair.second], tmp_path / "full")
    if pair.same_snapshot:
        assert first_difference(snapshot_view(snapshots[0]), snapshot_view(snapshots[1])) is None
        first, second = reports[0]["stats"][pair.differs_in], reports[1]["stats"][pair.differs_in]
        assert first != second, f"both runs report {pair.differs_in} {first}"
    else:
        (tmp_path / "prefix").mkdir()
        _, before = _native(list(pair.prefixes()), tmp_path / "prefix")
        assert first_difference(snapshot_view(before[0]), snapshot_view(before[1])) is None
        # The full runs went on from that state: the last allocation, of one size, at two addresses.
        (addr_a, size_a), (addr_b, size_b) = _last_alloc(snapshots[0]), _last_alloc(snapshots[1])
        assert size_a == size_b and addr_a != addr_b
    # One snapshot, one replay: it is exact on at most one run, and the other shows the pair's deviation.
    problems = [oracle.compare(tmp_path / "full" / f"{i}.pickle", r, w)
                for i, (w, r) in enumerate(zip([pair.first, pair.second], reports))]
    assert sum(1 for p in problems if not p) <= 1, problems
    for w, p in zip([pair.first, pair.second], problems):
        if p:
            deviation = classify(w, p)
            assert deviation is not None and deviation.name == pair.deviation, p


NOTE_OF = {"retry-count": "the snapshot cannot tell", "mid-way-segment-age": "equal free blocks lay in two segments"}


@pytest.mark.parametrize("pair", PAIRS, ids=[f"{p.deviation}-{i}" for i, p in enumerate(PAIRS)])
def test_the_replay_says_where_it_cannot_tell(pair: Pair, tmp_path):
    """Where the snapshot cannot tell the runs apart, the replay's notes say so at an entry of the trace."""
    from torchmem.replay.runner import replay

    _skip_before(pair)
    _native([pair.first], tmp_path)
    result = replay(str(tmp_path / "0.pickle"))
    found = [n for n in result.notes if NOTE_OF[pair.deviation] in n]
    assert found and found[0].startswith("entry "), result.notes


def test_every_pair_names_a_deviation():
    names = {d.name for d in DEVIATIONS}
    assert {p.deviation for p in PAIRS} <= names
