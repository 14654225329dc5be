"""Record the tensor sizes of GPT-2-shaped training steps with varying sequence lengths (bench_malloc's gpt2 mix).

    python benchmarks/record_gpt2_sizes.py [--out benchmarks/gpt2_step_sizes.json] [--layers 2] [--steps 4]

Builds a GPT-2-small-shaped model on the CPU (hidden 768, 12 heads, FFN
3072, vocabulary 50257, learned positions, tied embeddings; --layers
blocks), installs torchmem with its recording on, and runs --steps
training steps (forward, cross-entropy, backward, AdamW) of batch 4, each
at another sequence length drawn from 32..256 (seed 0). Writes the
requested size of every allocation the recording saw, in order, and the
sequence lengths, to --out: figures only, no stacks, no addresses.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def gpt2_model(layers: int):  # -> torch.nn.Module
    import torch
    from torch import nn

    hidden, heads, vocab, context = 768, 12, 50257, 1024

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1 = nn.LayerNorm(hidden)
            self.attn = nn.Linear(hidden, 3 * hidden)
            self.proj = nn.Linear(hidden, hidden)
            self.ln2 = nn.LayerNorm(hidden)
            self.fc = nn.Linear(hidden, 4 * hidden)
            self.out = nn.Linear(4 * hidden, hidden)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, _ = x.shape
            q, k, v = self.attn(self.ln1(x)).split(hidden, dim=2)
            q, k, v = (y.view(b, t, heads, hidden // heads).transpose(1, 2) for y in (q, k, v))
            y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(b, t, hidden))
            return x + self.out(nn.functional.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class GPT2(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wte = nn.Embedding(vocab, hidden)
            self.wpe = nn.Embedding(context, hidden)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln_f = nn.LayerNorm(hidden)

        def forward(self, idx: torch.Tensor) -> torch.Tensor:
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
            for block in self.blocks:
                x = block(x)
            return self.ln_f(x) @ self.wte.weight.t()

    return GPT2()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "gpt2_step_sizes.json"))
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    if args.layers < 1 or args.steps < 1:
        parser.error("--layers and --steps must be positive")
    import torch

    import torchmem

    torch.manual_seed(0)
    torch.set_num_threads(1)
    torchmem.install(conf="reuse_order:address,min_block_size:512")
    model = gpt2_model(args.layers)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rng = random.Random(0)
    lengths = [rng.randint(32, 256) for _ in range(args.steps + 1)]

    def step(t: int) -> None:
        idx = torch.randint(0, 50257, (4, t))
        logits = model(idx)
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 50257), idx[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step(lengths[0])  # warm-up: AdamW's state exists from here on
    torchmem.record_memory_history("all", stacks=None)
    for t in lengths[1:]:
        step(t)
    snap = torchmem.memory_snapshot()
    torchmem.record_memory_history(None)
    sizes = [e["size"] for trace in snap["device_traces"] for e in trace if e["action"] == "alloc"]
    with open(args.out, "w") as f:
        json.dump({"what": "requested bytes of each allocation, in order, of GPT-2-shaped CPU training steps "
                           "(benchmarks/record_gpt2_sizes.py)",
                   "layers": args.layers, "batch": 4, "sequence_lengths": lengths[1:], "sizes": sizes}, f)
        f.write("\n")
    print(f"{len(sizes)} allocations, {len(set(sizes))} distinct sizes, sequence lengths {lengths[1:]} -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
