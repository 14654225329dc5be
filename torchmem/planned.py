"""Planned allocation at run time: record one step, plan it, serve the next
steps from one slab.

    torchmem.install()
    for batch in loader:
        with torchmem.planned(inputs=batch):     # key: the batch's shapes, bucketed
            loss = step(batch)

The first time a key is seen, the step runs on the caching allocator while
its allocation sequence is recorded; the sequence is planned with
torchmem.plan (every buffer gets an offset in one slab, buffers that never
live together share bytes). From the next step with that key on, the i-th
allocation is served at its planned offset: no search, no splitting. A
request whose size or order differs from the plan, or one beyond it, goes to
the caching allocator and counts a miss; a slot whose bytes are still held
(by a tensor that outlived its planned lifetime or escaped an earlier step)
is never handed out again while held, so a divergent step cannot corrupt
memory. A plan whose step misses more than ``max_miss_ratio`` of its
allocations is dropped and the key is recorded again at its next step.
"""
from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Iterator

from torchmem import _C
from torchmem.memory import caching_allocator
from torchmem.plan import Buffer, solve

ALIGNMENT = 64


@dataclass
class StepReport:
    """What happened in one planned (or recorded) step."""

    key: Hashable
    phase: str                 # "recorded" (this step was recorded and planned) or "planned"
    hits: int = 0              # allocations served from the slab
    misses: int = 0            # served by the caching allocator
    escaped: int = 0           # slab allocations still live when the step ended
    rerecord: bool = False     # the plan missed too often and will be recorded again


@dataclass
class PlanEntry:
    slab: "_C.PlannedSlab"
    plan_height: int
    lower_bound: int
    planned_slots: int
    unplanned_slots: int
    method: str
    history: list[StepReport] = field(default_factory=list)


_plans: dict[Hashable, PlanEntry] = {}


def plans() -> dict[Hashable, PlanEntry]:
    """The plans made so far, by key."""
    return dict(_plans)


def forget(key: Hashable | None = None) -> None:
    """Drop one plan (or all): the key is recorded again at its next step."""
    if key is None:
        _plans.clear()
    else:
        _plans.pop(key, None)


def shape_key(inputs: Any, bucket: int = 64) -> Hashable:
    """A key from the shapes of the tensors in `inputs`, each dimension rounded
    up to a multiple of `bucket` (so sequence lengths 100 and 120 share a plan
    when the program pads to the bucket)."""
    import torch

    if bucket < 1:
        raise ValueError(f"bucket must be >= 1, got {bucket}")

    def walk(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return (str(x.dtype), tuple(-(-d // bucket) * bucket for d in x.shape))
        if isinstance(x, (list, tuple)):
            return tuple(walk(v) for v in x)
        if isinstance(x, dict):
            return tuple((k, walk(v)) for k, v in sorted(x.items(), key=lambda kv: str(kv[0])))
        return x if isinstance(x, (int, float, str, bool, type(None))) else type(x).__name__

    return walk(inputs)


def _buffers(events: list[dict]) -> tuple[list[Buffer], list[int]]:
    """Buffers for allocations freed within the step; sizes by allocation index."""
    sizes: list[int] = []
    start: dict[int, int] = {}
    buffers = []
    for t, e in enumerate(events):
        if e["op"] == "alloc":
            start[e["id"]] = t
            sizes.append(e["size"])
        elif e["id"] in start:
            i = e["id"]
            buffers.append(Buffer(i, start.pop(i), t, sizes[i]))
    return buffers, sizes


def _make_entry(events: list[dict], fallback: Any, method: str, time_limit: float) -> PlanEntry:
    buffers, sizes = _buffers(events)
    plan = solve(buffers, method=method, time_limit=time_limit, alignment=ALIGNMENT)
    offsets = [_C.PlannedSlab.UNPLANNED] * len(sizes)
    for b, off in zip(plan.buffers, plan.offsets):
        offsets[b.id] = off
    slab = _C.PlannedSlab(_C.HostDevice(), sizes, offsets, plan.height, fallback)
    return PlanEntry(slab, plan.height, plan.lower_bound, len(buffers), len(sizes) - len(buffers), plan.method)


@contextlib.contextmanager
def planned(
    key: Hashable | None = None,
    *,
    inputs: Any = None,
    bucket: int = 64,
    method: str = "auto",
    time_limit: float = 2.0,
    max_miss_ratio: float = 0.25,
) -> Iterator[StepReport]:
    """Run one step with planned allocation (see the module docstring).

    Args:
        key: names the plan; default: shape_key(inputs, bucket), or one plan
            for all steps when no inputs are given either.
        method, time_limit: passed to torchmem.plan.solve.
        max_miss_ratio: above this fraction of missed allocations in a step,
            the plan is dropped and recorded again.
    Yields a StepReport, filled in when the block ends.
    """
    if not 0.0 <= max_miss_ratio <= 1.0:
        raise ValueError(f"max_miss_ratio must be in [0, 1], got {max_miss_ratio}")
    caching = caching_allocator()
    if caching is None or not _C.cpu_installed():
        raise RuntimeError("torchmem.planned() needs torchmem.install() first")
    if key is None:
        key = shape_key(inputs, bucket) if inputs is not None else "default"
    entry = _plans.get(key)
    if entry is None:
        report = StepReport(key, "recorded")
        recorder = _C.RecordingAllocator(caching)
        _C.push_thread_allocator(recorder)
        try:
            yield report
        finally:
            _C.pop_thread_allocator()
        _plans[key] = _make_entry(recorder.events(), caching, method, time_limit)
        report.misses = sum(1 for e in recorder.events() if e["op"] == "alloc")
        return
    report = StepReport(key, "planned")
    entry.slab.begin_step()
    _C.push_thread_allocator(entry.slab)
    try:
        yield report
    finally:
        _C.pop_thread_allocator()
        report.escaped = entry.slab.end_step()
        stats = entry.slab.stats()
        report.hits, report.misses = stats["step_hits"], stats["step_misses"]
        total = report.hits + report.misses
        if total and report.misses / total > max_miss_ratio:
            report.rerecord = True
            del _plans[key]
        entry.history.append(report)


def planned_step(key_fn: Callable[..., Hashable] | None = None, *, bucket: int = 64, **options: Any) -> Callable:
    """Decorator form of planned(): the key comes from key_fn(*args, **kwargs),
    or from the shapes of the arguments, bucketed."""

    def decorate(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            key = key_fn(*args, **kwargs) if key_fn else shape_key((args, kwargs), bucket)
            with planned(key, **options):
                return fn(*args, **kwargs)

        return wrapper

    return decorate


@dataclass
class FragmentationReport:
    free_blocks: int
    active_blocks: int
    largest_free: int
    reserved_but_free: int
    largest_recent_request: int
    compact: bool
    reason: str


def fragmentation_watch(recent_sizes: list[int] | None = None, factor: float = 4.0, device: Any = None) -> FragmentationReport:
    """The caching allocator's fragmentation, and whether to re-plan or compact.

    `compact` is True when free blocks outnumber active ones by more than
    `factor`, or when the largest free block cannot serve the largest of the
    `recent_sizes` although the cache holds enough free bytes for it (then
    empty_cache() or a planned step would help).
    """
    allocator = caching_allocator(device)
    if allocator is None:
        raise RuntimeError("torchmem is not installed: call torchmem.install() first")
    if factor <= 0:
        raise ValueError(f"factor must be > 0, got {factor}")
    blocks = [b for s in allocator.segments() for b in s["blocks"]]
    free = [b["size"] for b in blocks if not b["allocated"]]
    active = sum(1 for b in blocks if b["allocated"])
    largest = max(free, default=0)
    recent = max(recent_sizes or [0])
    reason = ""
    if len(free) > factor * max(active, 1):
        reason = f"{len(free)} free blocks against {active} active (factor {factor})"
    elif recent > largest and sum(free) >= recent:
        reason = f"the largest free block ({largest} bytes) cannot serve a recent request of {recent} bytes"
    return FragmentationReport(len(free), active, largest, sum(free), recent, bool(reason), reason)
