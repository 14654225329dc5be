"""Per-step scratch memory from an arena, in an ordinary training loop.

    .venv/bin/python examples/arena_step.py

torchmem.install() makes torchmem PyTorch's CPU allocator; inside
``with torchmem.arena(scratch):`` every CPU tensor this thread creates is a
pointer bump in one region, and each block starts again from the region's
start. The loop keeps its variables (x, target, loss) past the block, as
loops do: the next block steps over their bytes, and reuses them once the
next step has replaced them, so the arena's peak stays flat.
"""
import torch

import torchmem


def main() -> None:
    torchmem.install()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    scratch = torchmem.Arena(64 << 20)  # one region for every step

    total = 0.0
    for step in range(20):
        with torchmem.arena(scratch):
            x = torch.randn(64, 512)
            target = torch.randint(0, 10, (64,))
            loss = torch.nn.functional.cross_entropy(model(x), target)
            loss.backward()
            opt.step()
            opt.zero_grad()
        total += loss.item()
        b = scratch.last_block
        if step < 3 or step % 5 == 4:
            print(f"step {step:2d}: loss {loss.item():.4f}, block peak {b['peak'] / 2**20:.2f} MiB, "
                  f"kept from earlier blocks {b['holes']} ({b['hole_bytes'] / 2**20:.2f} MiB), "
                  f"holes skipped {b['holes_skipped']}, peak so far {scratch.peak / 2**20:.2f} MiB")

    # A step that does not fit raises torch.OutOfMemoryError with the arena's figures...
    try:
        with torchmem.arena(1 << 20):
            torch.empty(4 << 20, dtype=torch.uint8)
    except torch.OutOfMemoryError as e:
        print("small arena:", str(e)[:110], "...")
    # ...or falls back to the caching allocator, counted.
    with torchmem.arena(1 << 20, fallback="caching") as a:
        big = torch.empty(4 << 20, dtype=torch.uint8)
        del big
    print("fallback allocations:", a.last_block["fallback_allocations"])


if __name__ == "__main__":
    main()
