"""Record one training step, plan it, and serve the next steps from one region.

    python examples/planned_step.py

Sequence lengths vary; steps are bucketed by shape (lengths rounded up to 32
and padded), so each bucket gets its own plan: its first step warms up (the
optimizer makes its state), its second is recorded and planned, the rest are
served from the plan. The buckets' plans share one region, as tall as the
tallest plan, held as one block of the caching allocator.
"""
import torch

import torchmem
from torchmem.runtime.planned import planned, plans, slab_stats


def main() -> None:
    torch.manual_seed(0)
    torchmem.install()
    layer = torch.nn.TransformerEncoderLayer(128, 4, 256, dropout=0.0, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    print(f"{'step':>4} {'len':>4} {'bucket':>6} {'phase':>9} {'hits':>5} {'misses':>6}")
    for step, length in enumerate([40, 60, 33, 50, 64, 41, 90, 70, 95, 35]):
        bucket = -(-length // 32) * 32
        x = torch.nn.functional.pad(torch.randn(8, length, 128), (0, 0, 0, bucket - length))
        with planned(key=bucket) as report:
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            del loss
        print(f"{step:>4} {length:>4} {bucket:>6} {report.phase:>9} {report.hits:>5} {report.misses:>6}")
        if step == 0:  # long-lived tensors exist now: one block for the weights
            print(torchmem.compact(model, opt).explain())
    for key, entry in plans().items():
        print(f"bucket {key}: plan {entry.plan_height / 2**20:.2f} MiB, lower bound {entry.lower_bound / 2**20:.2f} MiB "
              f"({entry.planned_slots} planned allocations, {entry.unplanned_slots} outlive the step)")
    mib = 2**20
    print(f"shared region {slab_stats()['region_bytes'] / mib:.2f} MiB; torchmem reserved "
          f"{torchmem.memory_reserved() / mib:.2f} MiB, allocated {torchmem.memory_allocated() / mib:.2f} MiB "
          "(weights, optimizer state and the region)")
    torchmem.caching_allocator().check_invariants()


if __name__ == "__main__":
    main()
