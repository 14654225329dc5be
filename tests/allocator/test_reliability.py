"""Reliability: concurrency on the CPU install under real torch ops, and
property-based tests against simple reference models where the other suites
leave a gap:

- the caching allocator on host memory (tags written through ctypes and
  checked on free: overlap or stray writes show as changed bytes);
- the arena (every placement against a model of its rules: passes, holes,
  pull-backs and wraps; live blocks aligned, inside the region, never
  overlapping; cursor, peaks, holes and live figures);
- the planner's validate() against a brute-force check, on valid and
  invalid placements; peak-aware scheduling (a topological permutation,
  never worse than the initial order);
- the replayer against the caching allocator driven directly.

(test_caching_random.py covers the sim device; test_paged_hypothesis.py the
paged cache; test_plan_properties.py plan validity and the bound.)
"""
from __future__ import annotations

import ctypes
import json

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.sim import MiB
from tests.support.subprocess_runner import run_ok
from torchmem import _core
from torchmem import replay as sim

# ---------------------------------------------------------------------------
# Concurrency on the CPU install


THREADED_TORCH = """
import json, threading, torch, torchmem
torch.manual_seed(0)
torch.set_num_threads(4)

def work(seed, steps):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(96, 96, generator=g)
    x = torch.randn(2, 3, 24, 24, generator=g)
    w = torch.randn(4, 3, 3, 3, generator=g)
    out = []
    for step in range(steps):
        n = 8 + (seed * 7 + step * 13) % 120           # varying sizes: splits and merges
        b = torch.randn(n, 96, generator=g)
        c = torch.nn.functional.gelu(b @ a)             # oneDNN raw allocate/free path
        d = torch.cat([c, c.flip(0)]).sort(dim=0).values
        e = torch.nn.functional.conv2d(x, w, padding=1).relu().sum()
        out.append(float(d.sum() + e))
    return out

def run(threads, steps):
    results = [None] * threads
    def body(i):
        results[i] = work(i, steps)
    ts = [threading.Thread(target=body, args=(i,)) for i in range(threads)]
    for t in ts: t.start()
    for t in ts: t.join()
    return results

expected = run(4, 10)                                   # PyTorch's own allocator
rows = []
for conf in CONFS:                                      # a fresh caching allocator per config
    torchmem.install(conf=conf)
    allocator = torchmem.caching_allocator()
    before = torchmem.memory_stats()["allocation.all.current"]
    got = run(4, 10)
    allocator.check_invariants()
    after = torchmem.memory_stats()
    torchmem.empty_cache()
    allocator.check_invariants()
    rows.append({
        "conf": conf,
        "same": got == expected,
        "before": before,
        "after": after["allocation.all.current"],
        "allocs": after["allocation.all.allocated"],
        "ooms": after["num_ooms"],
    })

# Out of memory under threads: a clear error each time, and the next request succeeds.
torchmem.install(conf="capacity:192MiB")
errors, done = [], []
def oom_body(i):
    for step in range(6):
        try:
            t = torch.empty(400 << 20, dtype=torch.uint8)     # never fits
        except torch.OutOfMemoryError as e:
            errors.append("out of memory" in str(e))
        x = torch.randn(256, 256) @ torch.randn(256, 256)    # fits: succeeds after the failure
        done.append(bool(torch.isfinite(x).all()))
ts = [threading.Thread(target=oom_body, args=(i,)) for i in range(4)]
for t in ts: t.start()
for t in ts: t.join()
torchmem.caching_allocator().check_invariants()
oom = {"errors": errors, "done": done, "ooms": torchmem.memory_stats()["num_ooms"]}
print(json.dumps({"rows": rows, "oom": oom}))
"""


CONFS = ["", "expandable_segments:True", "max_split_size_mb:24,roundup_power2_divisions:4"]


def test_threads_and_intra_op_threads_on_the_cpu_install():
    out = run_ok(THREADED_TORCH.replace("CONFS", repr(CONFS)))
    result = json.loads(out.strip().splitlines()[-1])
    rows = result["rows"]
    assert [r["conf"] for r in rows] == CONFS
    for r in rows:
        assert r["same"], f"{r['conf']!r}: results differ from PyTorch's allocator: memory shared or overwritten"
        assert r["after"] == r["before"], f"{r['conf']!r}: allocations leaked"
        assert r["allocs"] > 300
        assert r["ooms"] == 0
    # Out of memory under threads (capacity:192MiB): each failure is a clear
    # torch.OutOfMemoryError, and the next request succeeds.
    oom = result["oom"]
    assert oom["errors"] == [True] * 24
    assert oom["done"] == [True] * 24
    assert oom["ooms"] == 24


# ---------------------------------------------------------------------------
# Caching allocator on host memory, bytes checked


def _fill(addr: int, size: int, tag: int) -> None:
    ctypes.memset(addr, tag, size)


def _intact(addr: int, size: int, tag: int) -> bool:
    return ctypes.string_at(addr, size) == bytes([tag]) * size


host_ops = st.lists(
    st.one_of(
        st.tuples(st.just("malloc"), st.one_of(st.integers(1, 8192), st.integers(1, 3 * MiB), st.integers(MiB, 24 * MiB)),
                  st.integers(0, 2)),
        st.tuples(st.just("free"), st.integers(0, 10**6), st.just(0)),
        st.tuples(st.just("empty_cache"), st.just(0), st.just(0)),
    ),
    max_size=60,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=host_ops, conf=st.sampled_from(["", "expandable_segments:True", "max_split_size_mb:22"]))
def test_host_caching_allocator_keeps_every_byte(ops, conf):
    dev = _core.HostDevice(256 * MiB)
    a = _core.CachingAllocator(dev, conf)
    live: dict[int, tuple[int, int]] = {}
    tag = 0
    for op, value, stream in ops:
        if op == "malloc":
            try:
                p = a.allocate(value, stream)
            except torch.OutOfMemoryError:
                a.check_invariants()
                continue
            tag = tag % 250 + 1
            size = min(value, 64 * 1024)  # the head of large blocks is enough to see overlap
            _fill(p, size, tag)
            live[p] = (size, tag)
        elif op == "free" and live:
            p = sorted(live)[value % len(live)]
            size, t = live.pop(p)
            assert _intact(p, size, t), "a live block was overwritten"
            a.deallocate(p)
        elif op == "empty_cache":
            a.empty_cache()
        a.check_invariants()
    for p, (size, t) in live.items():
        assert _intact(p, size, t)
        a.deallocate(p)
    a.empty_cache()
    assert a.stats()["reserved_bytes"]["all"]["current"] == 0
    assert dev.free_bytes == dev.total_bytes


# ---------------------------------------------------------------------------
# Arena against a reference model: passes, holes, pull-backs and wraps
# (core/allocators/arena.h), re-derived here from the rules, with every placement checked.

arena_ops = st.lists(
    st.one_of(
        st.tuples(st.just("alloc"), st.integers(0, 300_000) | st.integers(0, 1500),
                  st.sampled_from([0, 1, 2, 64, 128, 4096, 1 << 16])),
        st.tuples(st.just("free"), st.integers(0, 10**6), st.just(0)),
        st.tuples(st.just("rewind"), st.just(0), st.just(0)),
        st.tuples(st.just("reset"), st.just(0), st.just(0)),
    ),
    min_size=20,
    max_size=120,
)


class ArenaModel:
    """The arena's placement rules, written plainly (O(n) per call)."""

    def __init__(self, base: int, capacity: int):
        self.base, self.capacity = base, capacity
        self.live: dict[int, int] = {}   # address -> size
        self.holes: set[int] = set()     # live allocations made before the last rewind
        self.pass_: list[int] = []       # live allocations of this pass, oldest first
        self.cursor = self.freed_behind = self.peak = self.block_peak = 0
        self.wraps = self.skipped = 0

    def bump(self, size: int, alignment: int):
        cursor, skipped = self.cursor, 0
        while True:
            start = -(-(self.base + cursor) // alignment) * alignment
            if start - self.base + size > self.capacity:
                return None
            blocking = [h for h in self.holes if h < start + size and h + self.live[h] > start]
            if not blocking:
                return start, skipped
            h = min(blocking)
            cursor, skipped = h + self.live[h] - self.base, skipped + 1

    def rewind(self) -> None:
        self.holes, self.pass_ = set(self.live), []
        self.cursor = self.freed_behind = 0

    def allocate(self, size: int, alignment: int):
        placed = self.bump(size, alignment)
        if placed is None and self.freed_behind >= size:
            self.rewind()
            self.wraps += 1
            placed = self.bump(size, alignment)
        if placed is None:
            return None
        start, skipped = placed
        self.live[start] = size
        self.pass_.append(start)
        self.cursor = start + size - self.base
        self.peak, self.block_peak = max(self.peak, self.cursor), max(self.block_peak, self.cursor)
        self.skipped += skipped
        return start

    def free(self, p: int) -> None:
        size = self.live.pop(p)
        if p in self.holes:
            self.holes.remove(p)
            if p + size <= self.base + self.cursor:
                self.freed_behind += size
        elif p == self.pass_[-1]:
            self.pass_.pop()
            self.cursor = self.pass_[-1] + self.live[self.pass_[-1]] - self.base if self.pass_ else 0
        else:
            self.pass_.remove(p)
            self.freed_behind += size
        if not self.live:
            self.rewind()
            self.holes = set()

    def new_block(self) -> int:
        self.rewind()
        self.block_peak = max((h + self.live[h] - self.base for h in self.holes), default=0)
        return len(self.holes)


@settings(max_examples=150, deadline=None)
@given(ops=arena_ops, capacity=st.sampled_from([4096, 1 << 20]))
def test_arena_matches_its_model(ops, capacity):
    arena = _core.Arena(_core.SimDevice(1 << 30), capacity)
    model = ArenaModel(arena.base, capacity)
    for op, size, alignment in ops:
        if op == "alloc":
            expected = model.allocate(size, alignment or 64) if size else 0
            try:
                p = arena.allocate(size, alignment)
            except torch.OutOfMemoryError as e:
                assert "Arena out of memory" in str(e)
                assert expected is None, f"the model placed it at {expected}"
                arena.check_invariants()
                continue
            assert p == expected, "not where the rules put it"
            if size:
                assert p % (alignment or 64) == 0 and arena.base <= p and p + size <= arena.base + capacity
        elif op == "free" and model.live:
            p = sorted(model.live)[size % len(model.live)]
            model.free(p)
            arena.deallocate(p)
        elif op == "rewind":
            assert arena.rewind() == model.new_block()
        elif op == "reset":
            if model.live:
                continue  # a classic reset forgets live blocks: the Python Arena refuses it
            arena.reset()
            model.rewind()
        arena.check_invariants()
        s = arena.stats()
        assert s["live_allocations"] == len(model.live)
        assert s["live_bytes"] == sum(model.live.values())
        assert (s["holes"], s["hole_bytes"]) == (len(model.holes), sum(model.live[h] for h in model.holes))
        assert (s["used"], s["peak"], s["block_peak"]) == (model.cursor, model.peak, model.block_peak)
        assert (s["wraps"], s["holes_skipped"]) == (model.wraps, model.skipped)
    for p in list(model.live):
        arena.deallocate(p)
    assert arena.live_allocations == 0 and arena.used == 0


# ---------------------------------------------------------------------------
# Planner: validate() and schedule() against brute force


@st.composite
def placements(draw):
    n = draw(st.integers(1, 12))
    lower, upper, size, offsets = [], [], [], []
    for _ in range(n):
        lo = draw(st.integers(0, 20))
        lower.append(lo)
        upper.append(lo + draw(st.integers(1, 8)))
        size.append(draw(st.integers(0, 40)))
        offsets.append(draw(st.integers(-2, 80)))
    return lower, upper, size, offsets


def brute_valid(lower, upper, size, offsets) -> bool:
    n = len(lower)
    if any(o < 0 for o in offsets):
        return False
    for i in range(n):
        for j in range(i + 1, n):
            time = lower[i] < upper[j] and lower[j] < upper[i]
            space = offsets[i] < offsets[j] + size[j] and offsets[j] < offsets[i] + size[i]
            if time and space and size[i] and size[j]:
                return False
    return True


@settings(max_examples=150, deadline=None)
@given(placements())
def test_validate_agrees_with_brute_force(p):
    lower, upper, size, offsets = p
    ok, first, second, message = _core.planner.validate(lower, upper, size, offsets)
    assert ok == brute_valid(lower, upper, size, offsets), message
    if not ok and second >= 0:
        i, j = first, second
        assert lower[i] < upper[j] and lower[j] < upper[i], "the named pair does not overlap in time"
        assert offsets[i] < offsets[j] + size[j] and offsets[j] < offsets[i] + size[i], "nor in space"


@st.composite
def dags(draw):
    n = draw(st.integers(1, 10))
    edges, users = [], [[] for _ in range(n)]
    for v in range(n):
        for u in range(v + 1, n):
            if draw(st.booleans()) and draw(st.booleans()):
                edges.append((v, u))
                users[v].append(u)
    out_bytes = [draw(st.integers(0, 100)) for _ in range(n)]
    return n, edges, out_bytes, users


@settings(max_examples=100, deadline=None)
@given(dags())
def test_schedule_is_topological_and_never_worse(g):
    n, edges, out_bytes, users = g
    order, before, after = _core.planner.schedule(n, edges, out_bytes, users, list(range(n)))
    assert sorted(order) == list(range(n))
    pos = {v: i for i, v in enumerate(order)}
    assert all(pos[u] < pos[v] for u, v in edges)
    assert after <= before


# ---------------------------------------------------------------------------
# Replay against the allocator driven directly

events_st = st.lists(st.tuples(st.booleans(), st.integers(0, 12), st.integers(1, 30 * MiB), st.integers(0, 1)),
                     max_size=60)


@settings(max_examples=60, deadline=None)
@given(raw=events_st, conf=st.sampled_from(["", "expandable_segments:True", "max_split_size_mb:24"]))
def test_replay_equals_the_allocator_driven_directly(raw, conf):
    events, live = [], set()
    for is_alloc, key, size, stream in raw:
        if is_alloc and key not in live:
            events.append({"op": "alloc", "id": key, "size": size, "stream": stream})
            live.add(key)
        elif not is_alloc and key in live:
            events.append({"op": "free", "id": key})
            live.discard(key)
    capacity = 200 * MiB
    result = sim.replay(events, capacity, conf)
    a = _core.CachingAllocator(_core.SimDevice(capacity), conf)
    ptrs, oom_at = {}, None
    for i, e in enumerate(events):
        if e["op"] == "alloc":
            try:
                ptrs[e["id"]] = a.allocate(e["size"], e["stream"])
            except torch.OutOfMemoryError:
                oom_at = i
                break
        else:
            a.deallocate(ptrs.pop(e["id"]))
    s = a.stats()
    assert result.completed == (oom_at is None)
    if oom_at is not None:
        assert result.oom["index"] == oom_at
    assert result.peak_allocated == s["allocated_bytes"]["all"]["peak"]
    assert result.peak_reserved == s["reserved_bytes"]["all"]["peak"]
