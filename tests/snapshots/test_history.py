"""History on a caching allocator: the ring buffer, and Python stacks as allocation context."""
import threading

import pytest
import torch

from torchmem import _core

from tests.support.sim import MiB, sim_allocator


def actions(allocator):
    return [e["action"] for e in _core.history_entries(allocator)]


def test_off_by_default_and_records_pytorch_actions():
    a = sim_allocator()
    assert not _core.history_enabled(a)
    p = a.allocate(1000)
    a.deallocate(p)
    assert _core.history_entries(a) == []
    _core.enable_history(a, 100)
    assert _core.history_enabled(a)
    p = a.allocate(1000)
    a.deallocate(p)
    a.empty_cache()
    assert actions(a) == ["alloc", "free_requested", "free_completed", "segment_free"]
    entries = _core.history_entries(a)
    assert entries[0]["size"] == 1000 and entries[0]["addr"] == p
    assert all(e["context"] == 0 for e in entries)  # no provider
    assert [e["time_us"] for e in entries] == sorted(e["time_us"] for e in entries)


def test_ring_keeps_the_newest_entries():
    a = sim_allocator()
    _core.enable_history(a, 5)
    sizes = [512 * (i + 1) for i in range(10)]
    for s in sizes:
        a.deallocate(a.allocate(s))
    entries = _core.history_entries(a)
    assert len(entries) == 5
    assert entries[-1]["action"] == "free_completed" and entries[-1]["size"] == sizes[-1]


def test_disable_clears():
    a = sim_allocator()
    _core.enable_history(a, 10, _core.StackTable())
    a.deallocate(a.allocate(512))
    _core.enable_history(a, 0)
    assert not _core.history_enabled(a)
    assert _core.history_entries(a) == []
    a.deallocate(a.allocate(512))
    assert _core.history_entries(a) == []


def allocate_here(a, size):
    return a.allocate(size)


def allocate_elsewhere(a, size):
    return a.allocate(size)


def test_python_stacks_are_interned_and_named():
    a = sim_allocator()
    table = _core.StackTable()
    _core.enable_history(a, 1000, table)
    ptrs = [allocate_here(a, 4096) for _ in range(3)] + [allocate_elsewhere(a, 4096)]
    allocs = [e for e in _core.history_entries(a) if e["action"] == "alloc"]
    ids = [e["context"] for e in allocs]
    assert ids[0] == ids[1] == ids[2] != ids[3] and 0 not in ids
    frames = table.frames(ids[0])
    assert frames[0]["name"] == "allocate_here" and frames[0]["filename"].endswith("test_history.py")
    # The caller is a comprehension inside the test (a frame of its own before Python 3.12).
    assert "test_python_stacks_are_interned_and_named" in [f["name"] for f in frames[1:3]]
    assert isinstance(frames[0]["line"], int) and frames[0]["line"] > 0
    assert table.frames(ids[3])[0]["name"] == "allocate_elsewhere"
    assert table.frames(0) == [] and table.frames(10**9) == []
    assert len(table) == 2
    # Frees, segments: no context.
    assert all(e["context"] == 0 for e in _core.history_entries(a) if e["action"] != "alloc")
    for p in ptrs:
        a.deallocate(p)


def test_stack_depth_is_capped():
    a = sim_allocator()
    table = _core.StackTable(max_depth=3)
    _core.enable_history(a, 10, table)

    def nest(n):
        return nest(n - 1) if n else a.allocate(512)

    a.deallocate(nest(20))
    ctx = next(e["context"] for e in _core.history_entries(a) if e["action"] == "alloc")
    assert len(table.frames(ctx)) == 3


def test_threads_allocating_with_stacks():
    # The provider takes the GIL from threads that released it (allocate()
    # releases it, as PyTorch's operators do): no deadlock, every id valid.
    a = sim_allocator()
    table = _core.StackTable()
    _core.enable_history(a, 100_000, table)
    errors = []

    def worker(size):
        try:
            for _ in range(300):
                a.deallocate(a.allocate(size))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(512 * (i + 1),)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors and not any(t.is_alive() for t in threads)
    allocs = [e for e in _core.history_entries(a) if e["action"] == "alloc"]
    assert len(allocs) == 1200
    names = {table.frames(e["context"])[0]["name"] for e in allocs}
    assert names == {"worker"}
    a.check_invariants()


def test_oom_entry():
    a = sim_allocator(capacity=8 * MiB)
    _core.enable_history(a, 100)
    with pytest.raises(torch.OutOfMemoryError):
        a.allocate(64 * MiB)
    oom = [e for e in _core.history_entries(a) if e["action"] == "oom"]
    assert len(oom) == 1 and oom[0]["size"] == 64 * MiB


def test_history_on_replays():
    from torchmem import replay as sim

    events = [{"op": "alloc", "id": i, "size": 4096} for i in range(4)] + [{"op": "free", "id": i} for i in range(4)]
    r = sim.replay(events, "1GiB", history=100)
    acts = [e["action"] for e in r.replayer.history()]
    assert acts.count("alloc") == 4 and acts.count("free_completed") == 4 and acts[0] == "segment_alloc"
