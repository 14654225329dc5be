"""A snapshot as torch 2.14.1 writes it with annotations and user metadata, read by every command.

A small training loop on the fake GPU, under PyTorch's own allocator,
annotates live tensors (torch.cuda.memory._annotate_tensor), stamps each
phase with _set_memory_metadata, and takes a snapshot mid-run (a `snapshot`
entry). The dict of torch.cuda.memory._snapshot() is dumped with pickle
protocol 5. replay, advise, stats, plot and viz all read it. The replay stays
exact as tests/support/oracle.compare holds it: every memory entry at its
recorded address, the final segments block by block, and PyTorch's
statistics that the oracle compares (oracle_child.STAT_KEYS). Skipped where the torch lacks the API.
"""
from __future__ import annotations

import json
import pickle
import sys

import pytest
import torch

from tests.fakegpu.helpers import run_json
from tests.support import oracle
from tests.support.oracle_child import STAT_KEYS
from tests.support.subprocess_runner import ok, torchmem_here

GiB = 1 << 30
STEPS = 3

WORKLOAD = """
import json, pickle, torch
torch.cuda.memory._record_memory_history(max_entries=1_000_000)
model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).cuda()
opt = torch.optim.AdamW(model.parameters())
calls = []
for step in range(STEPS):
    torch.cuda.memory._set_memory_metadata(f"step {step} forward")
    x = torch.randn(512, 1024, device="cuda")
    h = model[0](x)
    torch.cuda.memory._annotate_tensor(h[1:], f"step {step}: hidden")  # a view: its storage's block
    calls.append(f"step {step}: hidden")
    y = model[2](model[1](h))
    torch.cuda.memory._set_memory_metadata(f"step {step} backward")
    y.square().mean().backward()
    torch.cuda.memory._set_memory_metadata(f"step {step} optimizer")
    opt.step()
    opt.zero_grad(set_to_none=True)
    torch.cuda.memory._annotate_tensor(model[0].weight, f"step {step}: weight")
    calls.append(f"step {step}: weight")
    del x, h, y
    if step == 1:
        torch.cuda.memory._snapshot()  # a snapshot entry mid-run
torch.cuda.memory._set_memory_metadata("")
torch.cuda.empty_cache()
snap = torch.cuda.memory._snapshot()
with open(PATH, "wb") as f:
    pickle.dump(snap, f, protocol=5)
print(json.dumps({"stats": torch.cuda.memory_stats(), "calls": calls}))
"""


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    if not all(hasattr(torch.cuda.memory, f) for f in ("_annotate_tensor", "_set_memory_metadata")):
        pytest.skip(f"torch {torch.__version__} has no _annotate_tensor / _set_memory_metadata")
    path = tmp_path_factory.mktemp("annotated") / "annotated.pickle"
    report = run_json(f"STEPS = {STEPS}\nPATH = {str(path)!r}\n" + WORKLOAD, card="80GiB")
    with open(path, "rb") as f:
        assert f.read(2) == b"\x80\x05"  # protocol 5
    return path, report


def trace_of(path) -> list[dict]:
    with open(path, "rb") as f:
        return pickle.load(f)["device_traces"][0]


def test_the_recording_has_annotations_metadata_and_a_snapshot_entry(recorded):
    path, report = recorded
    trace = trace_of(path)
    assert [e["user_metadata"] for e in trace if e["action"] == "annotate"] == report["calls"]
    assert sum(e["action"] == "snapshot" for e in trace) >= 1
    stamped = {e["user_metadata"] for e in trace if e["action"] != "annotate"} - {""}
    assert {f"step {s} {phase}" for s in range(STEPS) for phase in ("forward", "backward", "optimizer")} <= stamped


def test_the_replay_is_exact(recorded):
    path, report = recorded
    stats = {k: report["stats"].get(k) for k in STAT_KEYS}  # the statistics the oracle holds every replay to
    assert stats["num_device_free"] > 0 and stats["allocation.all.allocated"] > 0
    assert oracle.compare(path, {"stats": stats}, oracle.Workload(0, "", 80 * GiB)) == []


def test_every_command_reads_it(recorded, tmp_path):
    path, report = recorded
    trace = trace_of(path)
    for command, extra in [("replay", []), ("advise", []), ("stats", []), ("plot", ["-o", str(tmp_path / "p.png")]),
                           ("viz", ["-o", str(tmp_path / "v.html")])]:
        proc = ok(torchmem_here(command, str(path), *extra))
        assert "warning" not in proc.stderr, (command, proc.stderr)
    stats = json.loads(ok(torchmem_here("stats", str(path), "--json")).stdout)
    entries = [i for i, e in enumerate(trace) if e["action"] == "annotate"]
    assert [(a["entry"], a["text"]) for a in stats["annotations"]] == list(zip(entries, report["calls"]))
    assert {m["text"] for m in stats["user_metadata"]} == {e["user_metadata"] for e in trace
                                                           if e["action"] != "annotate"} - {""}
    page = (tmp_path / "v.html").read_text()
    assert page.count('class="annotation"') == len(report["calls"])
    plotted = json.loads(ok(torchmem_here("plot", str(path), "-o", str(tmp_path / "q.png"), "--json")).stdout)
    assert plotted["annotations"] == entries


def test_a_preflight_of_a_script_that_annotates_completes_with_advises_table(tmp_path):
    if not all(hasattr(torch.cuda.memory, f) for f in ("_annotate_tensor", "_set_memory_metadata")):
        pytest.skip(f"torch {torch.__version__} has no _annotate_tensor / _set_memory_metadata")
    from torchmem import preflight

    script = tmp_path / "annotates.py"
    script.write_text(f"STEPS = {STEPS}\nPATH = {str(tmp_path / 'own.pickle')!r}\n" + WORKLOAD)
    report = preflight.run_command([sys.executable, str(script)], "h100", out=tmp_path / "out", capture_output=True)
    assert report.fits and report.advice_missing is None
    [own] = [a for a in report.advice if a.recorded]  # the run's own setting replays, and fits the card
    assert own.completes and 0 < own.min_capacity <= own.capacity
    # preflight's own recording holds the script's annotations too
    with open(report.devices[0].snapshot, "rb") as f:
        actions = {e["action"] for e in pickle.load(f)["device_traces"][0]}
    assert "annotate" in actions
