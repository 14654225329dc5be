"""A small DDP training job on CPU (gloo) for tests/snapshots/test_torchrun_oom.py.

    torchrun --standalone --nproc-per-node 2 tests/support/ddp_oom_job.py --out DIR [--capacity-rank1 40MiB]

Every rank installs torchmem with dump_on_oom writing to DIR; rank 1 gets a
smaller ``capacity:`` in its conf. The batch doubles each step (256, 512,
1024, 2048), so rank 1 runs out of memory at the last step, in the middle
of a DDP step, and raises; torchrun then stops rank 0 and fails the job.
Each rank prints "rank R step S reserved N" after each step.
"""
from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist

import torchmem


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--capacity-rank1", default="40MiB")
    p.add_argument("--steps", type=int, default=4)
    args = p.parse_args()
    rank = int(os.environ["RANK"])
    conf = f"capacity:{args.capacity_rank1}" if rank == 1 else ""
    torchmem.install(conf=conf, dump_on_oom=os.path.join(args.out, "oom_rank{rank}_pid{pid}.pickle"))
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adam(ddp.parameters(), lr=1e-3)
    for step in range(args.steps):
        x = torch.randn(256 * 2**step, 256)
        loss = ddp(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        print(f"rank {rank} step {step} reserved {torchmem.memory_reserved()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
