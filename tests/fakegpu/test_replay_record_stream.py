"""record_stream in the replay, held to PyTorch's own statistics while a free is pending.

PyTorch's free() of a block used on another stream (record_stream) ends the
allocation at once (allocation and allocated_bytes drop; the trace's
free_requested) and keeps the block active and out of its cache until that
stream's work is done (free_block at free_completed: active_bytes and
requested_bytes drop). A program runs under PyTorch's native allocator on
the fake GPU with the side stream held back, and takes a snapshot and
torch.cuda.memory_stats() at points where such a free is pending; the replay
of each snapshot, given no hints, must end with PyTorch's statistics at that
point (current and peak) and every trace entry at its native address.
The oracle's shrunk case of this is tests/fakegpu/fixed/record-stream-allocated-peak.json.
"""
from __future__ import annotations

import pickle

import pytest

from tests.fakegpu.helpers import run_json
from torchmem import replay as sim
from tests.support import oracle

MiB = 1 << 20
GiB = 1 << 30
KEYS = ("allocated_bytes", "allocation", "active_bytes", "active", "requested_bytes", "reserved_bytes")

PROGRAM = r"""
import json, pickle, sys
import torch
from torchmem.fakegpu import Control

MiB = 1 << 20
KEYS = {keys!r}
out = {out!r}
control = Control()
torch.cuda.init()
side = torch.cuda.Stream()
control.hold(side)
torch.cuda.memory._record_memory_history(context=None, stacks="python", max_entries=100_000)
points = []

def point(name):
    stats = torch.cuda.memory_stats()
    path = f"{{out}}/{{len(points)}}.pickle"
    with open(path, "wb") as f:
        pickle.dump(torch.cuda.memory._snapshot(), f)
    points.append({{"name": name, "path": path, "pending": control.pending_events(),
                   "stats": {{f"{{k}}.all.{{w}}": stats[f"{{k}}.all.{{w}}"] for k in KEYS for w in ("current", "peak")}}}})

def on_side(size):
    t = torch.empty(size, dtype=torch.uint8, device="cuda")
    t.record_stream(side)
    return t

keep = torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")
x = on_side(30 * MiB)
del x                                   # requested; pending until side's work is done
point("large pending")
y = torch.empty(40 * MiB, dtype=torch.uint8, device="cuda")
point("allocated while pending")        # peak: keep and y, never x with them
s = on_side(4096)
del s, y                                # a small block pending as well; y freed at once
point("two pending")
control.complete(side)
z = torch.empty(30 * MiB, dtype=torch.uint8, device="cuda")  # the events are seen here: x's block is reused
point("completed")
print(json.dumps(points))
"""


@pytest.fixture(scope="module")
def points(tmp_path_factory):
    out = tmp_path_factory.mktemp("record_stream")
    return run_json(PROGRAM.format(keys=KEYS, out=str(out)), card="4GiB")


def stats_of(result) -> dict:
    return {f"{k}.all.{w}": result.stats[k]["all"][w] for k in KEYS for w in ("current", "peak")}


def test_the_program_frees_blocks_that_stay_pending(points):
    """What the points are about, from PyTorch's own figures: blocks counted out of allocated, still active."""
    pending = {p["name"]: p for p in points}
    assert [p["pending"] > 0 for p in points] == [True, True, True, False]
    for name in ("large pending", "allocated while pending", "two pending"):
        stats = pending[name]["stats"]
        assert stats["active_bytes.all.current"] > stats["allocated_bytes.all.current"], name
    assert pending["allocated while pending"]["stats"]["allocated_bytes.all.peak"] < (3 + 30 + 40) * MiB
    with open(pending["completed"]["path"], "rb") as f:
        trace = pickle.load(f)["device_traces"][0]
    requested = [i for i, e in enumerate(trace) if e["action"] == "free_requested" and e["size"] == 30 * MiB]
    completed = [i for i, e in enumerate(trace) if e["action"] == "free_completed" and e["size"] == 30 * MiB]
    assert requested and completed and any(e["action"] == "alloc" for e in trace[requested[0]:completed[0]])


@pytest.mark.parametrize("at", ["large pending", "allocated while pending", "two pending", "completed"])
def test_replay_counts_a_pending_free_as_pytorch_does(points, at):
    point = next(p for p in points if p["name"] == at)
    result = sim.replay(point["path"])
    assert result.completed and result.exact
    assert stats_of(result) == point["stats"]
    workload = oracle.Workload(0, "", 4 * GiB)
    assert oracle.compare(point["path"], {"stats": point["stats"]}, workload) == []

