"""A 2-rank DDP training step for preflight under torchrun (tests/fakegpu/test_preflight_workloads.py).

Asks for NCCL, as a real job would; ProcessGroupNCCL runs on the fake GPU's
NCCL stand-in. Each rank writes RESULTS_DIR/rank<N>.json (its own file: the
ranks share one stdout, where their lines can interleave): its live tensors'
bytes on the card, what PyTorch's allocator says is allocated beyond the
warm-up's cuBLAS workspaces, the NCCL version torch reports, and the device
memory the first collective took outside the allocator.

    torchrun --nproc-per-node 2 tests/fakegpu/ddp_preflight_job.py RESULTS_DIR
"""
import json
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tests.fakegpu.preflight_workloads import _mlp, _warm_up, card_bytes, state_tensors  # noqa: E402


def step(device: str, ddp: bool) -> tuple[list, int]:
    torch.manual_seed(0)
    model = _mlp(device)
    wrapped = torch.nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=True) if ddp else model
    opt = torch.optim.AdamW(model.parameters())
    wrapped(torch.randn(32, 64, device=device)).pow(2).mean().backward()
    opt.step()
    return [model, opt], card_bytes(state_tensors(model, opt), device)


def main() -> None:
    dist.init_process_group("nccl")
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    device = f"cuda:{local}"
    _warm_up(device)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated(local)
    free_before = torch.cuda.mem_get_info(local)[0] + torch.cuda.memory_reserved(local)
    kept, live = step(device, ddp=True)
    torch.cuda.synchronize()
    free_after = torch.cuda.mem_get_info(local)[0] + torch.cuda.memory_reserved(local)
    result = {"rank": dist.get_rank(), "live": live, "allocated": torch.cuda.memory_allocated(local) - base,
              "backend": dist.get_backend(), "nccl": list(torch.cuda.nccl.version()),
              "taken_outside": free_before - free_after}
    with open(os.path.join(sys.argv[1], f"rank{result['rank']}.json"), "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
