"""The command line's file tools run where torch cannot be imported.

replay, advise, stats, plot, viz, plan and --help need only torchmem._core, which links no torch. Each
command runs here with a `torch` package first on the path whose import fails, so any import of torch on the
way stops the command. replay's and advise's answers are compared with the same commands run with torch
importable: the same JSON.
"""
from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOT = ROOT / "tests" / "data" / "native" / "nesta_gitu.json.gz"  # a real GPU's snapshot, ending in an OOM
BLOCKED = "torch cannot be imported in this test"


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("cli_without_torch")
    blocker = folder / "blocker" / "torch"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text(f"raise ImportError({BLOCKED!r})\n")
    snapshot = folder / "snapshot.json"
    with gzip.open(SNAPSHOT, "rt") as f:
        snapshot.write_text(f.read())
    plan = folder / "buffers.csv"
    plan.write_text("id,lower,upper,size\n0,0,3,64\n1,1,2,32\n2,2,5,128\n")
    return {"folder": folder, "blocker": blocker.parent, "snapshot": snapshot, "plan": plan}


def torchmem(inputs: dict[str, Path], *argv: str, torch: bool) -> subprocess.CompletedProcess:
    """`python -m torchmem ARGV` from the checkout; with torch=False, torch's import fails."""
    path = [str(ROOT), os.environ.get("PYTHONPATH", "")]
    if not torch:
        path.insert(0, str(inputs["blocker"]))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p)}
    return subprocess.run([sys.executable, "-m", "torchmem", *argv], capture_output=True, text=True, env=env,
                          cwd=inputs["folder"], timeout=300)


def ok(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.args}\n{proc.stderr[-3000:]}"
    assert BLOCKED not in proc.stderr
    return proc.stdout


def test_the_blocker_blocks(inputs):
    env = {**os.environ, "PYTHONPATH": str(inputs["blocker"])}
    proc = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True, text=True, env=env)
    assert proc.returncode == 1 and BLOCKED in proc.stderr


def answer(text: str) -> object:
    """A command's JSON less its wall time (replay's "seconds"), which differs from run to run."""
    def drop(value: object) -> object:
        if isinstance(value, dict):
            return {k: drop(v) for k, v in value.items() if k != "seconds"}
        return [drop(v) for v in value] if isinstance(value, list) else value
    return drop(json.loads(text))


@pytest.mark.parametrize("command", ["replay", "advise"])
def test_replay_and_advise_give_the_same_answer_without_torch(inputs, command):
    argv = (command, "--json", "--no-progress", str(inputs["snapshot"]))
    without = answer(ok(torchmem(inputs, *argv, torch=False)))
    assert without == answer(ok(torchmem(inputs, *argv, torch=True)))
    assert without  # a real answer: replay's result or advise's rows


def test_stats_viz_plan_and_help_run_without_torch(inputs):
    snapshot = str(inputs["snapshot"])
    assert "usage: torchmem" in ok(torchmem(inputs, "--help", torch=False))
    assert ok(torchmem(inputs, "stats", snapshot, torch=False))
    ok(torchmem(inputs, "viz", "-o", "page.html", snapshot, torch=False))
    assert (inputs["folder"] / "page.html").stat().st_size > 0
    assert "valid" in ok(torchmem(inputs, "plan", str(inputs["plan"]), torch=False))


def test_plot_runs_without_torch(inputs):
    pytest.importorskip("matplotlib")
    ok(torchmem(inputs, "plot", "-o", "timeline.png", str(inputs["snapshot"]), torch=False))
    assert (inputs["folder"] / "timeline.png").stat().st_size > 0


def test_the_runtime_says_it_needs_torch(inputs):
    """import torchmem works without torch; the runtime's names say on use that they need it."""
    code = "import torchmem\ntry:\n    torchmem.install\nexcept ImportError as e:\n    print(e)\n"
    path = os.pathsep.join([str(inputs["blocker"]), str(ROOT)])
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": path}, cwd=inputs["folder"])
    assert proc.returncode == 0, proc.stderr
    assert BLOCKED in proc.stdout
