"""One rank of an FSDP2 job for preflight's --world-size (tests/fakegpu/test_preflight_world.py).

Asks for NCCL and shards a stack of linear layers with fully_shard over the
whole world, then takes one AdamW step. Writes RESULTS_DIR/rank<N>.json: the
rank, world size, local rank and device it ran as, the backend, and the bytes
of this rank's shards of the parameters, the gradients and AdamW's state.

    torchrun --nnodes 8 --nproc-per-node 8 tests/fakegpu/fsdp_world_job.py RESULTS_DIR
"""
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

WIDTH, DEPTH = 2048, 4


def model() -> torch.nn.Module:
    return torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(DEPTH)])


def local_bytes(tensors) -> int:
    return sum(t.to_local().numel() * t.element_size() for t in tensors)


def main() -> None:
    dist.init_process_group("nccl")
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    net = model().cuda()
    for layer in net:
        fully_shard(layer)
    fully_shard(net)
    opt = torch.optim.AdamW(net.parameters())
    net(torch.randn(32, WIDTH, device="cuda")).sum().backward()
    opt.step()
    params = list(net.parameters())
    state = [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor) and v.dim() > 0]
    result = {"rank": dist.get_rank(), "world": dist.get_world_size(), "local_rank": local,
              "device": torch.cuda.current_device(), "backend": dist.get_backend(),
              "params": local_bytes(params), "grads": local_bytes(p.grad for p in params),
              "adam": local_bytes(state)}
    with open(os.path.join(sys.argv[1], f"rank{result['rank']}.json"), "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
