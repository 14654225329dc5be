"""Private pools in the replay: CUDA graphs and torch.cuda.MemPool, recorded by PyTorch's own allocator.

Each workload runs under PyTorch's native caching allocator on the fake GPU
(oracle ops: ["g", sizes] captures a graph that allocates them, ["m", sizes]
allocates them in a MemPool, "gd"/"md" drop the oldest graph / pool); the
replay of the native snapshot, given no hints, must put every allocation of
a private pool in that pool: the whole trace at its native addresses, the
final segments block by block with their segment_pool_id, and PyTorch's
statistics (peaks over every pool together). torch 2.13 and later record each
entry's pool_id; for 2.11, which records only the final segments' pools, the
replay takes the pool from the segment that holds the address.
"""
from __future__ import annotations

import copy
import pickle

import pytest

from torchmem import replay as sim
from tests.support import oracle
from tests.support.deviations import classify

MiB = 1 << 20
GiB = 1 << 30
W = oracle.Workload


def interleaved(private: str) -> list:
    """Default-pool blocks around private-pool ones of the same sizes: a replay that put the private
    allocations in the default pool would place them (and what follows) in the default pool's free blocks."""
    ops: list = [["a", 0, 300_000, 0], ["a", 1, 5 * MiB, 0], ["a", 2, 30 * MiB, 0]]
    ops += [["f", 0], ["f", 1], ["f", 2]]
    ops += [[private, [300_000, 5 * MiB, 700]], ["a", 3, 300_000, 0], ["a", 4, 5 * MiB, 0]]
    ops += [[private, [30 * MiB, 1000]], ["a", 5, 30 * MiB, 0], ["f", 3], [private + "d"], ["a", 6, 700, 0]]
    ops += [["e"], ["a", 7, 5 * MiB, 0], [private, [5 * MiB]], ["f", 4], ["f", 5], ["f", 6], ["f", 7]]
    return ops


SCENARIOS = {
    f"{kind}[{conf}]": W(7, conf, 4 * GiB, interleaved(kind))
    for kind in ("m", "g")
    for conf in ("", "expandable_segments:True", "max_split_size_mb:20")
}


# A MemPool whose segment is gone by the end, on a device that still caches a free default-pool block of
# the size it asked for: the final segments keep no trace of that pool.
# (The empty second MemPool lets the first one die at "md": the child keeps its last pool referenced.)
LOST_POOL = W(8, "", 4 * GiB, [["a", 0, 5 * MiB, 0], ["f", 0], ["m", [5 * MiB]], ["m", []], ["md"],
                               ["a", 1, 30 * MiB, 0]])


@pytest.fixture(scope="module")
def native(tmp_path_factory):
    out = tmp_path_factory.mktemp("pools")
    runs = dict(SCENARIOS, lost=LOST_POOL)
    names = list(runs)
    reports = oracle.run_native([runs[n] for n in names], out)
    return {n: (runs[n], out / f"{i}.pickle", reports[i]) for i, n in enumerate(names)}


def without_pool_ids(path, out) -> None:
    """The snapshot as torch 2.11 writes it: no pool_id in the trace entries."""
    snap = load(path)
    for e in snap["device_traces"][0]:
        e.pop("pool_id", None)
    out.write_bytes(pickle.dumps(snap))


def load(path) -> dict:
    with open(path, "rb") as f:
        return pickle.load(f)


def private_segments(segments: list[dict]) -> list[tuple]:
    return sorted((tuple(s["segment_pool_id"]), s["address"], s["total_size"]) for s in segments
                  if tuple(s["segment_pool_id"]) != (0, 0))


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_private_pool_allocations_replay_at_their_native_addresses(native, name):
    w, path, report = native[name]
    assert "error" not in report, report
    snap = load(path)
    assert private_segments(snap["segments"]), "the workload should leave private pools' segments"
    problems = oracle.compare(path, report, w)
    if any("pool_id" in e for e in snap["device_traces"][0]):  # torch 2.13+: every entry names its pool
        assert problems == []
    elif problems:  # torch 2.11: a pool that died before the end is not in the snapshot
        deviation = classify(w, problems)
        assert deviation is not None and deviation.name == "unrecorded-pool", problems


@pytest.mark.parametrize("name", ["m[]", "g[expandable_segments:True]"])
def test_the_replay_keeps_each_segment_in_its_pool(native, name):
    _, path, _ = native[name]
    snap = load(path)
    result = sim.replay(str(path))
    assert result.exact, result.fidelity
    assert private_segments(result.segments) == private_segments(snap["segments"])
    # torch 2.13+ record each entry's pool_id; 2.11's pools come from the final segments, which the notes say
    recorded = any("pool_id" in e for e in snap["device_traces"][0])
    assert any("private pool" in n and "final segment" in n for n in result.notes) != recorded, result.notes


@pytest.mark.parametrize("name", ["m[]", "g[]"])
def test_pools_inferred_from_the_final_segments_without_pool_id(native, name, tmp_path):
    """torch 2.11 writes no pool_id into trace entries: the final segments' segment_pool_id places them.
    A pool's allocations at addresses that a later pool's final segment covers go to that later pool,
    which is exact here because the first pool was emptied and released before (MemPool's destructor)."""
    w, path, report = native[name]
    bare = tmp_path / "no-pool-id.pickle"
    without_pool_ids(path, bare)
    result = sim.replay(str(bare))
    assert any("private pool" in n and "final segment" in n for n in result.notes), result.notes
    assert oracle.compare(bare, report, w) == []


def test_a_pool_with_no_final_segment_cannot_be_inferred(native, tmp_path):
    """Without pool_id and with no final segment of its pool, a MemPool's allocation is replayed in the
    default pool, which serves it from its cached block: the replay differs, and says it is inexact."""
    w, path, report = native["lost"]
    snap = load(path)
    assert not any(tuple(seg["segment_pool_id"]) != (0, 0) for seg in snap["segments"])
    if any("pool_id" in e for e in snap["device_traces"][0]):  # torch 2.13+: exact with them
        assert oracle.compare(path, report, w) == []
    bare = tmp_path / "no-pool-id.pickle"
    without_pool_ids(path, bare)
    result = sim.replay(str(bare))
    assert not result.exact
    assert oracle.compare(bare, report, w) != []


def test_a_replay_in_one_pool_would_differ(native, tmp_path):
    """The comparison sees the pools: the same snapshot with every pool_id and segment_pool_id set to the
    default pool does not replay at the native addresses."""
    w, path, report = native["m[]"]
    flat = copy.deepcopy(load(path))
    for e in flat["device_traces"][0]:
        if "pool_id" in e:
            e["pool_id"] = (0, 0)
    for s in flat["segments"]:
        s["segment_pool_id"] = (0, 0)
    out = tmp_path / "flat.pickle"
    out.write_bytes(pickle.dumps(flat))
    assert not sim.replay(str(out)).exact
