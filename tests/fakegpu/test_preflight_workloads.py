"""Workloads users run, under preflight, each held to the live tensors the same model needs on the CPU.

A GPT-2 training step with AdamW, BERT inference and a T5 training step (Hugging Face models built from a
tiny config; transformers from requirements-fakegpu.txt), autocast with GradScaler, activation checkpointing,
torch.compile (inductor; a nanoGPT-shaped step too), a small ResNet, and a 2-rank DDP job under torchrun.

The live tensors after a step (parameters, gradients, buffers, optimizer and
scaler state) must take the same bytes on the fake card as the CPU run's
tensors would (each storage rounded to PyTorch's 512-byte unit), and
PyTorch's allocator must report exactly those bytes allocated beyond the
cuBLAS workspaces; reserved is the allocator's own. cuDNN is off under
preflight, so the ResNet's convolutions and batch norm take PyTorch's own
kernels (docs/preflight.md).
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.fakegpu import preflight_workloads as workloads
from tests.fakegpu.helpers import MiB, ROOT
from torchmem import preflight


@pytest.mark.parametrize("kind", sorted(workloads.KINDS))
def test_a_training_step_allocates_what_its_live_tensors_need_on_the_cpu(kind):
    on_cpu = workloads.measure(kind, "cpu")
    report = preflight.run(workloads.measure, kind, "cuda", card="h100", advise=False)
    assert report.fits
    on_card = report.value
    assert on_card["cudnn"] is False
    assert on_card["live"] == on_cpu["live"] > 0
    assert on_card["allocated"] == on_cpu["live"]
    [device] = report.devices
    assert device.peak_allocated >= on_card["allocated"] + 32 * MiB  # the step's own peak, plus the workspace
    assert device.peak_reserved >= device.peak_allocated


def test_a_two_rank_ddp_job_under_torchrun_runs_with_gloo_and_each_rank_is_recorded(tmp_path):
    from tests.fakegpu.ddp_preflight_job import step

    _, on_cpu = step("cpu", ddp=False)
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")

    results = tmp_path / "results"
    results.mkdir()

    report = preflight.run_command([torchrun, "--nproc-per-node", "2", "tests/fakegpu/ddp_preflight_job.py",
                                    str(results)],
                                   "24GiB", devices=2, out=tmp_path / "run", advise=False, capture_output=True,
                                   env=dict(os.environ, PYTHONPATH=ROOT))
    out = Path(report.out)
    assert report.fits, report.captured[1][-3000:]
    ranks = [json.loads((results / f"rank{n}.json").read_text()) for n in (0, 1)]
    assert [r["rank"] for r in ranks] == [0, 1] and {r["backend"] for r in ranks} == {"gloo"}
    # gradient_as_bucket_view: DDP's bucket holds the gradients, so the live bytes are the plain model's.
    assert all(r["live"] == r["allocated"] == on_cpu for r in ranks)
    assert [(d.process, d.device) for d in report.devices] == [("rank0", 0), ("rank1", 1)]
    assert sorted(os.listdir(out)) == ["rank0.json", "rank0.pickle", "rank1.json", "rank1.pickle"]
    assert any("ran with gloo" in w for w in report.warnings)
