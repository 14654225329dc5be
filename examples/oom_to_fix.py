"""From an out-of-memory error to its fix, on CPU, in one run.

    python examples/oom_to_fix.py [--capacity 276MiB] [--out DIR]

1. Trains a small MLP with torchmem as PyTorch's CPU allocator, limited to
   --capacity, with torchmem.install(..., dump_on_oom=...). The sequence
   length changes every step, which fragments the caching allocator's
   segments, and a step runs out of memory. The error names the snapshot
   dump_on_oom wrote.
2. `torchmem replay SNAPSHOT`: the run replayed from the file alone, on a
   simulated device, down to the same OOM with the same reserved bytes.
3. `torchmem advise SNAPSHOT`: the least memory each allocator setting
   needs for this run, best first.
4. Trains again, in the same capacity, with the best setting: it completes.

On a GPU the same three lines apply (torchmem.install(dump_on_oom=True), or
torchmem.dump_on_oom() with PyTorch's own CUDA allocator); under torchrun
each rank writes its own oom_rank{rank}_pid{pid}.pickle.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

import torch

import torchmem
from torchmem.cli import main as torchmem_cli
from torchmem.replay import advise

# PyTorch's own rules on the CPU too (torchmem's CPU settings off, docs/cpu.md),
# so the run and its advice are those of PyTorch's CUDA allocator.
NATIVE = "reuse_order:address,min_block_size:512"
LENGTHS = [96, 480, 200, 640, 130, 560, 320, 700, 150, 600]  # tokens per sample, one length per step


def train() -> None:
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(4):
        layers += [torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256)]
    model = torch.nn.Sequential(*layers)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    for length in LENGTHS:
        x = torch.randn(8 * length, 256)
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--capacity", default="276MiB", help="the CPU memory torchmem may use (default 276MiB)")
    parser.add_argument("--out", default=None, help="where the snapshot goes (default: a new temporary directory)")
    args = parser.parse_args()
    out = args.out or tempfile.mkdtemp(prefix="torchmem-oom-")

    print(f"== 1. Training in {args.capacity} with PyTorch's default allocator settings")
    torchmem.install(conf=f"{NATIVE},capacity:{args.capacity}", dump_on_oom=os.path.join(out, "oom_rank{rank}_pid{pid}.pickle"))
    try:
        train()
    except torch.OutOfMemoryError as e:
        print(f"torch.OutOfMemoryError: {e}\n")
    else:
        print(f"No out-of-memory error in {args.capacity}: give a smaller --capacity.")
        return 1
    snapshot = torchmem.runtime.oom.written_snapshots()[-1]
    torchmem.dump_on_oom(None)

    print(f"== 2. torchmem replay {snapshot}")
    torchmem_cli(["replay", snapshot, "--no-progress"])

    print(f"\n== 3. torchmem advise {snapshot}")
    torchmem_cli(["advise", snapshot, "--no-progress"])
    rows = advise(snapshot)
    best = next(r for r in rows if r.policy == "native")  # a setting PYTORCH_CUDA_ALLOC_CONF takes
    stitched = next((r for r in rows if r.policy == "stitch"), None)
    if best.recorded or not best.completes:
        print("\nNo setting avoids this OOM in the same memory.")
        return 0

    print(f"\n== 4. Training again in {args.capacity} with {best.conf}")
    torchmem.install(conf=f"{NATIVE},{best.conf},capacity:{args.capacity}")
    train()
    print(f"Completed: peak reserved {torchmem.max_memory_reserved() / 2**20:.0f} MiB of {args.capacity}.")
    print(f"On a GPU: PYTORCH_CUDA_ALLOC_CONF={best.conf} (or TORCHMEM_ALLOC_CONF with torchmem installed).")
    if stitched is not None and stitched.min_capacity is not None:
        print(f"torchmem's own policy:stitch needs {stitched.min_capacity / 2**20:.0f} MiB for this run "
              f"({best.min_capacity / 2**20:.0f} MiB with {best.conf}); docs/stitch.md.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
