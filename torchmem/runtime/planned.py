"""Planned allocation at run time: record one step, plan it, serve the next
steps from one region.

    torchmem.install()
    for batch in loader:
        with torchmem.planned(inputs=batch):     # key: the batch's shapes, bucketed
            loss = step(batch)

Each key (a shape bucket) goes through three phases. Warm-up: its first
``warmup`` steps run on the caching allocator untouched, so that state made
once (optimizer moments, lazily built caches) exists before anything is
recorded, as with CUDA graph capture. Recording: the next step runs on the
caching allocator while its allocation sequence is recorded; the sequence is
planned with torchmem.plan (every buffer gets an offset, buffers that never
live together share bytes), and, with ``release_cache``, the caching
allocator gives its cache back so the recorded step's memory is not held
twice. Planned: from then on, the i-th allocation is served at its planned
offset: no search, no splitting.

All plans of a device share one region, as tall as the tallest plan (one
step runs at a time); while a key is recorded, an idle region goes back to
the caching allocator, whose cache the recorded step may then reuse, and it
is drawn again after. The region is one block of the caching allocator, so
``torchmem.memory_reserved()`` / ``memory_allocated()`` (and
``torch.cuda.memory_stats()`` on CUDA) include it.

Allocations that outlive the recorded step (a returned loss, gradients kept
until the next ``zero_grad()``) are part of the step's shape: the plan
expects them at their place in the sequence and sends them to the caching
allocator, counted as ``unplanned``, not as misses. A request whose size,
order or stream differs from the plan, or one beyond it, goes to the
caching allocator and counts a miss; a slot whose bytes are
still held (by a tensor that outlived its planned lifetime or escaped an
earlier step) is never handed out again while held, so a divergent step
cannot corrupt memory. A plan whose step misses more than ``max_miss_ratio``
of its allocations is dropped and the key is recorded again at its next step.

One planned step runs at a time per device (blocks do not nest), on the
thread that entered the block; allocations of other threads are unaffected.

Fork: a forked child has only the thread that forked. A step that another
thread of the parent had under way is closed in the child (its thread is not
there to close it), so the child can run planned steps of its own; tensors
of that step stay valid and are freed as usual.
"""
from __future__ import annotations

import contextlib
import functools
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Iterator

import torch  # loads libc10 before the extension

from torchmem import _C, _core

from torchmem.runtime import devices
from torchmem.runtime.memory import caching_allocator, empty_cache
from torchmem.plan import Buffer, solve

ALIGNMENT = 64
PHASES = ("warmup", "recorded", "planned")


@dataclass
class StepReport:
    """What happened in one step run under planned()."""

    key: Hashable
    phase: str                 # one of PHASES
    hits: int = 0              # allocations served from the region
    misses: int = 0            # served by the caching allocator against the plan (when recording: every allocation)
    unplanned: int = 0         # served by the caching allocator as planned: they outlive the step each step
    escaped: int = 0           # region allocations still live when the step ended
    rerecord: bool = False     # the plan missed too often and will be recorded again


@dataclass
class PlanEntry:
    """One key's plan."""

    device: str
    plan_id: int
    plan_height: int           # bytes of region the plan needs
    lower_bound: int           # the most bytes its planned buffers hold at once
    planned_slots: int         # allocations served from the region
    unplanned_slots: int       # allocations that outlived the recorded step (or ran on another stream)
    method: str
    history: list[StepReport] = field(default_factory=list)


@dataclass
class _DeviceState:
    device: str
    fallback: Any              # the device's caching allocator
    slab: "_core.PlannedSlab"
    push: Callable[[Any], None]
    pop: Callable[[], None]
    plans: dict[Hashable, PlanEntry] = field(default_factory=dict)
    warmed: dict[Hashable, int] = field(default_factory=dict)   # warm-up steps run, by key
    rerecord: set = field(default_factory=set)                   # keys recorded again without warming up
    in_step: bool = False
    step_thread: int = 0       # threading.get_ident() of the thread running the step


_states: dict[str, _DeviceState] = {}


def _close_orphaned_steps() -> None:
    """In a forked child: close the steps of threads the child does not have."""
    me = threading.get_ident()
    for state in _states.values():
        if state.in_step and state.step_thread != me:
            state.slab.end_step()
            state.in_step = False


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_orphaned_steps)


def device_name(device: Any = None) -> str:
    """The device planned() uses for `device`: "cpu" or "cuda:N" (torchmem.runtime.devices' rule; None: "cuda:<current>"
    when torchmem is installed on CUDA, else "cpu")."""
    try:
        return devices.device_name(device)
    except ValueError:
        raise ValueError(f"planned(): device must be 'cpu', 'cuda', 'cuda:N' or a torch.device, got {device!r}") from None


def in_planned_step(device: Any = None) -> bool:
    """Whether a planned() block is under way on `device`."""
    state = _states.get(device_name(device))
    return bool(state and state.in_step)


def _state(device: Any) -> _DeviceState:
    name = device_name(device)
    if name == "cpu":
        fallback = caching_allocator("cpu")
        if fallback is None or not devices.cpu_installed():
            raise RuntimeError("torchmem.planned() needs torchmem.install() first")
        push, pop = _C.push_thread_allocator, _C.pop_thread_allocator
    else:
        if not devices.cuda_installed():
            raise RuntimeError(f"torchmem.planned(device={name!r}) needs torchmem.install() on CUDA first")
        index = int(name.split(":")[1])
        fallback = caching_allocator(name)
        push = functools.partial(_C.cuda_push_thread_allocator, index)
        pop = functools.partial(_C.cuda_pop_thread_allocator, index)
    state = _states.get(name)
    if state is None or state.fallback is not fallback:  # first use, or install() made a new caching allocator
        state = _DeviceState(name, fallback, _core.PlannedSlab(fallback), push, pop)
        _states[name] = state
    return state


def plans(device: Any = None) -> dict[Hashable, PlanEntry]:
    """The plans made so far on `device` (default as in planned()), by key."""
    state = _states.get(device_name(device))
    return dict(state.plans) if state else {}


def slab_stats(device: Any = None) -> dict[str, int]:
    """The device's planned region: steps, hits, misses, region_bytes, plans, ... ({} before any plan)."""
    state = _states.get(device_name(device))
    return state.slab.stats() if state else {}


def forget(key: Hashable | None = None, device: Any = None) -> None:
    """Drop one plan (or all of a device's): the key warms up and is recorded again.
    With no plan left, the region goes back to the caching allocator once nothing in it is live."""
    state = _states.get(device_name(device))
    if state is None:
        return
    keys = list(state.plans) if key is None else [key]
    for k in keys:
        entry = state.plans.pop(k, None)
        if entry is not None:
            state.slab.remove_plan(entry.plan_id)
        state.warmed.pop(k, None)
        state.rerecord.discard(k)


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


def _buffers(events: list[dict]) -> tuple[list[Buffer], list[int], list[int]]:
    """Buffers for the allocations freed within the step on its main stream
    (the first allocation's); sizes and streams by allocation index."""
    sizes: list[int] = []
    streams: list[int] = []
    start: dict[int, int] = {}
    buffers = []
    for t, e in enumerate(events):
        if e["op"] == "alloc":
            start[e["id"]] = t
            sizes.append(e["size"])
            streams.append(e["stream"])
        elif e["id"] in start:
            i = e["id"]
            begin = start.pop(i)
            if streams[i] == streams[0]:
                buffers.append(Buffer(i, begin, t, sizes[i]))
    return buffers, sizes, streams


def _add_plan(state: _DeviceState, events: list[dict], method: str, time_limit: float) -> PlanEntry:
    buffers, sizes, streams = _buffers(events)
    plan = solve(buffers, method=method, time_limit=time_limit, alignment=ALIGNMENT)
    offsets = [_core.PlannedSlab.UNPLANNED] * len(sizes)
    for b, off in zip(plan.buffers, plan.offsets):
        offsets[b.id] = off
    plan_id = state.slab.add_plan(sizes, offsets, streams, plan.height)
    return PlanEntry(state.device, plan_id, plan.height, plan.lower_bound, len(buffers), len(sizes) - len(buffers), plan.method)


@contextlib.contextmanager
def planned(
    key: Hashable | None = None,
    *,
    inputs: Any = None,
    bucket: int = 64,
    device: Any = None,
    warmup: int = 1,
    method: str = "auto",
    time_limit: float = 2.0,
    max_miss_ratio: float = 0.25,
    release_cache: bool = True,
) -> Iterator[StepReport]:
    """Run one step with planned allocation (see the module docstring).

    Args:
        key: names the plan; default: shape_key(inputs, bucket), or one plan
            for all steps when no inputs are given either.
        device: "cpu", "cuda", "cuda:N" or a torch.device; default "cuda"
            when torchmem is installed on CUDA, else "cpu".
        warmup: steps of a new key run untouched before one is recorded.
        method, time_limit: passed to torchmem.plan.solve.
        max_miss_ratio: when a step's misses (unplanned allocations, which the
            plan expects, are not misses), plus the plan's slots it never
            reached, exceed this fraction of the plan's slots (or of the step's
            allocations, if more), the plan is dropped and recorded again.
        release_cache: after recording, give the caching allocator's cache
            back to the device (empty_cache), before the region is drawn.
    Yields a StepReport, filled in when the block ends. A step that raises is
    neither recorded nor counted against its plan's misses.
    """
    if not 0.0 <= max_miss_ratio <= 1.0:
        raise ValueError(f"max_miss_ratio must be in [0, 1], got {max_miss_ratio}")
    if bucket < 1:
        raise ValueError(f"bucket must be >= 1, got {bucket}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be an int >= 0, got {warmup!r}")
    state = _state(device)
    if state.in_step:
        raise RuntimeError(f"planned() blocks do not nest: a planned step is already under way on {state.device}")
    if key is None:
        key = shape_key(inputs, bucket) if inputs is not None else "default"
    state.in_step, state.step_thread = True, threading.get_ident()
    try:
        entry = state.plans.get(key)
        if entry is not None:
            with _planned_step(state, key, entry, max_miss_ratio) as report:
                yield report
        elif key not in state.rerecord and state.warmed.get(key, 0) < warmup:
            state.warmed[key] = state.warmed.get(key, 0) + 1
            yield StepReport(key, "warmup")
        else:
            with _recorded_step(state, key, method, time_limit, release_cache) as report:
                yield report
    finally:
        state.in_step = False


@contextlib.contextmanager
def _recorded_step(state: _DeviceState, key: Hashable, method: str, time_limit: float, release_cache: bool) -> Iterator[StepReport]:
    report = StepReport(key, "recorded")
    state.slab.release_idle_region()  # the recorded step may reuse its bytes through the cache
    recorder = _core.RecordingAllocator(state.fallback)
    state.push(recorder)
    try:
        yield report
    finally:
        state.pop()
    events = recorder.events()
    if release_cache:  # before the region is drawn, so the two never coexist
        empty_cache(state.device)
    entry = _add_plan(state, events, method, time_limit)
    state.plans[key] = entry
    state.rerecord.discard(key)
    report.misses = sum(1 for e in events if e["op"] == "alloc")
    entry.history.append(report)


@contextlib.contextmanager
def _planned_step(state: _DeviceState, key: Hashable, entry: PlanEntry, max_miss_ratio: float) -> Iterator[StepReport]:
    report = StepReport(key, "planned")
    state.slab.begin_step(entry.plan_id)
    state.push(state.slab)
    try:
        yield report
    finally:
        state.pop()
        report.escaped = state.slab.end_step()
        stats = state.slab.stats()
        report.hits, report.misses = stats["step_hits"], stats["step_misses"]
        report.unplanned = stats["step_unplanned"]
        entry.history.append(report)
    # Reached only when the step did not raise. Divergence: the misses, and the plan's slots the step never
    # reached (it made fewer allocations than were recorded), against the larger of the two counts.
    made = report.hits + report.misses + report.unplanned
    slots = entry.planned_slots + entry.unplanned_slots
    diverged = report.misses + max(0, slots - made)
    if max(made, slots) and diverged / max(made, slots) > max_miss_ratio:
        report.rerecord = True
        state.plans.pop(key)
        state.slab.remove_plan(entry.plan_id)
        state.rerecord.add(key)


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
    `recent_sizes` although the cache holds enough free bytes for it: then
    torchmem.compact(model, optimizer) repacks the long-lived tensors,
    torchmem.empty_cache() returns what is wholly free, and forget() lets
    plans be recorded again.
    """
    allocator = caching_allocator(device)
    if allocator is None:
        raise RuntimeError("torchmem is not installed: call torchmem.install() first")
    return fragmentation_report(allocator.segments(), recent_sizes, factor)


def fragmentation_report(segments: list[dict], recent_sizes: list[int] | None = None,
                         factor: float = 4.0) -> FragmentationReport:
    """fragmentation_watch()'s decision for a list of segments (each with blocks: size, allocated)."""
    if factor <= 0:
        raise ValueError(f"factor must be > 0, got {factor}")
    blocks = [b for s in segments for b in s["blocks"]]
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


# The module's functions, reachable from the function that hides it as an
# attribute of torchmem: torchmem.planned.slab_stats(), torchmem.planned.plans(), ...
for _f in (plans, slab_stats, forget, shape_key, fragmentation_watch, fragmentation_report, in_planned_step, planned_step,
           StepReport, PlanEntry, FragmentationReport):
    setattr(planned, _f.__name__, _f)
del _f
