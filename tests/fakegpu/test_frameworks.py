"""The common training frameworks under preflight (docs/preflight.md, "Frameworks").

Each framework trains a tiny Llama (built from a config) one step on the fake card, and its live tensors
(parameters, gradients, optimizer state) must take the bytes the same step needs on the CPU:

- PEFT's LoRA; liger-kernel's Triton kernels (the plain modules on the CPU); TRL's SFTTrainer;
- the Hugging Face Trainer with Accelerate's FSDP plugin (FSDP2), as rank 0 of 2 (preflight --world-size):
  its shards must take what half of each CPU tensor takes;
- DeepSpeed ZeRO-2 and ZeRO-3 on 2 ranks, which cannot run on the CPU: they must complete, their first step
  must allocate Adam's moments (the overflow flag, a device value, read "no overflow"), and preflight must
  name that device read.

The packages come from requirements-frameworks.txt (`make test-frameworks`, which CI runs); a test whose
package is not installed skips.
"""
from __future__ import annotations

import importlib.util
import json
import os
import sys

import pytest

from tests.fakegpu import framework_workloads as workloads
from tests.fakegpu.helpers import ROOT
from torchmem import preflight

JOB = "tests/fakegpu/framework_job.py"


def needs(kind: str) -> None:
    if importlib.util.find_spec(workloads.PACKAGES[kind]) is None:
        pytest.skip(f"{workloads.PACKAGES[kind]} is not installed (make test-frameworks installs it)")


def on_ranks(kind: str, tmp_path, world: int = 2) -> tuple[preflight.Report, dict]:
    """KIND as rank 0 of `world`, from the job script: the report, and what the rank measured."""
    report = preflight.run_command([sys.executable, JOB, kind, str(tmp_path)], "h100", out=tmp_path / "run",
                                   advise=False, capture_output=True, timeout=900, world_size=world,
                                   env=dict(os.environ, PYTHONPATH=ROOT))
    return report, json.loads((tmp_path / "rank0.json").read_text())


@pytest.mark.parametrize("kind", ["peft_lora", "liger", "trl_sft"])
def test_a_framework_step_takes_on_the_card_what_it_takes_on_the_cpu(kind):
    needs(kind)
    on_cpu = workloads.measure(kind, "cpu")
    report = preflight.run(workloads.measure, kind, "cuda", card="h100", advise=False, timeout=900)
    assert report.fits
    assert report.value["live"] == on_cpu["live"] > 0
    if kind == "liger":  # liger's modules ran on the card, the plain ones on the CPU
        assert (report.value["norm"], on_cpu["norm"]) == ("LigerRMSNorm", "LlamaRMSNorm")


def test_the_trainer_with_accelerates_fsdp_holds_half_of_each_tensor_on_rank_0(tmp_path):
    needs("trainer_fsdp")
    on_cpu = workloads.measure("trainer_fsdp", "cpu", world=2)
    report, rank0 = on_ranks("trainer_fsdp", tmp_path)
    assert report.fits
    assert rank0["live"] == on_cpu["shard"] < on_cpu["live"]


@pytest.mark.parametrize("kind", ["zero2", "zero3"])
def test_deepspeed_zero_steps_and_its_overflow_check_is_named(kind, tmp_path):
    needs(kind)
    report, rank0 = on_ranks(kind, tmp_path)
    assert report.fits
    # The overflow flag read "no overflow", so the first step was taken: every partition has Adam's moments.
    assert rank0["with_moments"] == rank0["optimized"] > 0
    reads = report.processes[0]["reads"]["bool()"]
    assert any("deepspeed/runtime/utils.py" in site for site in reads), reads


ZERO3_STEPS = """
import deepspeed, torch
from tests.fakegpu.framework_workloads import _batch, _llama
deepspeed.init_distributed(dist_backend="nccl", verbose=False)
config = {"train_micro_batch_size_per_gpu": 4,
          "zero_optimization": {"stage": 3, "sub_group_size": 20000},  # several inner optimizer steps per step
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}}}
engine, optimizer, _, _ = deepspeed.initialize(model=_llama("cuda"), config=config)
for step in range(4):
    engine.backward(engine(**_batch("cuda")).loss)
    engine.step()
    print(f"past engine step {step + 1}", flush=True)
"""


def test_steps_counts_deepspeeds_engine_steps_not_its_inner_ones(tmp_path):
    needs("zero3")
    script = tmp_path / "zero3_steps.py"
    script.write_text(ZERO3_STEPS)
    report = preflight.run_command([sys.executable, str(script)], "h100", out=tmp_path / "run", advise=False,
                                   capture_output=True, timeout=900, world_size=2, steps=2,
                                   env=dict(os.environ, PYTHONPATH=ROOT))
    out = report.captured[0]
    assert report.fits and "past engine step 1" in out and "past engine step 2" not in out, out
    assert len(report.processes[0]["steps"]["steps"]) == 2
