"""A script's own `_record_memory_history(max_entries=N)` under preflight (Note [The script's own history] in
torchmem/preflight/hook.py): preflight has recorded since torch's import and keeps all of it, while the script's
own snapshots hold the last N entries since its call, as on a GPU."""
from __future__ import annotations

import os
import sys
import pickle
from pathlib import Path
from typing import Any

from tests.fakegpu.helpers import ROOT
from torchmem import preflight

# Before its call the script makes BEFORE tensors of 3 MiB + 4 KiB (a size made nowhere else), then records
# with a ring of RING entries, makes AFTER tensors of 5 MiB + 4 KiB, and dumps its own snapshot.
SCRIPT = """
import sys, torch
before, ring, after = {before}, {ring}, {after}
kept = [torch.empty((3 << 20) + 4096, dtype=torch.uint8, device="cuda") for _ in range(before)]
torch.cuda.memory._record_memory_history(max_entries=ring)
for _ in range(after):
    x = torch.empty((5 << 20) + 4096, dtype=torch.uint8, device="cuda")
    del x
torch.cuda.memory._dump_snapshot(sys.argv[1])
"""
OLD, NEW = (3 << 20) + 4096, (5 << 20) + 4096


def run(tmp_path: Path, before: int, ring: int, after: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]],
                                                                      list[str]]:
    script = tmp_path / "ring.py"
    script.write_text(SCRIPT.format(before=before, ring=ring, after=after))
    own = tmp_path / "own.pickle"
    report = preflight.run_command([sys.executable, str(script), str(own)], "80GiB", out=tmp_path / "out", advise=False,
                                   capture_output=True, env=dict(os.environ, PYTHONPATH=ROOT))
    assert report.returncode == 0, report.captured[1][-3000:]
    [process] = report.processes
    with open(own, "rb") as f:
        own_trace = pickle.load(f)["device_traces"][0]
    with open(process["snapshot"], "rb") as f:
        exit_trace = pickle.load(f)["device_traces"][0]
    return own_trace, exit_trace, process["notes"]


def sizes(trace: list[dict[str, Any]]) -> list[int]:
    return [e["size"] for e in trace if e["action"] == "alloc"]


def test_a_ring_shorter_than_the_trace_starts_from_the_scripts_call(tmp_path: Path) -> None:
    own, at_exit, notes = run(tmp_path, before=40, ring=30, after=60)
    # As on a GPU: the script's last 30 entries, all from after its call, in order (alloc, free_requested,
    # free_completed for each tensor); no entry recorded before the call is left among them.
    assert len(own) == 30 and OLD not in sizes(own) and set(sizes(own)) == {NEW}
    assert [e["action"] for e in own[:3]] in (["alloc", "free_requested", "free_completed"],
                                             ["free_requested", "free_completed", "alloc"],
                                             ["free_completed", "alloc", "free_requested"])
    assert sizes(at_exit).count(OLD) == 40 and sizes(at_exit).count(NEW) == 60  # preflight's recording is whole
    assert not any("history of" in n for n in notes)


def test_a_ring_longer_than_the_trace_starts_from_the_scripts_call_too(tmp_path: Path) -> None:
    own, at_exit, _ = run(tmp_path, before=2, ring=100_000, after=10)
    assert OLD not in sizes(own) and sizes(own).count(NEW) == 10  # a GPU's history is empty at the script's call
    assert sizes(at_exit).count(OLD) == 2
