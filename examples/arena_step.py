"""Per-step scratch memory from an arena.

    .venv/bin/python examples/arena_step.py

torchmem.install() makes torchmem PyTorch's CPU allocator; inside
``with torchmem.arena(a):`` every CPU tensor this thread creates is a pointer
bump in one region, frees are no-ops, and leaving the block resets the arena,
so each inference step reuses the same memory. The step's output escapes the
block: the arena keeps its memory valid and resets once it is freed.
"""
import torch

import torchmem
from torchmem.arena import Arena, arena


def main() -> None:
    torchmem.install()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 512))
    scratch = Arena(64 << 20)  # one region for every step

    with torch.no_grad():
        for step in range(3):
            x = torch.randn(64, 512)
            with arena(scratch):
                y = model(x)  # activations come from the arena
                score = float(y.square().mean())
            # y escaped: its memory stays valid; nothing else is live.
            print(f"step {step}: score {score:.4f}, arena peak {scratch.peak / 2**20:.2f} MiB, "
                  f"live after the block {scratch.live_allocations}, used {scratch.used / 2**20:.2f} MiB")
            del y  # the last escaped tensor: the arena resets itself
            assert scratch.used == 0

    # A step that does not fit raises torch.OutOfMemoryError with the arena's figures...
    try:
        with arena(1 << 20):
            torch.empty(4 << 20, dtype=torch.uint8)
    except torch.OutOfMemoryError as e:
        print("small arena:", str(e).splitlines()[0][:100], "...")
    # ...or falls back to the caching allocator, counted.
    with arena(1 << 20, fallback="caching") as a:
        big = torch.empty(4 << 20, dtype=torch.uint8)
        del big
    print("fallback allocations:", a.stats()["fallback_allocations"])


if __name__ == "__main__":
    main()
