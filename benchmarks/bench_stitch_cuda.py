"""What policy:stitch's device calls cost on a GPU (a stage of scripts/gpu_check.sh).

    python benchmarks/bench_stitch_cuda.py [--out DIR] [--pages 128] [--rounds 5]

1. Microseconds per 2 MiB page of CudaDevice::map (cuMemCreate + cuMemMap +
   cuMemSetAccess) and unmap (cudaDeviceSynchronize + cuMemUnmap +
   cuMemRelease), one page per call as the policy makes them, and all pages
   in one call for comparison.
2. The policy on cuMem* pages (its own CudaDevice, outside the installed
   allocator): the demo's training trace scaled to 1/64 of its sizes (about
   1.1 GiB at its peak), replayed at its least capacity and with 10%
   headroom, each allocation written through torch (on the fake GPU, which
   runs no kernels, its first and last bytes by copies); wall time, page maps and
   unmaps, and the time the per-page cost predicts.

Writes bench_stitch_cuda.json and bench_stitch_cuda.md to --out. Needs a CUDA
build of torchmem (torchmem._C.cuda_time_page_calls).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
MiB = 2**20
FAKE_GPU = os.environ.get("TORCHMEM_FAKEGPU") == "1"  # the fake GPU runs no kernels: data is written by copies


class Region:
    """Device memory at `ptr` seen by torch through __cuda_array_interface__ (no copy)."""

    def __init__(self, ptr: int, size: int):
        self.__cuda_array_interface__ = {"shape": (size,), "typestr": "|u1", "data": (ptr, False), "version": 3}


def scaled_trace(scale: int = 64) -> list[tuple[int, int, int]]:
    """(op, id, size) of the demo's training trace, sizes divided by `scale` (at least 512 B)."""
    from torchmem.replay import workloads

    out = []
    for chunk in workloads.fragmenting_training().chunks():
        for op, id_, size in zip(chunk.ops.tolist(), chunk.ids.tolist(), chunk.sizes.tolist()):
            out.append((op, id_, max(512, size // scale)))
    return out


def run_trace(events, capacity: int, touch: bool) -> dict:
    import torch

    from torchmem import _C

    total = torch.cuda.get_device_properties(0).total_memory
    # The limit on mapped bytes is the capacity (+1 MiB against rounding: still less than a page more).
    a = _C.cuda_stitch_allocator(0, f"policy:stitch,per_process_memory_fraction:{(capacity + MiB) / total:.12f}")
    live: dict[int, tuple[int, int]] = {}
    torch.cuda.synchronize()
    start = time.perf_counter()
    completed = True
    for op, id_, size in events:
        if op == 0:
            try:
                p = a.allocate(size)
            except torch.OutOfMemoryError:
                completed = False
                break
            live[id_] = (p, size)
            if touch and FAKE_GPU:  # no kernels run there: the first and last bytes written by copies
                t = torch.as_tensor(Region(p, size), device="cuda")
                mark = torch.tensor([id_ & 0xFF], dtype=torch.uint8)
                t[:1].copy_(mark)
                t[-1:].copy_(mark)
            elif touch:
                torch.as_tensor(Region(p, size), device="cuda").fill_(id_ & 0xFF)
        else:
            p, _ = live.pop(id_)
            a.deallocate(p)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    ok = all(int(torch.as_tensor(Region(p, s), device="cuda")[s - 1]) == (i & 0xFF) and
             (not FAKE_GPU or int(torch.as_tensor(Region(p, s), device="cuda")[0]) == (i & 0xFF))
             for i, (p, s) in live.items()) if touch else True
    a.check_invariants()
    c = a.counters()
    for p, _ in live.values():
        a.deallocate(p)
    a.empty_cache()
    return {"capacity": capacity, "completed": completed, "seconds": seconds, "intact": ok,
            "allocations": sum(1 for e in events if e[0] == 0), **c}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.path.join(ROOT, "out", "bench_stitch_cuda"))
    parser.add_argument("--pages", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    import torch

    from torchmem import _C
    from torchmem import replay as sim
    from torchmem.formats.traces import from_events

    if not torch.cuda.is_available() or not hasattr(_C, "cuda_time_page_calls"):
        print("bench_stitch_cuda: needs a GPU and a CUDA build of torchmem", file=sys.stderr)
        return 3
    os.makedirs(args.out, exist_ok=True)
    timing = _C.cuda_time_page_calls(0, args.pages, args.rounds)
    events = scaled_trace()
    trace = from_events([{"op": "alloc" if op == 0 else "free", "id": i, "size": s} for op, i, s in events])
    least = sim.min_capacity(trace, "policy:stitch")
    runs = []
    for label, capacity in (("least", least), ("+10%", int(least * 1.1) // (2 * MiB) * (2 * MiB))):
        r = run_trace(events, capacity, touch=True)
        calls_us = r["page_maps"] * timing["map_us_per_page"] + r["page_unmaps"] * timing["unmap_us_per_page"]
        r.update(label=label, predicted_device_call_seconds=calls_us / 1e6)
        runs.append(r)
    result = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "timing": timing, "runs": runs}
    with open(os.path.join(args.out, "bench_stitch_cuda.json"), "w") as f:
        json.dump(result, f, indent=1)
    lines = [
        f"policy:stitch device calls on {result['gpu']} (torch {result['torch']}):",
        "",
        "| call | us per 2 MiB page |",
        "|---|---:|",
        f"| map, one page per call (the policy) | {timing['map_us_per_page']:.1f} |",
        f"| unmap, one page per call (the policy) | {timing['unmap_us_per_page']:.1f} |",
        f"| map, {timing['pages']} pages in one call | {timing['map_run_us_per_page']:.1f} |",
        f"| unmap, {timing['pages']} pages in one call | {timing['unmap_run_us_per_page']:.1f} |",
        "",
        "| demo trace / 64 | capacity MiB | completed | data intact | allocations | page maps | page unmaps | s | s in device calls (predicted) |",
        "|---|---:|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        lines.append(f"| {r['label']} | {r['capacity'] / MiB:,.0f} | {r['completed']} | {r['intact']} | {r['allocations']:,} | "
                     f"{r['page_maps']:,} | {r['page_unmaps']:,} | {r['seconds']:.3f} | {r['predicted_device_call_seconds']:.3f} |")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "bench_stitch_cuda.md"), "w") as f:
        f.write(text)
    print(text)
    return 0 if all(r["completed"] and r["intact"] for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
