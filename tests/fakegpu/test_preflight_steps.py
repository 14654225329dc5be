"""`torchmem preflight --steps N`: the run ends after the N-th optimizer step, with each step's peaks.

Each script says on stdout when it gets past the steps preflight should stop it at; the tests hold that it
never does. Peaks are held to the tensors a step must hold (weights, gradients, Adam's two moments).
"""
from __future__ import annotations

import os
import subprocess
import sys

from tests.fakegpu.helpers import ROOT
from torchmem import preflight

LOOP = """
import sys, torch
model = torch.nn.Linear(1024, 1024, bias=False).cuda()
opt = torch.optim.AdamW(model.parameters(), fused=FUSED)
for step in range(STEPS):
    model(torch.randn(256, 1024, device="cuda")).square().mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    print(f"past step {step + 1}", flush=True)
print("the loop ended", flush=True)
"""

TRAINER = """
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments
config = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
rows = [{"input_ids": torch.arange(i, i + 64) % 512, "labels": torch.arange(i, i + 64) % 512} for i in range(64)]
args = TrainingArguments(output_dir=OUT, max_steps=10, per_device_train_batch_size=4, gradient_accumulation_steps=2,
                         logging_steps=1, save_strategy="no", report_to=[], bf16=True, optim="adamw_torch_fused")
class Said(Trainer):
    def training_step(self, *args, **kwargs):
        print(f"micro-batch after {self.state.global_step} steps", flush=True)
        return super().training_step(*args, **kwargs)
Said(model=LlamaForCausalLM(config), args=args, train_dataset=rows).train()
print("training ended", flush=True)
"""

FSDP2 = """
import os, torch, torch.distributed as dist
from torch.distributed.fsdp import fully_shard
dist.init_process_group("nccl")
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
net = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(4)]).cuda()
for layer in net:
    fully_shard(layer)
fully_shard(net)
opt = torch.optim.AdamW(net.parameters())
for step in range(5):
    net(torch.randn(32, 2048, device="cuda")).sum().backward()
    opt.step()
    opt.zero_grad()
    print(f"past step {step + 1}", flush=True)
"""


def script(tmp_path, text: str, **names) -> str:
    path = tmp_path / "train.py"
    path.write_text("".join(f"{k} = {v!r}\n" for k, v in names.items()) + text)
    return str(path)


def test_a_loop_stops_after_the_third_step_with_each_steps_peaks(tmp_path):
    for fused in (False, True):
        report = preflight.run_command([sys.executable, script(tmp_path, LOOP, STEPS=10, FUSED=fused)], "h100",
                                       out=tmp_path / f"out{fused}", capture_output=True, advise=False, steps=3)
        out = report.captured[0]
        assert report.fits and report.returncode == 0
        assert "past step 2" in out and "past step 3" not in out, out  # stopped inside the third step
        [process] = report.processes
        steps = process["steps"]["steps"]
        assert process["steps"]["asked"] == 3 and len(steps) == 3
        weight = 1024 * 1024 * 4
        peaks = [s["devices"]["0"] for s in steps]
        assert all(p["allocated"] >= 4 * weight for p in peaks)  # weight, gradient, exp_avg, exp_avg_sq
        assert peaks[1] == peaks[2]
        assert report.devices[0].peak_allocated == max(p["allocated"] for p in peaks)
        text = report.format()
        assert "3 of 3 optimizer steps asked for ran; the run stopped there." in text
        assert "the last step's peaks equal the one before." in text


def test_a_run_with_fewer_steps_says_it_ended_early(tmp_path):
    report = preflight.run_command([sys.executable, script(tmp_path, LOOP, STEPS=2, FUSED=False)], "h100",
                                   out=tmp_path / "out", capture_output=True, advise=False, steps=5)
    assert "the loop ended" in report.captured[0]
    assert len(report.processes[0]["steps"]["steps"]) == 2
    assert "2 of 5 optimizer steps asked for ran; the run ended before the rest." in report.format()
    assert any("ended after 2 of the 5 optimizer steps asked for" in w for w in report.warnings)


def test_the_trainer_stops_after_two_optimizer_steps_of_two_micro_batches(tmp_path):
    report = preflight.run_command([sys.executable, script(tmp_path, TRAINER, OUT=str(tmp_path / "trainer"))], "l4",
                                   out=tmp_path / "out", capture_output=True, advise=False, steps=2, timeout=600)
    out = report.captured[0]
    assert report.returncode == 0, report.captured[1][-2000:]
    assert out.count("micro-batch after") == 4 and "training ended" not in out, out
    assert len(report.processes[0]["steps"]["steps"]) == 2


def test_a_torchrun_fsdp2_rank_stops_after_two_steps(tmp_path):
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    report = preflight.run_command([torchrun, "--nproc-per-node", "4", script(tmp_path, FSDP2)], "h100",
                                   out=tmp_path / "out", capture_output=True, advise=False, steps=2, world_size=4,
                                   env=dict(os.environ, PYTHONPATH=ROOT))
    out = report.captured[0]
    assert report.fits and "past step 1" in out and "past step 2" not in out, out
    [rank0] = [p for p in report.processes if p["name"] == "rank0"]
    assert len(rank0["steps"]["steps"]) == 2


def test_the_command_line_takes_steps_and_refuses_zero(tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    base = [sys.executable, "-m", "torchmem", "preflight", "--card", "h100", "--no-advise"]
    proc = subprocess.run([*base, "--steps", "1", "--", sys.executable, script(tmp_path, LOOP, STEPS=4, FUSED=False)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "1 of 1 optimizer step asked for ran; the run stopped there." in proc.stdout
    assert "past step 1" not in proc.stderr + proc.stdout
    refused = subprocess.run([*base, "--steps", "0", "--", sys.executable, "x.py"], capture_output=True, text=True,
                             env=env, timeout=60)
    assert refused.returncode == 2 and "--steps: must be 1 or more, not 0" in refused.stderr
