"""Workloads users run, under preflight, each held to the live tensors the same model needs on the CPU.

A GPT-2 training step with AdamW, BERT inference and a T5 training step (Hugging Face models built from a
tiny config; transformers from requirements-fakegpu.txt), autocast with GradScaler, activation checkpointing,
torch.compile (inductor; a nanoGPT-shaped step too), a small ResNet, and a 2-rank DDP job under torchrun
on the NCCL stand-in.

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


# NCCL's default receive buffers per connection (src/init.cc): Simple 4 MiB, LL 8*512*8*16 B, LL128 120*640*8*8 B;
# two connections per ring channel, 16 channels assumed (fakegpu/nccl/nccl.c, Note [NCCL's own device memory]).
NCCL_COMM_BYTES = 16 * 2 * ((4 << 20) + 8 * 512 * 8 * 16 + 120 * 640 * 8 * 8)


def test_a_two_rank_ddp_job_under_torchrun_runs_on_nccl_and_each_rank_is_recorded(tmp_path):
    from importlib import metadata

    import torch

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
    assert [r["rank"] for r in ranks] == [0, 1] and {r["backend"] for r in ranks} == {"nccl"}
    # The stand-in reports the version of the NCCL wheel that torch would have loaded.
    wheel = metadata.version(f"nvidia-nccl-cu{torch.version.cuda.split('.')[0]}")
    assert {tuple(r["nccl"]) for r in ranks} == {tuple(int(x) for x in wheel.split(".")[:3])}
    # gradient_as_bucket_view: DDP's bucket holds the gradients, so the live bytes are the plain model's.
    assert all(r["live"] == r["allocated"] == on_cpu for r in ranks)
    # NCCL's buffers come out of the card's free memory at the first collective, outside PyTorch's allocator...
    assert all(r["taken_outside"] == NCCL_COMM_BYTES for r in ranks)
    # ...and count against the card in the verdict.
    assert [(d.process, d.device, d.nccl) for d in report.devices] == [("rank0", 0, NCCL_COMM_BYTES),
                                                                       ("rank1", 1, NCCL_COMM_BYTES)]
    assert all(d.outside == NCCL_COMM_BYTES for d in report.devices)  # a bare size: nothing else outside
    assert sorted(os.listdir(out)) == ["rank0.json", "rank0.pickle", "rank1.json", "rank1.pickle"]
    assert any(w.startswith("NCCL's own buffers") for w in report.warnings)


def test_an_moe_layer_is_warned_about_at_each_routing_line():
    """The router's choices are device values, garbage on the fake GPU: the tokens each expert gets, and so
    what it allocates, follow them. The report names each routing line with its count (a bincount once, a
    torch.where per expert); parameters, gradients and AdamW's state do not depend on the routing."""
    import inspect

    source, first = inspect.getsourcelines(workloads.MoE.forward)
    marked = {f"tests/fakegpu/preflight_workloads.py:{first + i}": line.split("torch.")[1].split("(")[0]
              for i, line in enumerate(source) if "# routing:" in line}
    assert sorted(marked.values()) == ["bincount", "where"]
    on_cpu = workloads.measure("moe", "cpu")
    report = preflight.run(workloads.measure, "moe", "cuda", card="h100", advise=False)
    assert report.fits and report.value["live"] == on_cpu["live"] > 0
    experts = len(workloads.MoE().experts)
    for site, name in marked.items():
        label = "torch.where(mask)" if name == "where" else f"torch.{name}()"
        times = experts if name == "where" else 1
        said = [w for w in report.warnings if w.startswith(f"{label} on a CUDA tensor")]
        assert len(said) == 1 and f"({site} ×{times})" in said[0], report.warnings


def test_module_functions_and_boolean_masks_are_counted_and_look_alikes_are_not(tmp_path):
    job = Path(ROOT) / "tests" / "fakegpu" / "shapes_job.py"
    marked = {f"tests/fakegpu/shapes_job.py:{n}": line.split("# counted: ")[1].strip()
              for n, line in enumerate(job.read_text().splitlines(), 1) if "# counted: " in line}
    report = preflight.run_command([sys.executable, str(job)], "h100", out=tmp_path, advise=False,
                                   capture_output=True, env=dict(os.environ, PYTHONPATH=ROOT))
    assert "scripted" in report.captured[0]  # a wrapped torch.nonzero still compiles under TorchScript
    counted = {site: label for label, sites in report.processes[0]["reads"].items() for site in sites}
    assert counted == {site: label for site, label in marked.items()}
