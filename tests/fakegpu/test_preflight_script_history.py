"""A script that records, dumps and stops its own memory history under preflight (Note [The script's own history]
in torchmem/preflight/hook.py): preflight's recording stays whole, and the script's own dump holds what a run
without preflight records."""
from __future__ import annotations

import dataclasses
import os
import pickle
import sys
from pathlib import Path
from typing import Any

from tests.fakegpu.helpers import ROOT, run_code
from torchmem import preflight

# Sizes in bytes, multiples of 512 (no rounding), each made nowhere else: BEFORE the script's own call, DURING its
# recording (the first kept, the second freed), AFTER its stop. AFTER is the largest, so the run's peak needs it.
BEFORE, KEPT, FREED, AFTER = 3 * 512 + (3 << 20), 7 * 512 + (5 << 20), 11 * 512 + (1 << 20), 13 * 512 + (64 << 20)
SCRIPT = f"""
import sys, torch
before = torch.empty({BEFORE}, dtype=torch.uint8, device="cuda")
torch.cuda.memory._record_memory_history(max_entries=100_000)
kept = [torch.empty({KEPT}, dtype=torch.uint8, device="cuda") for _ in range(3)]
for _ in range(2):
    freed = torch.empty({FREED}, dtype=torch.uint8, device="cuda")
    del freed
torch.cuda.memory._dump_snapshot(sys.argv[1])
torch.cuda.memory._record_memory_history(enabled=None)
after = torch.empty({AFTER}, dtype=torch.uint8, device="cuda")
torch.cuda.memory._dump_snapshot(sys.argv[2])
"""


def trace(path: Path | str) -> list[dict[str, Any]]:
    with open(path, "rb") as f:
        return pickle.load(f)["device_traces"][0]


def allocs(entries: list[dict[str, Any]]) -> list[int]:
    return [e["size"] for e in entries if e["action"] == "alloc"]


def test_a_script_that_stops_its_own_history_keeps_preflights_recording_and_advise(tmp_path: Path) -> None:
    script = tmp_path / "own_history.py"  # not profile.py: cProfile imports `profile`
    script.write_text(SCRIPT)
    own, stopped = tmp_path / "own.pickle", tmp_path / "stopped.pickle"
    report = preflight.run_command([sys.executable, str(script), str(own), str(stopped)], "80GiB",
                                   out=tmp_path / "out", capture_output=True, env=dict(os.environ, PYTHONPATH=ROOT))
    assert report.returncode == 0, report.captured[1][-3000:]
    [process] = report.processes
    whole = trace(process["snapshot"])
    # Preflight's recording: every allocation, before, during and after the script's own recording.
    assert allocs(whole) == [BEFORE, KEPT, KEPT, KEPT, FREED, FREED, AFTER]
    assert report.advice and report.advice_missing is None and report.advised == (process["name"], 0)
    assert report.to_json()["advice_missing"] is None and "torchmem advise (" in report.format()
    # The script's own dump: its own allocations from its call, and no snapshot entry of preflight's.
    mine = trace(own)
    assert allocs(mine) == [KEPT, KEPT, KEPT, FREED, FREED]
    assert "snapshot" not in {e["action"] for e in mine}
    assert trace(stopped) == []  # after its stop, as on a card: the history was emptied there

    # The same script without preflight, on the fake GPU: its own recording is PyTorch's alone.
    real_own, real_stopped = tmp_path / "real_own.pickle", tmp_path / "real_stopped.pickle"
    done = run_code(SCRIPT.replace("sys.argv[1]", repr(str(real_own))).replace("sys.argv[2]", repr(str(real_stopped))))
    assert done.returncode == 0, done.stderr[-3000:]
    key = ("action", "size", "stream")
    assert [tuple(e[k] for k in key) for e in mine] == [tuple(e[k] for k in key) for e in trace(real_own)]
    assert trace(real_stopped) == []


def test_a_report_without_advise_says_why(tmp_path: Path) -> None:
    script = tmp_path / "alloc.py"
    script.write_text("import torch\nx = torch.empty(1 << 20, device='cuda')\n")
    report = preflight.run_command([sys.executable, str(script)], "80GiB", out=tmp_path / "out", advise=False,
                                   capture_output=True, env=dict(os.environ, PYTHONPATH=ROOT))
    assert report.advice is None and "--no-advise" in report.advice_missing
    assert report.to_json()["advice_missing"] == report.advice_missing
    assert f"No advise table: {report.advice_missing}." in report.format()
    # A snapshot whose history is empty (a recorder stopped behind preflight's back): advise is left out, and why.
    [process] = report.processes
    with open(process["snapshot"], "rb") as f:
        snapshot = pickle.load(f)
    snapshot["device_traces"] = [[] for _ in snapshot["device_traces"]]
    with open(process["snapshot"], "wb") as f:
        pickle.dump(snapshot, f)
    fields = preflight._replay_fields(report, True)
    assert fields.keys() == {"advice_missing"} and "holds no history for device 0" in fields["advice_missing"]
    report = dataclasses.replace(report, **fields)
    assert process["snapshot"] in report.format()
