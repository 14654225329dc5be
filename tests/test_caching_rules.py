"""PyTorch's native caching-allocator policy, one rule per test.

Every test runs on a simulated device, so sizes are those of a real GPU, and
checks invariants after each step.
"""
import pytest
import torch

from conftest import GiB, KiB, MiB, block_of, sim_allocator


def alloc(a, size, stream=0):
    p = a.allocate(size, stream)
    a.check_invariants()
    return p


def free(a, p):
    a.deallocate(p)
    a.check_invariants()


def segment_sizes(a):
    return [s["total_size"] for s in a.segments()]


# --- rounding -----------------------------------------------------------------

@pytest.mark.parametrize("size, rounded", [(1, 512), (512, 512), (513, 1024), (1000, 1024), (MiB + 1, MiB + 512)])
def test_sizes_round_up_to_512_bytes(size, rounded):
    a = sim_allocator()
    p = alloc(a, size)
    block = block_of(a, p)
    assert block["size"] == rounded
    assert block["requested_size"] == size
    assert a.stats()["requested_bytes"]["all"]["current"] == size
    assert a.stats()["allocated_bytes"]["all"]["current"] == rounded


def test_roundup_power2_divisions():
    a = sim_allocator(conf="roundup_power2_divisions:4")
    p = alloc(a, 1_300_000)  # between 1 MiB and 2 MiB, in quarters of 1 MiB -> 1.25 MiB
    assert block_of(a, p)["size"] == 1_310_720
    q = alloc(a, 4 * MiB)  # powers of two are kept
    assert block_of(a, q)["size"] == 4 * MiB


def test_zero_size_returns_null_and_allocates_nothing():
    a = sim_allocator()
    assert a.allocate(0) == 0
    assert a.segments() == []
    a.deallocate(0)  # freeing null is a no-op, as free(NULL)


# --- pools and segment sizes ----------------------------------------------------

@pytest.mark.parametrize(
    "size, segment, pool",
    [
        (512, 2 * MiB, "small"),
        (MiB, 2 * MiB, "small"),
        (MiB + 1, 20 * MiB, "large"),
        (5 * MiB, 20 * MiB, "large"),
        (10 * MiB - 512, 20 * MiB, "large"),
        (10 * MiB, 10 * MiB, "large"),
        (10 * MiB + 1, 12 * MiB, "large"),
        (3 * GiB + 1, 3 * GiB + 2 * MiB, "large"),
    ],
)
def test_segment_size_and_pool(size, segment, pool):
    a = sim_allocator()
    alloc(a, size)
    (seg,) = a.segments()
    assert seg["total_size"] == segment
    assert seg["segment_type"] == pool
    stats = a.stats()
    assert stats["reserved_bytes"][f"{pool}_pool"]["current"] == segment
    assert stats["segment"][f"{pool}_pool"]["current"] == 1


def test_small_requests_share_a_small_segment():
    a = sim_allocator()
    ptrs = [alloc(a, 100 * KiB) for _ in range(20)]  # 20 x 100 KiB fit in 2 MiB
    assert segment_sizes(a) == [2 * MiB]
    assert sorted(ptrs) == ptrs and ptrs[1] - ptrs[0] == 100 * KiB


# --- best fit ----------------------------------------------------------------------

def test_best_fit_takes_the_smallest_block_that_fits():
    a = sim_allocator()
    p16, p12, p14 = alloc(a, 16 * MiB), alloc(a, 12 * MiB), alloc(a, 14 * MiB)
    for p in (p16, p12, p14):
        free(a, p)
    assert alloc(a, 11 * MiB) == p12
    assert alloc(a, 13 * MiB) == p14


def test_best_fit_prefers_the_lowest_address_among_equal_sizes():
    a = sim_allocator()
    ptrs = [alloc(a, 12 * MiB) for _ in range(3)]
    for p in reversed(ptrs):
        free(a, p)
    assert alloc(a, 12 * MiB) == min(ptrs)


def test_blocks_are_not_shared_across_streams():
    a = sim_allocator()
    p = alloc(a, 12 * MiB, stream=1)
    free(a, p)
    q = alloc(a, 12 * MiB, stream=2)
    assert q != p
    assert len(a.segments()) == 2
    assert alloc(a, 12 * MiB, stream=1) == p


# --- splitting -----------------------------------------------------------------

def test_small_blocks_split_when_512_bytes_remain():
    a = sim_allocator()
    p = alloc(a, MiB)
    (seg,) = a.segments()
    assert [b["size"] for b in seg["blocks"]] == [MiB, MiB]
    stats = a.stats()
    assert stats["inactive_split"]["small_pool"]["current"] == 1
    assert stats["inactive_split_bytes"]["small_pool"]["current"] == MiB
    free(a, p)
    assert [b["size"] for b in a.segments()[0]["blocks"]] == [2 * MiB]


def test_large_blocks_split_only_when_more_than_1_MiB_remains():
    a = sim_allocator()
    p = alloc(a, 2 * MiB)  # 20 MiB segment, 18 MiB remain -> split
    assert [b["size"] for b in a.segments()[0]["blocks"]] == [2 * MiB, 18 * MiB]
    a = sim_allocator()
    big = alloc(a, 12 * MiB)  # its own 12 MiB segment
    free(a, big)
    q = alloc(a, 11 * MiB)  # takes the 12 MiB block: exactly 1 MiB would remain -> no split
    assert q == big
    assert block_of(a, q)["size"] == 12 * MiB
    free(a, q)
    r = alloc(a, 10 * MiB + 512 * KiB)  # 1.5 MiB would remain -> split
    assert r == big and block_of(a, r)["size"] == 10 * MiB + 512 * KiB


def test_blocks_of_max_split_size_are_never_split():
    a = sim_allocator(conf="max_split_size_mb:40")
    p = alloc(a, 50 * MiB)
    free(a, p)
    q = alloc(a, 45 * MiB)
    assert q == p
    assert block_of(a, q)["size"] == 50 * MiB  # whole, not split
    assert a.stats()["oversize_allocations"]["current"] == 1
    assert a.stats()["oversize_segments"]["current"] == 1


# --- oversize blocks ------------------------------------------------------------------

def test_oversize_block_not_given_to_a_request_under_max_split_size():
    a = sim_allocator(conf="max_split_size_mb:40")
    p = alloc(a, 50 * MiB)
    free(a, p)
    q = alloc(a, 30 * MiB)
    assert q != p
    assert sorted(segment_sizes(a)) == [30 * MiB, 50 * MiB]


def test_oversize_block_only_within_max_non_split_rounding():
    a = sim_allocator(conf="max_split_size_mb:40")
    p = alloc(a, 62 * MiB)
    free(a, p)
    assert alloc(a, 41 * MiB) != p  # 62 >= 41 + 20: too wasteful
    a2 = sim_allocator(conf="max_split_size_mb:40,max_non_split_rounding_mb:30")
    p2 = alloc(a2, 62 * MiB)
    free(a2, p2)
    assert alloc(a2, 41 * MiB) == p2  # 62 < 41 + 30


# --- coalescing -------------------------------------------------------------------------

@pytest.mark.parametrize("order", [(0, 1, 2), (2, 1, 0), (0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1)])
def test_freed_blocks_merge_with_free_neighbours(order):
    a = sim_allocator()
    ptrs = [alloc(a, 512 * KiB) for _ in range(3)]
    assert len(a.segments()) == 1
    for i in order:
        free(a, ptrs[i])
    (seg,) = a.segments()
    assert [b["size"] for b in seg["blocks"]] == [2 * MiB]
    assert a.stats()["inactive_split"]["all"]["current"] == 0


# --- the miss path ------------------------------------------------------------------------

def test_miss_releases_oversize_cached_blocks_before_retrying():
    a = sim_allocator(capacity=100 * MiB, conf="max_split_size_mb:40")
    p = alloc(a, 90 * MiB)
    free(a, p)
    alloc(a, 50 * MiB)  # 90 >= 50 + 20 -> miss; 140 > 100 -> release the cached 90 MiB, retry
    stats = a.stats()
    assert stats["num_device_free"] == 1
    assert stats["num_alloc_retries"] == 0
    assert segment_sizes(a) == [50 * MiB]


def test_miss_releases_all_cached_segments_and_retries_once():
    a = sim_allocator(capacity=100 * MiB)
    ptrs = [alloc(a, 30 * MiB) for _ in range(3)]
    for p in ptrs:
        free(a, p)
    alloc(a, 40 * MiB)
    stats = a.stats()
    assert stats["num_alloc_retries"] == 1
    assert stats["num_device_free"] == 3
    assert segment_sizes(a) == [40 * MiB]


def test_split_segments_are_not_released_on_retry():
    a = sim_allocator(capacity=60 * MiB)
    keep = alloc(a, 2 * MiB)  # splits a 20 MiB segment, which must stay
    spare = [alloc(a, 12 * MiB) for _ in range(3)]
    for p in spare:
        free(a, p)
    alloc(a, 30 * MiB)
    assert 20 * MiB in segment_sizes(a)
    assert a.owns(keep)


def test_out_of_memory_raises_torch_error_and_leaves_allocator_usable():
    a = sim_allocator(capacity=100 * MiB)
    p = alloc(a, 60 * MiB)
    with pytest.raises(torch.OutOfMemoryError) as info:
        a.allocate(50 * MiB)
    message = str(info.value)
    assert "Tried to allocate 50.00 MiB" in message
    assert "total capacity of 100.00 MiB" in message and "allowed;" not in message  # no fraction set
    assert "60.00 MiB is allocated" in message
    assert a.stats()["num_ooms"] == 1
    a.check_invariants()
    q = alloc(a, 30 * MiB)
    assert q and p


def test_absurd_size_is_an_out_of_memory_error_not_a_crash():
    a = sim_allocator()
    with pytest.raises(torch.OutOfMemoryError):
        a.allocate(2**63)
    with pytest.raises(TypeError):
        a.allocate(-1)
    a.check_invariants()


def test_out_of_memory_message_gives_reserved_but_unallocated_and_the_expandable_hint():
    # PyTorch prints the expandable_segments hint on every OOM, fragmented or not (CUDACachingAllocator.cpp,
    # malloc: the hint is part of the fixed message), so the figures are what distinguishes the cases.
    a = sim_allocator(capacity=64 * MiB)
    ptrs = [alloc(a, 512 * KiB) for _ in range(64)]  # 16 small segments of 2 MiB
    for p in ptrs[::2]:
        free(a, p)  # half free, every other block: 16 MiB reserved but unusable for large requests
    with pytest.raises(torch.OutOfMemoryError) as info:
        a.allocate(40 * MiB)
    message = str(info.value)
    assert "Of the allocated memory 16.00 MiB is allocated by PyTorch, and 16.00 MiB is reserved by PyTorch but unallocated" in message
    assert "expandable_segments:True" in message
    # Not fragmented: nothing reserved is free, and the hint is still there, as in PyTorch.
    b = sim_allocator(capacity=64 * MiB)
    alloc(b, 40 * MiB)
    with pytest.raises(torch.OutOfMemoryError) as info:
        b.allocate(30 * MiB)
    message = str(info.value)
    assert "and 0 bytes is reserved by PyTorch but unallocated" in message and "expandable_segments:True" in message


# --- garbage collection and memory fraction ----------------------------------------------

def test_garbage_collection_frees_old_cached_segments_before_allocating():
    conf = "garbage_collection_threshold:0.5,per_process_memory_fraction:1.0"
    a = sim_allocator(capacity=200 * MiB, conf=conf)
    ptrs = [alloc(a, 30 * MiB) for _ in range(6)]  # 180 MiB reserved
    for p in ptrs:
        free(a, p)
    alloc(a, 32 * MiB)  # a miss: reserved 180 > 100 (threshold) -> collect before allocating
    stats = a.stats()
    assert stats["num_alloc_retries"] == 0  # collection, not the out-of-memory retry
    # PyTorch's garbage_collect_cached_blocks frees every unsplit block at least as old as the average
    # and does not stop at the target (180 - 100 = 80 MiB): the six blocks were cached at the same
    # moment, so all six have the average age and all six go, though three would reach the target.
    assert stats["num_device_free"] == 6
    assert stats["reserved_bytes"]["all"]["current"] == 32 * MiB  # only the new segment


def test_without_garbage_collection_the_cache_is_kept_until_the_retry():
    a = sim_allocator(capacity=200 * MiB)
    ptrs = [alloc(a, 30 * MiB) for _ in range(6)]
    for p in ptrs:
        free(a, p)
    alloc(a, 32 * MiB)
    assert a.stats()["num_alloc_retries"] == 1


def test_memory_fraction_limits_reserved_memory():
    a = sim_allocator(capacity=100 * MiB)
    a.set_memory_fraction(0.5)
    alloc(a, 40 * MiB)
    with pytest.raises(torch.OutOfMemoryError) as info:
        a.allocate(20 * MiB)  # 40 MiB reserved + a 20 MiB segment > the 50 MiB limit
    # PyTorch's wording (CUDACachingAllocator.cpp, malloc's OOM): the device's real total and free
    # (cudaMemGetInfo: 100 - 40 = 60 MiB), then "<limit> allowed; " when a fraction is set.
    message = str(info.value)
    assert "has a total capacity of 100.00 MiB of which 60.00 MiB is free. 50.00 MiB allowed; Of the allocated memory" in message
    with pytest.raises(ValueError):
        a.set_memory_fraction(0.0)


# --- empty_cache -------------------------------------------------------------------

def test_empty_cache_releases_unsplit_cached_segments_only():
    a = sim_allocator()
    live = alloc(a, 256 * KiB)  # keeps its small segment
    big = alloc(a, 12 * MiB)
    free(a, big)
    a.empty_cache()
    a.check_invariants()
    assert segment_sizes(a) == [2 * MiB]
    free(a, live)
    a.empty_cache()
    assert a.segments() == []
    stats = a.stats()
    assert stats["reserved_bytes"]["all"]["current"] == 0
    assert stats["num_device_alloc"] == stats["num_device_free"] == 2


# --- bad input -------------------------------------------------------------------------

def test_double_free_and_foreign_pointers_raise_and_change_nothing():
    a = sim_allocator()
    p = alloc(a, 4 * KiB)
    free(a, p)
    before = a.stats()
    with pytest.raises(ValueError, match="not a live allocation"):
        a.deallocate(p)
    with pytest.raises(ValueError, match="not a live allocation"):
        a.deallocate(12345)
    with pytest.raises(ValueError):
        a.deallocate(p + 512)  # interior pointer
    assert a.stats() == before
    a.check_invariants()


def test_stats_peaks_and_resets():
    a = sim_allocator()
    p = alloc(a, 12 * MiB)
    free(a, p)
    stats = a.stats()
    assert stats["allocated_bytes"]["all"]["peak"] == 12 * MiB
    assert stats["allocated_bytes"]["all"]["current"] == 0
    assert stats["allocated_bytes"]["all"]["allocated"] == stats["allocated_bytes"]["all"]["freed"] == 12 * MiB
    a.reset_peak_stats()
    assert a.stats()["allocated_bytes"]["all"]["peak"] == 0
    a.reset_accumulated_stats()
    assert a.stats()["allocated_bytes"]["all"]["allocated"] == 0
    assert a.stats()["num_device_alloc"] == 0
