"""Some ranks of a large job from one machine: preflight --world-size on the NCCL stand-in (docs/preflight.md).

An FSDP2 job of 64 ranks (8 nodes of 8), launched by its unchanged torchrun command; ranks 0 and 9 run. Each
holds exactly its 1/64 shard of every parameter, gradient and AdamW state, as the model's shapes say, on the
device its local rank names.
"""
from __future__ import annotations

import json
import os
import sys

import pytest

from tests.fakegpu.helpers import ROOT
from torchmem import preflight

JOB = "tests/fakegpu/fsdp_world_job.py"


def full_bytes() -> int:
    from tests.fakegpu.fsdp_world_job import model

    return sum(p.numel() * p.element_size() for p in model().parameters())


@pytest.mark.parametrize("launch", ["torchrun", "python"])
def test_two_ranks_of_a_64_rank_fsdp2_job_hold_their_shards(tmp_path, launch):
    results = tmp_path / "results"
    results.mkdir()
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    command = ([torchrun, "--nnodes", "8", "--nproc-per-node", "8", JOB, str(results)] if launch == "torchrun"
               else [sys.executable, JOB, str(results)])
    report = preflight.run_command(command, "h100", out=tmp_path / "run", advise=False, capture_output=True,
                                   env=dict(os.environ, PYTHONPATH=ROOT), world_size=64, ranks=[0, 9])
    assert report.fits, report.captured[1][-3000:]
    ranks = [json.loads((results / f"rank{n}.json").read_text()) for n in (0, 9)]
    # 8 ranks per node, from torchrun's options or preflight's default: rank 9 is node 1's local rank 1.
    assert [(r["rank"], r["world"], r["local_rank"], r["device"]) for r in ranks] == [(0, 64, 0, 0), (9, 64, 1, 1)]
    assert {r["backend"] for r in ranks} == {"nccl"}
    shard = full_bytes() // 64  # every dimension 0 is 2048 = 64 x 32: no padding
    assert all((r["params"], r["grads"], r["adam"]) == (shard, shard, 2 * shard) for r in ranks)
    assert [(d.process, d.device) for d in report.devices] == [("rank0", 0), ("rank9", 1)]
    assert all(d.nccl > 0 for d in report.devices)
    assert any("rank 9 of 64 ran alone" in w for w in report.warnings)


def test_a_world_size_that_disagrees_with_torchrun_is_refused(tmp_path):
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    with pytest.raises(preflight.WorldError, match="disagrees with torchrun's --nnodes 2 x --nproc-per-node 8 = 16"):
        preflight.run_command([torchrun, "--nnodes", "2", "--nproc-per-node", "8", JOB, str(tmp_path)], "h100",
                              out=tmp_path / "run", world_size=64)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_the_llama_example_runs_as_the_last_rank_of_two_nodes(tmp_path, compiled):
    """examples/fsdp2_llama.py (its debug shape) through the command line, as docs/preflight.md shows it; with
    --compile, its blocks compiled by inductor before FSDP2 shards them, as torchtitan does."""
    import subprocess

    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    proc = subprocess.run([sys.executable, "-m", "torchmem", "preflight", "--card", "h100", "--world-size", "16",
                           "--ranks", "15", "--no-advise", "--json", "--out", str(tmp_path), "--",
                           torchrun, "--nnodes", "2", "--nproc-per-node", "8", "examples/fsdp2_llama.py",
                           "--preset", "debug", "--seq", "256", *(["--compile"] if compiled else [])],
                          capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    [device] = report["devices"]
    assert (device["process"], device["device"], device["fits"]) == ("rank15", 7, True)
    assert device["nccl"] > 0 and device["outside"] > device["nccl"]  # the h100's context and libraries too


NCCL_BYTES_JOB = """
import json, os, sys, torch, torch.distributed as dist
dist.init_process_group("nccl")
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
t = torch.ones(4, device="cuda")
before = torch.cuda.mem_get_info()[0]
dist.all_reduce(t)
after = torch.cuda.mem_get_info()[0]
dist.all_reduce(t)  # a communicator connects once
again = torch.cuda.mem_get_info()[0]
print(json.dumps({"first": before - after, "second": after - again}), file=sys.stderr)
dist.destroy_process_group()
"""


def test_nccls_buffers_follow_its_own_settings(tmp_path):
    """NCCL_MIN_NCHANNELS and NCCL_BUFFSIZE size the stand-in's buffers as they size NCCL's: 4 channels of 2
    connections, each with a 1 MiB Simple buffer, LL's 8*512*8*16 B and LL128's 120*640*8*8 B (src/init.cc).
    The device's free memory drops by that, in whole 2 MiB pages, as cudaMalloc takes it."""
    env = dict(os.environ, PYTHONPATH=ROOT, NCCL_MIN_NCHANNELS="4", NCCL_BUFFSIZE=str(1 << 20))
    report = preflight.run_command([sys.executable, "-c", NCCL_BYTES_JOB], "h100", out=tmp_path, advise=False,
                                   capture_output=True, env=env, world_size=8)
    measured = json.loads(report.captured[1].strip().splitlines()[-1])
    expected = 4 * 2 * ((1 << 20) + 8 * 512 * 8 * 16 + 120 * 640 * 8 * 8)
    page = 2 << 20
    assert measured == {"first": -(-expected // page) * page, "second": 0}
    assert [d.nccl for d in report.devices] == [expected]
