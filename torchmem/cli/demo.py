"""`torchmem demo`: the main job. Swap the allocator in, train, watch memory."""
from __future__ import annotations

import argparse
import os
import time

import torchmem
from torchmem.replay import compare, min_capacity, replay, workloads
from torchmem.viz.replays import plot_replays


def train_with_torchmem(steps: int) -> None:
    import torch

    torch.manual_seed(0)
    torchmem.install()
    print("torchmem.install(): PyTorch's CPU allocator is now torchmem's caching allocator\n")
    layer = torch.nn.TransformerEncoderLayer(256, 4, 1024, batch_first=True, dropout=0.0)
    model = torch.nn.TransformerEncoder(layer, 2)
    head = torch.nn.Linear(256, 1000)
    params = list(model.parameters()) + list(head.parameters())
    opt = torch.optim.AdamW(params, lr=1e-4)
    lengths = [64, 192, 96, 256, 128, 224, 80, 160, 240, 112]
    print(f"{'step':>4} {'seq':>4} {'allocated':>10} {'reserved':>10} {'peak alloc':>11} {'peak resv':>10} {'cached':>8} {'ms':>6}")
    for step in range(steps):
        seq = lengths[step % len(lengths)]
        start = time.perf_counter()
        x = torch.randn(8, seq, 256)
        target = torch.randint(0, 1000, (8, seq))
        logits = head(model(x))
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 1000), target.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del x, target, logits, loss
        ms = (time.perf_counter() - start) * 1e3
        s = torchmem.memory_stats()
        allocated, reserved = s["allocated_bytes.all.current"], s["reserved_bytes.all.current"]
        print(
            f"{step:>4} {seq:>4} {mib(allocated):>10} {mib(reserved):>10} {mib(s['allocated_bytes.all.peak']):>11} "
            f"{mib(s['reserved_bytes.all.peak']):>10} {mib(reserved - allocated):>8} {ms:>6.0f}"
        )
    torchmem.caching_allocator().check_invariants()
    print()
    print(torchmem.memory_summary(abbreviated=True))
    torchmem.empty_cache()
    print(f"after empty_cache(): allocated {mib(torchmem.memory_allocated())}, reserved {mib(torchmem.memory_reserved())}")
    torchmem.uninstall()


def mib(n: int) -> str:
    return f"{n / 2**20:.1f}M"


DEMO_CONFS = [
    "",
    "expandable_segments:True",
    "max_split_size_mb:512",
    "garbage_collection_threshold:0.8,per_process_memory_fraction:0.99",
    "policy:stitch",
]


def replay_fragmentation(out_dir: str) -> None:
    shape = workloads.FRAGMENTING_SHAPE
    lengths = workloads.FRAGMENTING_LENGTHS
    print(
        f"A transformer with {shape.layers} layers (hidden {shape.hidden}, batch {shape.batch}) trained for {len(lengths)} steps "
        f"with sequence lengths {', '.join(map(str, lengths))},\nreplayed on a simulated 80 GiB GPU "
        "with PyTorch's default allocator settings:\n"
    )
    trace = workloads.fragmenting_training()
    results = compare(trace, DEMO_CONFS, capacity="80GiB")
    print(results[0].explain())
    print("\nPyTorch's message would read:\n  " + results[0].oom["message"] if results[0].oom else "")
    print("\nThe same trace under other settings:\n")
    floor = replay(trace, "1TiB", "").stats["requested_bytes"]["all"]["peak"]
    print(f"{'config':<66} {'peak alloc':>10} {'peak resv':>10} {'least GPU':>10}  outcome")
    for r in results:
        outcome = "completed" if r.completed else f"OOM at event {r.oom['index']:,}"
        need = min_capacity(trace, r.conf)
        label = (r.conf or "(default)") + (" [torchmem]" if r.policy == "stitch" else "")
        print(f"{label:<66} {r.peak_allocated / 2**30:>9.2f}G {r.peak_reserved / 2**30:>9.2f}G "
              f"{need / 2**30:>9.2f}G  {outcome}")
    stitched = results[-1]
    print(f"\nThe peak of bytes live at once is {floor / 2**30:.2f} GiB. torchmem's policy:stitch (docs/stitch.md) places "
          "blocks in a large virtual range and maps 2 MiB pages where they land, unmapping free pages anywhere when "
          f"the device is short: it completes with {stitched.counters['page_maps']:,} page maps and "
          f"{stitched.counters['page_unmaps']:,} unmaps for {stitched.allocations:,} allocations. "
          "Install it with torchmem.install(conf=\"policy:stitch\") or TORCHMEM_ALLOC_CONF=policy:stitch.")
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "replay.png")
    plot_replays([results[0], results[1], stitched], path, title="the same training trace on a simulated 80 GiB GPU")
    print(f"\nwrote {path}: allocated and reserved over the trace: default, expandable segments, policy:stitch")


def run(args: argparse.Namespace) -> int:
    if args.steps < 1:
        raise ValueError("--steps must be at least 1")
    print("== 1. The one-line swap: training a transformer on torchmem's caching allocator ==\n")
    train_with_torchmem(args.steps)
    print("\n== 2. A fragmentation out-of-memory, reproduced on a simulated GPU, and its fix ==\n")
    replay_fragmentation(args.out)
    return 0
