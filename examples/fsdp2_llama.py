"""A llama-shaped FSDP2 training step, as a multi-node job would run it.

    torchrun --nnodes 8 --nproc-per-node 8 examples/fsdp2_llama.py --preset 70b

Before renting the 64 cards, ask preflight about rank 0 from one machine:

    torchmem preflight --card h100 --world-size 64 -- \\
        torchrun --nnodes 8 --nproc-per-node 8 examples/fsdp2_llama.py --preset 70b

The model is built on the meta device, each block is sharded with
``fully_shard`` over every rank (bf16 parameters, fp32 gradient reduction),
then materialised on the GPU. Blocks recompute their activations in the
backward (activation checkpointing); with --compile, each block is compiled
(inductor) before it is sharded. One AdamW step runs on random tokens.
"""
from __future__ import annotations

import argparse
import math
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.utils.checkpoint import checkpoint


@dataclass(frozen=True)
class Shape:
    dim: int
    layers: int
    heads: int
    kv_heads: int
    hidden: int
    vocab: int


PRESETS = {
    "70b": Shape(dim=8192, layers=80, heads=64, kv_heads=8, hidden=28672, vocab=128256),  # Llama 3 70B
    "8b": Shape(dim=4096, layers=32, heads=32, kv_heads=8, hidden=14336, vocab=128256),   # Llama 3 8B
    "debug": Shape(dim=256, layers=2, heads=8, kv_heads=2, hidden=768, vocab=2048),
}


class RMSNorm(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * self.weight


class Block(nn.Module):
    def __init__(self, s: Shape):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = s.heads, s.kv_heads, s.dim // s.heads
        self.attn_norm, self.mlp_norm = RMSNorm(s.dim), RMSNorm(s.dim)
        self.wq = nn.Linear(s.dim, s.dim, bias=False)
        self.wkv = nn.Linear(s.dim, 2 * s.kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(s.dim, s.dim, bias=False)
        self.w13 = nn.Linear(s.dim, 2 * s.hidden, bias=False)
        self.w2 = nn.Linear(s.hidden, s.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        h = self.attn_norm(x)
        q = self.wq(h).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.wkv(h).view(b, t, 2, self.kv_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.wo(attn.transpose(1, 2).reshape(b, t, -1))
        gate, up = self.w13(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.w2(F.silu(gate) * up)


class Llama(nn.Module):
    def __init__(self, s: Shape):
        super().__init__()
        self.embed = nn.Embedding(s.vocab, s.dim)
        self.blocks = nn.ModuleList(Block(s) for _ in range(s.layers))
        self.norm = RMSNorm(s.dim)
        self.head = nn.Linear(s.dim, s.vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False)
        return self.head(self.norm(x))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="debug")
    parser.add_argument("--batch", type=int, default=1, help="sequences per rank")
    parser.add_argument("--seq", type=int, default=4096, help="tokens per sequence")
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--compile", action="store_true", help="compile each block with torch.compile (inductor)")
    args = parser.parse_args()
    shape = PRESETS[args.preset]

    dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    torch.manual_seed(0)  # the same on every rank, as DTensor's initialisation expects
    with torch.device("meta"):
        model = Llama(shape)
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.blocks:
        if args.compile:
            block.compile()
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    model.to_empty(device="cuda")
    for p in model.parameters():
        nn.init.normal_(p, std=1 / math.sqrt(shape.dim))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)

    for _ in range(args.steps):
        tokens = torch.randint(0, shape.vocab, (args.batch, args.seq + 1), device="cuda")
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    if dist.get_rank() == 0:
        params = sum(p.numel() for p in model.parameters())  # DTensors: the whole model's count
        print(f"{args.preset}: {params / 1e9:.2f}B parameters over {dist.get_world_size()} ranks; rank 0 peak "
              f"allocated {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
