"""Swap PyTorch's CUDA allocator for torchmem's in one line, train, and compare
reserved with allocated memory.

    python examples/cuda_swap.py

On a machine without a CUDA GPU it says so and exits 0.
"""
import sys

import torchmem

import torch


def main() -> int:
    if not torch.cuda.is_available():
        print("No CUDA GPU here: torchmem's CUDA allocator needs one (on the CPU, torchmem.install() swaps the CPU allocator).")
        return 0

    torchmem.install()  # the one line: before anything touches CUDA
    # Settings use PYTORCH_CUDA_ALLOC_CONF's grammar, e.g.
    # torchmem.install(conf="expandable_segments:True")

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)
    ).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(50):
        batch = 64 * (1 + step % 8)  # varying shapes, as with varying sequence lengths
        x = torch.randn(batch, 1024, device="cuda")
        loss = model(x).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 10 == 9:
            allocated = torch.cuda.memory_allocated() / 2**20
            reserved = torch.cuda.memory_reserved() / 2**20
            print(f"step {step + 1:3d}  loss {loss.item():.4f}  allocated {allocated:8.1f} MiB  reserved {reserved:8.1f} MiB")

    stats = torch.cuda.memory_stats()
    print(f"peak allocated {stats['allocated_bytes.all.peak'] / 2**20:.1f} MiB, "
          f"peak reserved {stats['reserved_bytes.all.peak'] / 2**20:.1f} MiB, "
          f"segments taken from the GPU {stats['num_device_alloc']}")
    print(torch.cuda.memory_summary(abbreviated=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
