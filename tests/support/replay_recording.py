"""Snapshots in PyTorch's format written by torchmem's own allocator, for replay tests.

`record()` runs a workload through torchmem's caching allocator on a
simulated device with history on, and returns the snapshot PyTorch's
``_dump_snapshot()`` would hold: final segments, the device trace (with an
``oom`` entry carrying ``device_free`` when the workload runs out of
memory) and ``allocator_settings`` in PyTorch's layout. `begin_mid_run()`
drops the first entries, as a recording started after warm-up does.
"""
from __future__ import annotations

import copy
import random

import torch

from torchmem import _core
from torchmem.formats.snapshot_format import build_snapshot

MiB = 1 << 20
GiB = 1 << 30


def pytorch_settings(conf: str) -> dict:
    """allocator_settings as PyTorch writes them, for the configs these tests use."""
    items = dict(item.split(":", 1) for item in conf.split(",") if item)
    split = int(items["max_split_size_mb"]) * MiB if "max_split_size_mb" in items else -1
    divisions = int(items.get("roundup_power2_divisions", 0))
    return {
        "PYTORCH_CUDA_ALLOC_CONF": conf,
        "max_split_size": split,
        "garbage_collection_threshold": float(items.get("garbage_collection_threshold", 0.0)),
        "expandable_segments": items.get("expandable_segments") == "True",
        "roundup_power2_divisions": {str(1 << i): divisions for i in range(16)},
    }


def record(workload: list[tuple], conf: str = "", capacity: int = 4 * GiB, device: int = 0,
           catch_oom: bool = False, fraction: float = 1.0) -> dict:
    """Run (op, ...) tuples: ("alloc", id, size, stream), ("free", id), ("empty_cache",).

    Stops at the first out-of-memory, as a job that crashes there; with
    catch_oom, goes on (frees of refused ids are skipped), as a job that
    catches the error.
    """
    allocator = _core.CachingAllocator(_core.SimDevice(capacity), conf)
    allocator.enable_history(1 << 22)
    if fraction < 1.0:
        allocator.set_memory_fraction(fraction)
    ptrs: dict[int, int] = {}
    for op in workload:
        if op[0] == "alloc":
            try:
                ptrs[op[1]] = allocator.allocate(op[2], op[3])
            except torch.OutOfMemoryError:
                if not catch_oom:
                    break
        elif op[0] == "free":
            if op[1] in ptrs or not catch_oom:
                allocator.deallocate(ptrs.pop(op[1]))
        elif op[0] == "empty_cache":
            allocator.empty_cache()
    allocator.check_invariants()
    snap = build_snapshot(allocator.segments(), allocator.history(), device=device, settings=pytorch_settings(conf))
    return snap


def begin_mid_run(snapshot: dict, first_entry: int, device: int = 0) -> dict:
    """The same snapshot as if recording had begun at trace entry `first_entry`."""
    out = copy.deepcopy(snapshot)
    out["device_traces"][device] = out["device_traces"][device][first_entry:]
    return out


def random_workload(seed: int, steps: int = 3000, streams: int = 1, empty_cache_every: int = 0,
                    large: float = 0.3) -> list[tuple]:
    """Allocs of mixed sizes (small, 1-10 MiB, 10-200 MiB) and random frees; ids never reused."""
    rng = random.Random(seed)
    live: list[int] = []
    out: list[tuple] = []
    next_id = 0
    for step in range(steps):
        if empty_cache_every and step and step % empty_cache_every == 0:
            out.append(("empty_cache",))
        if live and rng.random() < 0.45:
            out.append(("free", live.pop(rng.randrange(len(live)))))
            continue
        kind = rng.random()
        if kind < 1 - large:
            size = rng.choice([4, 512, 1000, 4096, 70_000, 262_144, 1 << 20]) + rng.randrange(512)
        elif kind < 1 - large / 3:
            size = rng.randrange(1 << 20, 10 << 20)
        else:
            size = rng.randrange(10 << 20, 200 << 20)
        out.append(("alloc", next_id, size, rng.randrange(streams)))
        live.append(next_id)
        next_id += 1
    return out


def alloc_addresses(snapshot: dict, device: int = 0) -> list[int]:
    return [e["addr"] for e in snapshot["device_traces"][device] if e["action"] == "alloc"]


def segment_layout(segments: list[dict]) -> list[tuple]:
    """(address, size, ((block address, size, allocated), ...)) per segment, sorted: comparable across formats."""
    def allocated(b: dict) -> bool:
        return b["allocated"] if "allocated" in b else b["state"] != "inactive"

    return sorted((s["address"], s["total_size"], tuple((b["address"], b["size"], allocated(b)) for b in s["blocks"]))
                  for s in segments)
