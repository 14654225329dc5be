"""A training script that does not fit an 80 GiB card at batch 32, for `torchmem preflight` (docs/preflight.md).

    torchmem preflight --card 80GiB -- python examples/preflight_batch32.py --batch 32

An MLP language-model stand-in (no downloads, nothing but torch) trains a few
steps on batches whose sequence length changes every step, as a real data
loader's would without packing. The parameters are created on the device.
The varying lengths leave the caching allocator's segments fragmented, so the
run needs more than the sum of its live tensors.

Runs as it is on a real GPU too; on the fake GPU the arithmetic is skipped, so
the loss printed there is garbage.
"""
from __future__ import annotations

import argparse

import torch

LENGTHS = [480, 2400, 1000, 3200, 650, 2800, 1600, 3500, 750, 3000]  # tokens per sample, one length per step


def model(width: int, hidden: int, layers: int, device: str) -> torch.nn.Module:
    blocks: list[torch.nn.Module] = []
    for _ in range(layers):
        blocks += [torch.nn.Linear(width, hidden, device=device), torch.nn.GELU(),
                   torch.nn.Linear(hidden, width, device=device)]
    return torch.nn.Sequential(*blocks)


def train(batch: int, width: int = 4096, hidden: int = 16384, layers: int = 4, steps: int = len(LENGTHS),
          device: str = "cuda") -> float:
    torch.manual_seed(0)
    net = model(width, hidden, layers, device)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4)
    loss = torch.zeros((), device=device)
    for step in range(steps):
        x = torch.randn(batch * LENGTHS[step % len(LENGTHS)], width, device=device)
        loss = net(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return float(loss.detach())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=32, help="samples per step (default 32)")
    parser.add_argument("--steps", type=int, default=len(LENGTHS), help=f"steps (default {len(LENGTHS)})")
    args = parser.parse_args()
    loss = train(args.batch, steps=args.steps)
    print(f"trained {args.steps} steps at batch {args.batch}; last loss {loss:.4f}")


if __name__ == "__main__":
    main()
