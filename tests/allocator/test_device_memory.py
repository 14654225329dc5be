"""DeviceMemory (csrc/core/device_memory/device_memory.h) on a SimDevice, rule by rule: the
per-device policy behind torchmem's CUDA allocator (stream uses and deferred
frees, private pools with use counts and routes, the capture rules), with
events that complete when the test says so and a device that raises on any
call that would invalidate a CUDA graph capture."""
import pytest
import torch

from torchmem import _core

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

S1, S2, S3 = 11, 22, 33  # streams
POOL = (1, 0)
POOL2 = (2, 0)


def make(capacity=8 * GiB, conf=""):
    dev = _core.SimDevice(capacity)
    dev.set_manual_events(True)
    return dev, _core.DeviceMemory(dev, conf)


def agg(mem, key):
    return mem.stats()[key]["all"]["current"]


def block(mem, addr):
    for seg in mem.segments():
        for b in seg["blocks"]:
            if b["address"] == addr:
                return dict(b, pool=seg["pool"])
    raise KeyError(hex(addr))


# ---------------------------------------------------------------- stream uses


def test_use_on_own_stream_is_ignored():
    dev, mem = make()
    p = mem.allocate(MiB, S1)
    assert mem.record_stream(p, S1)
    assert mem.free(p)
    assert mem.pending_frees == 0 and dev.events_recorded == 0
    mem.check_invariants()


def test_free_with_use_waits_for_the_event_and_allocated_drops_at_once():
    dev, mem = make()
    p = mem.allocate(MiB, S1)
    assert mem.record_stream(p, S2)
    mem.free(p)
    assert mem.pending_frees == 1
    assert dev.events_recorded == 1
    # As PyTorch: the allocation ends at the free, the block stays active.
    assert agg(mem, "allocated_bytes") == 0
    assert agg(mem, "allocation") == 0
    assert agg(mem, "active_bytes") == MiB
    b = block(mem, p)
    assert not b["allocated"] and b["active"]
    mem.check_invariants()
    # Not reusable while S2's work may still use it.
    q = mem.allocate(MiB, S1)
    assert q != p
    mem.free(q)
    assert dev.complete_events(S2) == 1
    r = mem.allocate(MiB, S1)  # polls: the free completes first
    assert mem.pending_frees == 0 and dev.live_events == 0
    assert r == p
    mem.free(r)
    assert agg(mem, "active_bytes") == 0
    mem.check_invariants()


def test_history_records_the_free_in_two_steps():
    dev, mem = make()
    mem.enable_history(100)
    p = mem.allocate(MiB, S1)
    mem.record_stream(p, S2)
    mem.free(p)
    assert [e["action"] for e in mem.history()][-2:] == ["alloc", "free_requested"]
    dev.complete_events(S2)
    mem.free(mem.allocate(512, S1))
    actions = [(e["action"], e["addr"]) for e in mem.history()]
    assert ("free_completed", p) in actions
    assert actions.index(("free_requested", p)) < actions.index(("free_completed", p))


def test_every_stream_must_finish():
    dev, mem = make()
    p = mem.allocate(MiB, S1)
    mem.record_stream(p, S2)
    mem.record_stream(p, S3)
    mem.record_stream(p, S3)  # once per stream
    mem.free(p)
    assert dev.events_recorded == 2
    dev.complete_events(S2)
    mem.free(mem.allocate(512, S1))
    assert mem.pending_frees == 1
    dev.complete_events(S3)
    mem.free(mem.allocate(512, S1))
    assert mem.pending_frees == 0


def test_empty_cache_waits_for_pending_frees():
    dev, mem = make()
    p = mem.allocate(MiB, S1)
    mem.record_stream(p, S2)
    mem.free(p)
    mem.empty_cache()
    assert dev.synchronizations == 1
    assert mem.pending_frees == 0
    assert agg(mem, "reserved_bytes") == 0
    mem.check_invariants()


def test_out_of_memory_retry_waits_for_pending_frees_and_counts_nothing():
    dev, mem = make(capacity=64 * MiB)
    p = mem.allocate(40 * MiB, S1)
    mem.record_stream(p, S2)
    mem.free(p)
    q = mem.allocate(40 * MiB, S1)  # needs p's segment: waits for S2, releases, retries
    assert dev.synchronizations == 1
    s = mem.stats()
    assert s["num_ooms"] == 0 and s["num_alloc_retries"] == 1
    mem.free(q)
    mem.check_invariants()


def test_out_of_memory_is_counted_once():
    dev, mem = make(capacity=64 * MiB)
    p = mem.allocate(40 * MiB, S1)
    mem.record_stream(p, S2)
    mem.free(p)
    keep = mem.allocate(40 * MiB, S1)
    with pytest.raises(torch.OutOfMemoryError, match="Tried to allocate 40.00 MiB"):
        mem.allocate(40 * MiB, S1)
    s = mem.stats()
    assert s["num_ooms"] == 1
    assert s["num_alloc_retries"] == 2  # one for each allocation that reached the last retry
    mem.free(keep)
    mem.check_invariants()


def test_foreign_pointers_are_refused():
    dev, mem = make()
    assert not mem.free(12345 * 512)
    assert not mem.record_stream(12345 * 512, S2)
    p = mem.allocate(MiB, S1)
    mem.free(p)
    assert not mem.free(p)  # double free
    assert not mem.record_stream(p, S2)
    mem.check_invariants()


# ---------------------------------------------------------------- private pools


def test_route_takes_only_its_streams():
    dev, mem = make()
    mem.begin_allocate_to_pool(POOL, streams=[S1])
    a = mem.allocate(MiB, S1)
    b = mem.allocate(MiB, S2)
    mem.end_allocate_to_pool(POOL)
    assert block(mem, a)["pool"] == POOL
    assert block(mem, b)["pool"] == (0, 0)
    c = mem.allocate(MiB, S1)  # route closed
    assert block(mem, c)["pool"] == (0, 0)
    # Statistics add up the main allocator and the pools.
    assert agg(mem, "allocated_bytes") == 3 * MiB
    for p in (a, b, c):
        mem.free(p)
    mem.check_invariants()


def test_innermost_route_wins():
    dev, mem = make()
    mem.begin_allocate_to_pool(POOL)
    mem.begin_allocate_to_pool(POOL2, streams=[S2])
    a = mem.allocate(MiB, S1)
    b = mem.allocate(MiB, S2)
    mem.end_allocate_to_pool(POOL2)
    mem.end_allocate_to_pool(POOL)
    assert block(mem, a)["pool"] == POOL and block(mem, b)["pool"] == POOL2


def test_use_counts_and_retirement():
    dev, mem = make()
    mem.create_or_incref_pool(POOL)  # MemPool()
    assert mem.pool_use_count(POOL) == 1
    mem.begin_allocate_to_pool(POOL)  # use_mem_pool
    assert mem.pool_use_count(POOL) == 2
    p = mem.allocate(MiB, S1)
    q = mem.allocate(MiB, S1)
    mem.end_allocate_to_pool(POOL)
    assert mem.release_pool(POOL)
    assert mem.pool_use_count(POOL) == 1
    mem.free(q)
    assert mem.release_pool(POOL)  # the MemPool goes: retired, still owns p
    assert mem.pool_use_count(POOL) == 0 and mem.pool_count == 1
    mem.free(p)  # the last block: the pool gives its memory back and is forgotten
    assert mem.pool_count == 0
    assert agg(mem, "reserved_bytes") == 0
    mem.check_invariants()


def test_mempool_destructor_calls_never_raise():
    dev, mem = make()
    # Unknown pools: false, no exception.
    assert not mem.set_use_on_oom(POOL, False)
    assert not mem.release_pool(POOL)
    assert not mem.empty_pool_cache(POOL)
    # ~MemPool while another pool is routed, and during a capture.
    mem.create_or_incref_pool(POOL)
    mem.begin_allocate_to_pool(POOL2, streams=[S2], capture=True)
    dev.set_capturing(True)
    assert mem.set_use_on_oom(POOL, False)
    assert mem.release_pool(POOL)
    assert not mem.empty_pool_cache(POOL)  # held back by the capture
    dev.set_capturing(False)
    mem.end_allocate_to_pool(POOL2)
    assert mem.release_pool(POOL2)
    assert mem.pool_count == 0


def test_route_misuse_raises():
    dev, mem = make()
    mem.begin_allocate_to_pool(POOL)
    with pytest.raises(ValueError):
        mem.begin_allocate_to_pool(POOL)
    mem.end_allocate_to_pool(POOL)
    with pytest.raises(ValueError):
        mem.end_allocate_to_pool(POOL)


def test_use_on_oom_pool_lends_cached_blocks():
    dev, mem = make(capacity=64 * MiB)
    mem.create_or_incref_pool(POOL)
    mem.begin_allocate_to_pool(POOL)
    p = mem.allocate(40 * MiB, S1)
    mem.end_allocate_to_pool(POOL)
    mem.free(p)  # cached in the pool
    with pytest.raises(torch.OutOfMemoryError):
        mem.allocate(40 * MiB, S1)
    assert mem.stats()["num_ooms"] == 1
    assert mem.set_use_on_oom(POOL, True)
    q = mem.allocate(40 * MiB, S1)
    assert q == p and block(mem, q)["pool"] == POOL
    assert mem.stats()["num_ooms"] == 1  # the borrowed block is no out of memory
    mem.free(q)
    mem.check_invariants()


def test_pool_frees_wait_for_streams_too():
    dev, mem = make()
    mem.begin_allocate_to_pool(POOL)
    p = mem.allocate(MiB, S1)
    mem.end_allocate_to_pool(POOL)
    mem.record_stream(p, S2)
    mem.free(p)
    assert mem.pending_frees == 1
    assert mem.release_pool(POOL)
    assert mem.pool_count == 1  # retired, its block still pending
    dev.complete_events(S2)
    mem.free(mem.allocate(512, S1))
    assert mem.pending_frees == 0 and mem.pool_count == 0
    mem.check_invariants()


# ---------------------------------------------------------------- capture rules


def capture(mem, dev, pool=POOL, streams=(S1,)):
    mem.begin_allocate_to_pool(pool, streams=list(streams), capture=True)
    dev.set_capturing(True)  # from here the device raises on free, unmap and events


def end_capture(mem, dev, pool=POOL):
    dev.set_capturing(False)
    mem.end_allocate_to_pool(pool)


def test_capture_empty_cache_releases_nothing_and_does_not_raise():
    dev, mem = make()
    mem.free(mem.allocate(MiB, S2))
    capture(mem, dev)
    assert mem.capture_underway
    mem.empty_cache()
    assert agg(mem, "reserved_bytes") == 2 * MiB
    end_capture(mem, dev)
    mem.empty_cache()
    assert agg(mem, "reserved_bytes") == 0


def test_capture_defers_events_of_frees():
    dev, mem = make()
    p = mem.allocate(MiB, S2)
    mem.record_stream(p, S3)
    capture(mem, dev)
    mem.free(p)  # no event may be recorded now
    assert dev.events_recorded == 0 and mem.pending_frees == 1
    mem.free(mem.allocate(512, S1))  # allocations do not poll either
    end_capture(mem, dev)
    mem.free(mem.allocate(512, S2))  # records the event now
    assert dev.events_recorded == 1 and mem.pending_frees == 1
    dev.complete_all_events()
    mem.free(mem.allocate(512, S2))
    assert mem.pending_frees == 0
    mem.check_invariants()


def test_capture_out_of_memory_releases_nothing():
    dev, mem = make(capacity=64 * MiB)
    mem.free(mem.allocate(40 * MiB, S2))  # cached on S2
    capture(mem, dev)
    with pytest.raises(torch.OutOfMemoryError):
        mem.allocate(40 * MiB, S1)  # would need S2's cached segment released
    assert mem.stats()["num_ooms"] == 1
    end_capture(mem, dev)
    mem.release_pool(POOL)
    mem.free(mem.allocate(40 * MiB, S1))  # now the retry releases it
    mem.check_invariants()


def test_capture_skips_garbage_collection():
    dev, mem = make(capacity=100 * MiB, conf="garbage_collection_threshold:0.5")
    mem.set_memory_fraction(0.9)
    mem.free(mem.allocate(60 * MiB, S2))
    capture(mem, dev)
    with pytest.raises(torch.OutOfMemoryError):
        mem.allocate(32 * MiB, S3)  # main allocator; garbage collection would free S2's segment
    end_capture(mem, dev)
    mem.release_pool(POOL)
    mem.free(mem.allocate(32 * MiB, S3))  # collected now
    mem.check_invariants()


def test_capture_never_unmaps_expandable_pages():
    dev, mem = make(conf="expandable_segments:True")
    mem.free(mem.allocate(60 * MiB, S2))
    capture(mem, dev)
    mem.empty_cache()
    end_capture(mem, dev)
    assert dev.unmap_calls == 0
    mem.empty_cache()
    assert dev.unmap_calls == 1 and agg(mem, "reserved_bytes") == 0


def test_release_pool_during_capture_waits_for_its_end():
    dev, mem = make()
    mem.create_or_incref_pool(POOL2)
    mem.begin_allocate_to_pool(POOL2)
    mem.free(mem.allocate(MiB, S1))
    mem.end_allocate_to_pool(POOL2)
    mem.release_pool(POOL2)  # use_mem_pool's exit
    capture(mem, dev)
    mem.release_pool(POOL2)  # ~MemPool: retired; its cache stays while capturing
    assert agg(mem, "reserved_bytes") == 2 * MiB
    end_capture(mem, dev)
    assert agg(mem, "reserved_bytes") == 0 and mem.pool_count == 1  # the capture's own pool
    mem.release_pool(POOL)
    assert mem.pool_count == 0


def test_use_mem_pool_routes_are_not_captures():
    dev, mem = make(capacity=64 * MiB)
    p = mem.allocate(MiB, S2)
    mem.record_stream(p, S3)
    mem.free(mem.allocate(40 * MiB, S2))
    mem.begin_allocate_to_pool(POOL, streams=[S1])  # use_mem_pool: capture=False
    assert not mem.capture_underway
    mem.free(p)
    assert dev.events_recorded == 1
    dev.complete_all_events()
    mem.free(mem.allocate(512, S2))  # deferred frees complete inside it
    assert mem.pending_frees == 0
    q = mem.allocate(40 * MiB, S1)  # the out-of-memory retry releases S2's segment
    mem.empty_cache()  # allowed
    mem.end_allocate_to_pool(POOL)
    mem.free(q)
    mem.check_invariants()


# ---------------------------------------------------------------- routed allocators, config


def test_routed_allocator_frees_and_stream_uses():
    dev, mem = make()
    inner = _core.CachingAllocator(_core.SimDevice(GiB))
    mem.add_routed(inner)
    p = mem.allocate(MiB, S1, thread_allocator=inner)
    assert inner.owns(p) and mem.owns(p)
    mem.record_stream(p, S2)
    mem.free(p)
    assert inner.owns(p) and mem.pending_frees == 1
    dev.complete_all_events()
    mem.free(mem.allocate(512, S1))
    assert not inner.owns(p)


def test_reconfigure_before_use():
    dev, mem = make()
    assert mem.reconfigure("expandable_segments:True")
    assert "expandable_segments:True" in mem.config
    p = mem.allocate(MiB)
    assert not mem.reconfigure("")
    mem.free(p)
    assert mem.main.config == mem.config


def test_expandable_pages_map_and_unmap_in_batches():
    dev = _core.SimDevice(8 * GiB)
    mem = _core.DeviceMemory(dev, "expandable_segments:True")
    p = mem.allocate(60 * MiB)  # 3 pages of 20 MiB
    assert dev.map_calls == 1
    mem.free(p)
    mem.empty_cache()
    assert dev.unmap_calls == 1
    mem.check_invariants()


def test_capture_under_the_stitch_policy_unmaps_nothing():
    """policy:stitch frees pages by unmapping them: during a capture it must not (the device raises if it does)."""
    dev, mem = make(capacity=8 * MiB, conf="policy:stitch")
    for p in [mem.allocate(2 * MiB, S2) for _ in range(3)]:
        mem.free(p)  # three pages cached on S2
    capture(mem, dev)
    mem.empty_cache()
    assert agg(mem, "reserved_bytes") == 6 * MiB
    with pytest.raises(torch.OutOfMemoryError):  # S1 needs 4 MiB: 2 MiB free, the rest only by unmapping
        mem.allocate(4 * MiB, S1)
    end_capture(mem, dev)
    p = mem.allocate(4 * MiB, S1)  # after the capture the cached pages are unmapped for it
    mem.free(p)
    mem.check_invariants()
