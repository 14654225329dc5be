"""benchmarks/preflight_vs_real.py end to end, with the fake GPU standing in for the real one.

The "real" recording is the script run on the fake GPU without preflight
(this process's card: 80 GiB, compute capability 9.0), as it would run on
a card: its own _record_memory_history call starts the history there. Under preflight, the history has been recording since
torch's import, and the script's own dump holds only the window since its call (Note [The script's own history]
in torchmem/preflight/hook.py), so the two runs agree event by event. With a max_entries, both sides keep the
same last entries.
"""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fakegpu.helpers import ROOT

SCRIPT = """
import sys
import torch
ring = int(sys.argv[1]) if len(sys.argv) > 1 else 0
model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256)).cuda()
opt = torch.optim.AdamW(model.parameters())
x = torch.randn(64, 256, device="cuda")


def step():
    opt.zero_grad()
    model(x).square().mean().backward()
    opt.step()


step()  # warm-up: the optimizer's state is made before recording starts
torch.cuda.memory._record_memory_history(**({"max_entries": ring} if ring else {}))
for _ in range(3):
    step()
torch.cuda.memory._dump_snapshot("snap.pickle")
"""


def harness():
    spec = importlib.util.spec_from_file_location("preflight_vs_real", Path(ROOT) / "benchmarks" / "preflight_vs_real.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("ring", [0, 20])
def test_a_script_compared_with_its_own_recording_agrees_event_by_event(tmp_path, ring):
    real_dir, checkout = tmp_path / "real", tmp_path / "checkout"
    for folder in (real_dir, checkout):
        folder.mkdir()
        (folder / "train.py").write_text(SCRIPT)
    args = [str(ring)] if ring else []
    done = subprocess.run([sys.executable, "train.py", *args], cwd=real_dir, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = tmp_path / "out"
    code = harness().main(["--checkout", str(checkout), "--real", str(real_dir / "snap.pickle"),
                           "--python", sys.executable, "--card", "80GiB", "--out", str(out),
                           "--", "python", "train.py", *args])
    assert code == 0
    [result] = json.loads((out / "preflight_vs_real.json").read_text())
    assert result["error"] is None and result["snapshot"] == "the script's own dump"
    assert result["first"] is None and result["first_segment"] is None, result["first"]
    assert result["events_real"] == result["events_preflight"] == result["matching"] > 10
    assert result["peak_allocated"][0] == result["peak_allocated"][1]
    assert result["peak_reserved"][0] == result["peak_reserved"][1]
    if ring:
        # preflight's history held more than `ring` entries when the script asked for a ring: both keep the last 20
        assert result["events_real"] == ring and "window" in result
        assert not any(n.startswith("windows aligned") for n in result["notes"])  # the same 20, no shift
    else:
        assert result["start_entry"] == 0  # the script's own dump starts at its call, as on a card
