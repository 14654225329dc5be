"""expandable_segments:True, as PyTorch does it: one reserved range per pool
and stream, mapped in 2 MiB (small) and 20 MiB (large) pages."""
import pytest
import torch

from tests.support.sim import GiB, MiB, sim_allocator

CONF = "expandable_segments:True"


def checked(a):
    a.check_invariants()
    return a


def test_one_range_grows_in_20_MiB_pages():
    a = sim_allocator(conf=CONF)
    p = a.allocate(30 * MiB)
    q = a.allocate(30 * MiB)
    checked(a)
    assert q == p + 30 * MiB  # contiguous: the same range grew
    (seg,) = a.segments()
    assert seg["is_expandable"] and seg["total_size"] == 60 * MiB  # three 20 MiB pages
    stats = a.stats()
    assert stats["reserved_bytes"]["large_pool"]["current"] == 60 * MiB
    assert stats["num_device_alloc"] == 2  # one per mapping call: 40 MiB, then 20 MiB


def test_small_pool_pages_are_2_MiB():
    a = sim_allocator(conf=CONF)
    ptrs = [a.allocate(768 * 1024) for _ in range(3)]
    checked(a)
    (seg,) = a.segments()
    assert seg["segment_type"] == "small" and seg["total_size"] == 4 * MiB
    assert ptrs[1] - ptrs[0] == 768 * 1024


def test_history_records_segment_map_and_unmap():
    a = sim_allocator(conf=CONF)
    a.enable_history(1000)
    p = a.allocate(50 * MiB)
    a.deallocate(p)
    a.empty_cache()
    actions = [(e["action"], e["size"]) for e in a.history()]
    assert actions == [
        ("segment_map", 60 * MiB),
        ("alloc", 50 * MiB),
        ("free_requested", 50 * MiB),
        ("free_completed", 50 * MiB),
        ("segment_unmap", 60 * MiB),
    ]
    assert checked(a).segments() == []
    assert a.stats()["reserved_bytes"]["all"]["current"] == 0


def test_empty_cache_unmaps_only_wholly_free_pages():
    a = sim_allocator(conf=CONF)
    p = a.allocate(30 * MiB)  # pages 0-1 (40 MiB mapped)
    q = a.allocate(30 * MiB)  # pages 1-2 mapped (60 MiB)
    a.deallocate(p)
    a.empty_cache()  # page 0 is wholly free; page 1 is shared with q
    checked(a)
    assert a.stats()["reserved_bytes"]["all"]["current"] == 40 * MiB
    (seg,) = a.segments()
    assert seg["address"] == q - 10 * MiB and seg["total_size"] == 40 * MiB


def test_blocks_split_when_512_bytes_remain_in_any_pool():
    a = sim_allocator(conf=CONF)
    a.allocate(19 * MiB + 512 * 1024)  # one 20 MiB page; 512 KiB remain and are split off
    (seg,) = checked(a).segments()
    assert [(b["size"], b["allocated"]) for b in seg["blocks"]] == [(19 * MiB + 512 * 1024, True), (512 * 1024, False)]
    fixed = sim_allocator()
    fixed.allocate(19 * MiB + 512 * 1024)  # without expandable segments: not split (1 MiB rule)
    assert [b["size"] for b in fixed.segments()[0]["blocks"]] == [20 * MiB]


def test_fragmentation_that_defeats_fixed_segments_is_absorbed():
    # 40 MiB activations split cached 50 MiB segments; 8 MiB tensors land in
    # the remainders and pin every segment, so 168 MiB are free but no 60 MiB
    # block exists. An expandable range keeps the free space in one piece.
    def run(conf):
        a = sim_allocator(capacity=200 * MiB, conf=conf)
        for p in [a.allocate(50 * MiB) for _ in range(4)]:
            a.deallocate(p)
        big = [a.allocate(40 * MiB) for _ in range(4)]
        pins = [a.allocate(8 * MiB) for _ in range(4)]
        for p in big:
            a.deallocate(p)
        try:
            a.allocate(60 * MiB)
            return True
        except torch.OutOfMemoryError as e:
            assert "largest free block is 40.00 MiB" in str(e)
            return False
        finally:
            a.check_invariants()

    assert run("") is False
    assert run(CONF) is True


def test_streams_get_their_own_ranges():
    a = sim_allocator(conf=CONF)
    p = a.allocate(30 * MiB, 1)
    q = a.allocate(30 * MiB, 2)
    checked(a)
    assert abs(q - p) > 60 * GiB  # separate reserved ranges
    assert sorted(s["stream"] for s in a.segments()) == [1, 2]


def test_out_of_memory_maps_nothing_and_recovers():
    a = sim_allocator(capacity=100 * MiB, conf=CONF)
    p = a.allocate(70 * MiB)
    with pytest.raises(torch.OutOfMemoryError):
        a.allocate(50 * MiB)
    checked(a)
    assert a.stats()["reserved_bytes"]["all"]["current"] == 80 * MiB
    a.deallocate(p)
    a.allocate(90 * MiB)  # the free pages are reused, then the range grows
    checked(a)


def test_host_device_expandable_memory_is_writable():
    import ctypes

    from torchmem import _core

    a = _core.CachingAllocator(_core.HostDevice(), CONF)
    sizes = (3 * MiB, 100, 25 * MiB, 700 * 1024)
    ptrs = [a.allocate(s) for s in sizes]
    for i, (p, size) in enumerate(zip(ptrs, sizes)):
        ctypes.memset(p, i + 1, size)
    for i, (p, size) in enumerate(zip(ptrs, sizes)):
        assert ctypes.string_at(p, size) == bytes([i + 1]) * size
        a.deallocate(p)
    a.empty_cache()
    a.check_invariants()
    assert a.stats()["reserved_bytes"]["all"]["current"] == 0
