"""PyTorch's native caching-allocator policy, one rule per test.

Every expected number below comes from PyTorch's own source, not from
torchmem's output: c10/cuda/CUDACachingAllocator.cpp (class
DeviceCachingAllocator and its helpers, PyTorch 2.13) and
c10/core/AllocatorConfig.cpp. Each test names the native function whose rule
it checks and works its figures out by hand in comments. Where torchmem
knowingly differs from PyTorch, the test says "torchmem:".

Every test runs on a simulated device, so sizes are those of a real GPU, and
checks invariants after each step.
"""
import pytest
import torch

from torchmem import _core

from tests.support.sim import GiB, KiB, MiB, block_of, sim_allocator


def alloc(a, size, stream=0):
    p = a.allocate(size, stream)
    a.check_invariants()
    return p


def free(a, p):
    a.deallocate(p)
    a.check_invariants()


def segment_sizes(a):
    return [s["total_size"] for s in a.segments()]


# --- rounding: round_size, roundup_power2_next_division ---------------------------

# round_size: below kMinBlockSize (512) -> 512; else up to a multiple of 512.
@pytest.mark.parametrize("size, rounded", [(1, 512), (512, 512), (513, 1024), (1000, 1024), (MiB + 1, MiB + 512)])
def test_sizes_round_up_to_512_bytes(size, rounded):
    a = sim_allocator()
    p = alloc(a, size)
    block = block_of(a, p)
    assert block["size"] == rounded
    # alloc_found_block: requested_bytes counts the size asked for, allocated_bytes the block.
    assert block["requested_size"] == size
    assert a.stats()["requested_bytes"]["all"]["current"] == size
    assert a.stats()["allocated_bytes"]["all"]["current"] == rounded


def test_roundup_power2_divisions():
    # round_size with divisions 4 (AcceleratorAllocatorConfig::roundup_power2_divisions: every interval):
    # 1_300_000 > 4 * 512, so roundup_power2_next_division: floor power of two 1 MiB, step 1 MiB / 4 =
    # 262144; 1_300_000 lies between 1 MiB and 1 MiB + 262144 -> 1_310_720.
    a = sim_allocator(conf="roundup_power2_divisions:4")
    p = alloc(a, 1_300_000)
    assert block_of(a, p)["size"] == 1_310_720
    q = alloc(a, 4 * MiB)  # roundup_power2_next_division: a power of two is returned as is
    assert block_of(a, q)["size"] == 4 * MiB


def test_roundup_power2_divisions_apply_only_above_divisions_times_512():
    # round_size rounds by divisions only when size > kMinBlockSize * divisions (4 * 512 = 2048):
    # 1100 takes the 512 rule -> 1536, not the quarter step of 1024 (which would give 1280).
    a = sim_allocator(conf="roundup_power2_divisions:4")
    assert block_of(a, alloc(a, 1100))["size"] == 1536
    # Below 1 MiB the first interval's divisions apply (roundup_power2_divisions clamps the index to 0):
    # 4600 > 2048, floor 4096, step 1024 -> 5120 (the 512 rule would give 4608).
    assert block_of(a, alloc(a, 4600))["size"] == 5120


def test_zero_size_returns_null_and_allocates_nothing():
    # NativeCachingAllocator::allocate calls malloc only for size != 0 and returns a null DataPtr.
    a = sim_allocator()
    assert a.allocate(0) == 0
    assert a.segments() == []
    a.deallocate(0)  # torchmem: freeing null is a no-op, as free(NULL)


# --- pools and segment sizes: get_pool, get_allocation_size -------------------------

# get_pool: rounded size <= kSmallSize (1 MiB) -> small pool. get_allocation_size: small -> kSmallBuffer
# (2 MiB); under kMinLargeAlloc (10 MiB) -> large_segment_size (20 MiB); else rounded up to kRoundLarge
# (2 MiB). MiB + 1 rounds to MiB + 512 (large); 10 MiB + 1 to 10 MiB + 512 -> 12 MiB; 3 GiB + 1 -> 3 GiB + 2 MiB.
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
    stats = a.stats()  # alloc_block: segment and reserved_bytes of the pool's stat type
    assert stats["reserved_bytes"][f"{pool}_pool"]["current"] == segment
    assert stats["segment"][f"{pool}_pool"]["current"] == 1


def test_large_segment_size_sets_segments_pages_and_the_rounding_default():
    # large_segment_size_mb (AcceleratorAllocatorConfig::parseLargeSegmentSize) replaces the 20 MiB of
    # get_allocation_size, is the large pool's expandable page size (find_expandable_block), and is the
    # default of max_non_split_rounding (parseArgs sets it before the other keys).
    a = sim_allocator(conf="large_segment_size_mb:32")
    alloc(a, 5 * MiB)
    assert segment_sizes(a) == [32 * MiB]
    e = sim_allocator(conf="large_segment_size_mb:32,expandable_segments:True")
    alloc(e, 40 * MiB)  # two 32 MiB pages
    assert segment_sizes(e) == [64 * MiB]
    # max_non_split_rounding = 32 MiB: a 42 MiB request (>= max_split_size 40) takes a 72 MiB block
    # (72 < 42 + 32) but not a 74 MiB one (get_free_block: block >= size + max_non_split_rounding).
    for block, taken in [(72, True), (74, False)]:
        b = sim_allocator(conf="large_segment_size_mb:32,max_split_size_mb:40")
        p = alloc(b, block * MiB)
        free(b, p)
        assert (alloc(b, 42 * MiB) == p) == taken


def test_small_requests_share_a_small_segment():
    # 20 x 100 KiB = 2000 KiB fit in one 2 MiB small segment; should_split (small pool: remainder >= 512)
    # splits each time, and best fit then returns the remainder, which lies right after the last block.
    a = sim_allocator()
    ptrs = [alloc(a, 100 * KiB) for _ in range(20)]
    assert segment_sizes(a) == [2 * MiB]
    assert sorted(ptrs) == ptrs and ptrs[1] - ptrs[0] == 100 * KiB


# --- best fit: get_free_block, BlockComparatorSize ---------------------------------

def test_best_fit_takes_the_smallest_block_that_fits():
    # BlockComparatorSize orders (stream, size, address); lower_bound finds the smallest block >= size.
    # 11 MiB takes the 12 MiB block, 13 MiB the 14 MiB block; 1 MiB remains each time, not > kSmallSize,
    # so should_split keeps them whole.
    a = sim_allocator()
    p16, p12, p14 = alloc(a, 16 * MiB), alloc(a, 12 * MiB), alloc(a, 14 * MiB)
    for p in (p16, p12, p14):
        free(a, p)
    assert alloc(a, 11 * MiB) == p12
    assert alloc(a, 13 * MiB) == p14


def test_best_fit_prefers_the_lowest_address_among_equal_sizes():
    # BlockComparatorSize: equal sizes order by address.
    a = sim_allocator()
    ptrs = [alloc(a, 12 * MiB) for _ in range(3)]
    for p in reversed(ptrs):
        free(a, p)
    assert alloc(a, 12 * MiB) == min(ptrs)


def test_blocks_are_not_shared_across_streams():
    # get_free_block: a block of another stream is never returned (the comparator orders by stream first).
    a = sim_allocator()
    p = alloc(a, 12 * MiB, stream=1)
    free(a, p)
    q = alloc(a, 12 * MiB, stream=2)
    assert q != p
    assert len(a.segments()) == 2
    assert alloc(a, 12 * MiB, stream=1) == p


# --- splitting: should_split, alloc_found_block -------------------------------------

def test_small_blocks_split_when_512_bytes_remain():
    # should_split, small pool: remainder >= kMinBlockSize. 1 MiB from a 2 MiB segment leaves 1 MiB.
    a = sim_allocator()
    p = alloc(a, MiB)
    (seg,) = a.segments()
    assert [b["size"] for b in seg["blocks"]] == [MiB, MiB]
    stats = a.stats()  # alloc_found_block: a new split adds the remainder to inactive_split(_bytes)
    assert stats["inactive_split"]["small_pool"]["current"] == 1
    assert stats["inactive_split_bytes"]["small_pool"]["current"] == MiB
    # Exactly 512 B remaining still splits: 1 MiB - 512 from the 1 MiB remainder leaves 512.
    q = alloc(a, MiB - 512)
    assert [b["size"] for b in a.segments()[0]["blocks"]] == [MiB, MiB - 512, 512]
    free(a, q)
    free(a, p)  # free_block merges both neighbours back
    assert [b["size"] for b in a.segments()[0]["blocks"]] == [2 * MiB]


def test_large_blocks_split_only_when_more_than_1_MiB_remains():
    # should_split, large pool: size < max_split_size and remainder > kSmallSize (1 MiB).
    a = sim_allocator()
    alloc(a, 2 * MiB)  # 20 MiB segment, 18 MiB remain -> split
    assert [b["size"] for b in a.segments()[0]["blocks"]] == [2 * MiB, 18 * MiB]
    a = sim_allocator()
    big = alloc(a, 12 * MiB)  # its own 12 MiB segment
    free(a, big)
    q = alloc(a, 11 * MiB)  # takes the 12 MiB block: exactly 1 MiB would remain, not > 1 MiB -> no split
    assert q == big
    assert block_of(a, q)["size"] == 12 * MiB
    free(a, q)
    r = alloc(a, 10 * MiB + 512 * KiB)  # 1.5 MiB would remain -> split
    assert r == big and block_of(a, r)["size"] == 10 * MiB + 512 * KiB


def test_blocks_of_max_split_size_are_never_split():
    # should_split: a request of max_split_size (40 MiB) or more is never split off its block; the
    # 45 MiB request takes the 50 MiB block (50 < 45 + 20, get_free_block) whole.
    a = sim_allocator(conf="max_split_size_mb:40")
    p = alloc(a, 50 * MiB)
    free(a, p)
    q = alloc(a, 45 * MiB)
    assert q == p
    assert block_of(a, q)["size"] == 50 * MiB  # whole, not split
    # alloc_found_block / alloc_block: blocks and segments of max_split_size or more are "oversize".
    assert a.stats()["oversize_allocations"]["current"] == 1
    assert a.stats()["oversize_segments"]["current"] == 1


# --- oversize blocks: get_free_block --------------------------------------------------

def test_oversize_block_not_given_to_a_request_under_max_split_size():
    # get_free_block: size < max_split_size and block >= max_split_size -> not returned; a new segment.
    a = sim_allocator(conf="max_split_size_mb:40")
    p = alloc(a, 50 * MiB)
    free(a, p)
    q = alloc(a, 30 * MiB)
    assert q != p
    assert sorted(segment_sizes(a)) == [30 * MiB, 50 * MiB]


def test_oversize_block_only_within_max_non_split_rounding():
    # get_free_block: size >= max_split_size and block >= size + max_non_split_rounding -> not returned.
    # Default max_non_split_rounding = 20 MiB (the large segment size): a 42 MiB request takes a 60 MiB
    # block (60 < 62) but not a 62 MiB one (62 >= 62). (Segments are whole 2 MiB: get_allocation_size.)
    for block, taken in [(60, True), (62, False)]:
        a = sim_allocator(conf="max_split_size_mb:40")
        p = alloc(a, block * MiB)
        free(a, p)
        assert (alloc(a, 42 * MiB) == p) == taken
    a2 = sim_allocator(conf="max_split_size_mb:40,max_non_split_rounding_mb:30")
    p2 = alloc(a2, 62 * MiB)
    free(a2, p2)
    assert alloc(a2, 41 * MiB) == p2  # 62 < 41 + 30


# --- coalescing: free_block, try_merge_blocks ------------------------------------------

@pytest.mark.parametrize("order", [(0, 1, 2), (2, 1, 0), (0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1)])
def test_freed_blocks_merge_with_free_neighbours(order):
    # 3 x 512 KiB + a 512 KiB remainder in one 2 MiB small segment; whatever the order of the frees,
    # try_merge_blocks joins free neighbours, so the segment ends as one 2 MiB block, not inactive_split.
    a = sim_allocator()
    ptrs = [alloc(a, 512 * KiB) for _ in range(3)]
    assert len(a.segments()) == 1
    for i in order:
        free(a, ptrs[i])
    (seg,) = a.segments()
    assert [b["size"] for b in seg["blocks"]] == [2 * MiB]
    assert a.stats()["inactive_split"]["all"]["current"] == 0


# --- the miss path: malloc, alloc_block, release_available_cached_blocks, release_cached_blocks

def test_miss_releases_the_smallest_oversize_block_that_covers_the_request():
    # release_available_cached_blocks: lower_bound(max(size, max_split_size)) finds the smallest cached
    # block that covers the request and frees only it. Capacity 210, max_split 40: cached 46 + 70 + 90 =
    # 206 MiB (whole 2 MiB segments). A 50 MiB request misses (70 >= 50 + 20 in get_free_block),
    # alloc_block fails (256 > 210), the 70 MiB block goes, and the retry fits (136 + 50 = 186). Not the
    # retry of num_alloc_retries.
    a = sim_allocator(capacity=210 * MiB, conf="max_split_size_mb:40")
    ptrs = [alloc(a, s * MiB) for s in (46, 70, 90)]
    for p in ptrs:
        free(a, p)
    alloc(a, 50 * MiB)
    stats = a.stats()
    assert stats["num_device_free"] == 1
    assert stats["num_alloc_retries"] == 0
    assert sorted(segment_sizes(a)) == [46 * MiB, 50 * MiB, 90 * MiB]


def test_miss_releases_the_largest_oversize_blocks_until_they_cover_the_request():
    # release_available_cached_blocks, no single block large enough: from the largest down, free oversize
    # blocks until their sum covers max(size, max_split_size). Capacity 150, cached 42 + 46 + 50 = 138;
    # a 60 MiB request: 198 > 150 fails; free 50 (50 < 60), then 46 (96 >= 60), stop; 42 + 60 = 102 fits.
    a = sim_allocator(capacity=150 * MiB, conf="max_split_size_mb:40")
    ptrs = [alloc(a, s * MiB) for s in (42, 46, 50)]
    for p in ptrs:
        free(a, p)
    alloc(a, 60 * MiB)
    stats = a.stats()
    assert stats["num_device_free"] == 2
    assert stats["num_alloc_retries"] == 0
    assert sorted(segment_sizes(a)) == [42 * MiB, 60 * MiB]


def test_miss_releases_all_cached_segments_and_retries_once():
    # Without max_split_size, release_available_cached_blocks frees nothing; release_cached_blocks frees
    # the three unsplit 30 MiB segments and alloc_block(isRetry=true) counts one num_alloc_retries.
    # 90 + 40 > 100 before, 40 <= 100 after.
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
    """Native counterpart: tests/fakegpu/test_replay_native_scenarios.py (the same ops under PyTorch's allocator)."""
    # release_blocks frees only blocks with no prev and no next. The 2 MiB block takes a 20 MiB segment
    # (kLargeBuffer); the first 12 MiB block is split from its free 18 MiB, the other two get segments of
    # their own: 20 + 2 x 12 = 44 MiB reserved. 44 + 30 > 60 fails; release_cached_blocks frees the two
    # whole 12 MiB segments and alloc_block(isRetry=true) counts one retry; 20 + 30 = 50 fits, and the
    # split segment, whose free 18 MiB has a live neighbour, stays.
    a = sim_allocator(capacity=60 * MiB)
    keep = alloc(a, 2 * MiB)
    spare = [alloc(a, 12 * MiB) for _ in range(3)]
    assert spare[0] == keep + 2 * MiB and sorted(segment_sizes(a)) == [12 * MiB, 12 * MiB, 20 * MiB]
    for p in spare:
        free(a, p)
    assert a.stats()["num_alloc_retries"] == 0
    alloc(a, 30 * MiB)
    stats = a.stats()
    assert stats["num_alloc_retries"] == 1  # the retry: the first device allocation failed
    assert stats["num_device_free"] == 2 and stats["num_device_alloc"] == 4
    assert sorted(segment_sizes(a)) == [20 * MiB, 30 * MiB]
    assert a.owns(keep)


def test_out_of_memory_raises_torch_error_and_leaves_allocator_usable():
    # malloc's OOM: 60 + 50 > 100 and nothing cached to release. The message gives format_size of
    # alloc_size, the device total, no "allowed;" (no fraction), and allocated_bytes.
    a = sim_allocator(capacity=100 * MiB)
    p = alloc(a, 60 * MiB)
    with pytest.raises(torch.OutOfMemoryError) as info:
        a.allocate(50 * MiB)
    message = str(info.value)
    assert "Tried to allocate 50.00 MiB" in message
    assert "total capacity of 100.00 MiB" in message and "allowed;" not in message
    assert "60.00 MiB is allocated" in message
    assert a.stats()["num_ooms"] == 1  # stats.num_ooms += 1
    a.check_invariants()
    q = alloc(a, 30 * MiB)  # 60 + 30 <= 100
    assert q and p


def test_out_of_memory_message_gives_the_segment_size_not_the_request():
    # malloc's OOM message formats alloc_size (get_allocation_size), not the request: a 2 MiB - 100 B
    # request needs a 20 MiB segment. 12 + 20 > 30. Its trace entry (record_trace(OOM, device_free,
    # params.size())) holds the rounded size, 2 MiB, and in its address field the device's free bytes,
    # 30 - 12 = 18 MiB.
    a = sim_allocator(capacity=30 * MiB)
    _core.enable_history(a, 100)
    alloc(a, 12 * MiB)
    with pytest.raises(torch.OutOfMemoryError) as info:
        a.allocate(2 * MiB - 100)
    assert "Tried to allocate 20.00 MiB" in str(info.value)
    (oom,) = [e for e in _core.history_entries(a) if e["action"] == "oom"]
    assert oom["size"] == 2 * MiB and oom["addr"] == 18 * MiB


def test_absurd_size_is_an_out_of_memory_error_not_a_crash():
    # PyTorch: cudaMalloc of 2^63 bytes fails -> OutOfMemoryError. torchmem: requests over 2^60 B fail
    # before the device is asked; a negative size is a TypeError of the binding.
    a = sim_allocator()
    with pytest.raises(torch.OutOfMemoryError):
        a.allocate(2**63)
    with pytest.raises(TypeError):
        a.allocate(-1)
    a.check_invariants()


def test_out_of_memory_message_gives_reserved_but_unallocated_and_the_expandable_hint():
    # PyTorch prints the expandable_segments hint on every OOM, fragmented or not (malloc: the hint is part
    # of the fixed message), so the figures are what distinguishes the cases.
    # 64 x 512 KiB fill 16 small segments of 2 MiB (4 blocks each, the last one unsplit); freeing every
    # other block leaves no two free neighbours: 16 MiB allocated, 32 - 16 = 16 MiB reserved but free,
    # and release_cached_blocks can free none of it (all split). 32 + 40 > 64 -> OOM.
    a = sim_allocator(capacity=64 * MiB)
    ptrs = [alloc(a, 512 * KiB) for _ in range(64)]
    for p in ptrs[::2]:
        free(a, p)
    with pytest.raises(torch.OutOfMemoryError) as info:
        a.allocate(40 * MiB)
    message = str(info.value)
    assert "Of the allocated memory 16.00 MiB is allocated by PyTorch, and 16.00 MiB is reserved by PyTorch but unallocated" in message
    assert "expandable_segments:True" in message
    # Not fragmented: nothing reserved is free (format_size(0) is "0 bytes"), and the hint is still there.
    b = sim_allocator(capacity=64 * MiB)
    alloc(b, 40 * MiB)
    with pytest.raises(torch.OutOfMemoryError) as info:
        b.allocate(30 * MiB)
    message = str(info.value)
    assert "and 0 bytes is reserved by PyTorch but unallocated" in message and "expandable_segments:True" in message


# --- garbage collection and memory fraction: garbage_collect_cached_blocks, setMemoryFraction --

def test_garbage_collection_frees_old_cached_segments_before_allocating():
    # malloc runs garbage_collect_cached_blocks on a miss when allowed_memory_maximum is set (a fraction
    # below 1: setMemoryFraction) and the threshold > 0. Limit 0.9 x 200 = 180 MiB; gc threshold
    # 0.5 x 180 = 90 MiB. Six 30 MiB segments = 180 MiB (alloc_block allows 180 <= 180).
    conf = "garbage_collection_threshold:0.5,per_process_memory_fraction:0.9"
    a = sim_allocator(capacity=200 * MiB, conf=conf)
    ptrs = [alloc(a, 30 * MiB) for _ in range(6)]
    for p in ptrs:
        free(a, p)
    alloc(a, 32 * MiB)  # a miss: reserved 180 > 90 -> collect before allocating
    stats = a.stats()
    assert stats["num_alloc_retries"] == 0  # collection, not the out-of-memory retry
    # garbage_collect_cached_blocks frees every unsplit block at least as old as the average and does not
    # stop at the target (180 - 90 = 90 MiB): the six blocks were cached at the same get_free_block count,
    # so all six have the average age (1) and all six go, though three would reach the target.
    assert stats["num_device_free"] == 6
    assert stats["reserved_bytes"]["all"]["current"] == 32 * MiB  # only the new segment


def test_garbage_collection_frees_older_blocks_first_and_repeats_until_the_target():
    # Block age = large pool's get_free_block calls since the block was cached (Block::gc_count). Limit
    # 0.5 x 200 = 100 MiB, gc threshold 0.25 x 100 = 25 MiB. Large-pool get_free_block calls, counted:
    #   T 12 MiB on stream 1 (1), A 20 MiB (2), B 20 MiB (3); free T, A: both cached at count 3;
    #   two hits of T on stream 1 (4, 5), T cached again at 5; free B: cached at 5.
    #   A 40 MiB request (6) misses: ages T 1, A 3, B 1; reserved 52 > 25, target 27 MiB.
    # Round 1: average 5/3 -> only A (20 MiB) goes; 20 < 27, so round 2: average of T and B is 1 -> both.
    conf = "garbage_collection_threshold:0.25,per_process_memory_fraction:0.5"
    a = sim_allocator(capacity=200 * MiB, conf=conf)
    t = alloc(a, 12 * MiB, stream=1)
    pa, pb = alloc(a, 20 * MiB), alloc(a, 20 * MiB)
    free(a, t)
    free(a, pa)
    for _ in range(2):
        assert alloc(a, 12 * MiB, stream=1) == t
        free(a, t)
    free(a, pb)
    alloc(a, 40 * MiB)
    stats = a.stats()
    assert stats["num_device_free"] == 3
    assert stats["num_alloc_retries"] == 0
    assert segment_sizes(a) == [40 * MiB]
    # With a target of 2 MiB (threshold 0.5 -> 50 MiB, 52 - 50), round 1 suffices: only A, the oldest.
    b = sim_allocator(capacity=200 * MiB, conf="garbage_collection_threshold:0.5,per_process_memory_fraction:0.5")
    t = alloc(b, 12 * MiB, stream=1)
    pa, pb = alloc(b, 20 * MiB), alloc(b, 20 * MiB)
    free(b, t)
    free(b, pa)
    for _ in range(2):
        alloc(b, 12 * MiB, stream=1)
        free(b, t)
    free(b, pb)
    alloc(b, 40 * MiB)
    assert b.stats()["num_device_free"] == 1
    assert sorted(segment_sizes(b)) == [12 * MiB, 20 * MiB, 40 * MiB]
    addresses = [s["address"] for s in b.segments()]
    assert pb in addresses and pa not in addresses


def test_without_garbage_collection_the_cache_is_kept_until_the_retry():
    # No fraction: allowed_memory_maximum is unset, malloc skips garbage collection; 180 + 32 > 200 fails,
    # release_cached_blocks frees all and the retry is counted.
    a = sim_allocator(capacity=200 * MiB, conf="garbage_collection_threshold:0.5")
    ptrs = [alloc(a, 30 * MiB) for _ in range(6)]
    for p in ptrs:
        free(a, p)
    alloc(a, 32 * MiB)
    assert a.stats()["num_alloc_retries"] == 1


def test_a_fraction_of_one_sets_no_limit_and_no_garbage_collection():
    # setMemoryFraction(1.0) leaves allowed_memory_maximum unset ("set iff memory fraction is less than
    # 1"), so garbage collection stays off: the same run as above ends in the retry, not a collection.
    a = sim_allocator(capacity=200 * MiB, conf="garbage_collection_threshold:0.5,per_process_memory_fraction:1.0")
    ptrs = [alloc(a, 30 * MiB) for _ in range(6)]
    for p in ptrs:
        free(a, p)
    alloc(a, 32 * MiB)
    assert a.stats()["num_alloc_retries"] == 1


def test_memory_fraction_limits_reserved_memory():
    # alloc_block: total_allocated_memory + size > allowed_memory_maximum (0.5 x 100 = 50 MiB) fails.
    a = sim_allocator(capacity=100 * MiB)
    a.set_memory_fraction(0.5)
    alloc(a, 40 * MiB)
    with pytest.raises(torch.OutOfMemoryError) as info:
        a.allocate(20 * MiB)  # 40 MiB reserved + a 20 MiB segment > the 50 MiB limit
    # malloc's OOM wording: the device's real total and free (cudaMemGetInfo: 100 - 40 = 60 MiB), then
    # "<limit> allowed; " when a limit is set. torchmem: the message has no "CUDA"/"GPU 0" prefix and adds
    # the largest free block.
    message = str(info.value)
    assert "has a total capacity of 100.00 MiB of which 60.00 MiB is free. 50.00 MiB allowed; Of the allocated memory" in message
    # setMemoryFraction lifts the limit at 1.0 and takes [0, 1]; torch.cuda.set_per_process_memory_fraction
    # raises outside it.
    a.set_memory_fraction(1.0)
    alloc(a, 20 * MiB)
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError):
            a.set_memory_fraction(bad)


def test_memory_fraction_zero_allows_no_segment():
    # setMemoryFraction(0): allowed_memory_maximum = 0, so alloc_block refuses every segment
    # (0 + 2 MiB > 0) and the OOM message reads "0 bytes allowed; " (format_size(0)).
    a = sim_allocator(capacity=100 * MiB, conf="per_process_memory_fraction:0")
    with pytest.raises(torch.OutOfMemoryError) as info:
        a.allocate(512)
    assert "0 bytes allowed; " in str(info.value)
    assert a.segments() == []


# --- empty_cache: emptyCache -> release_cached_blocks -----------------------------------

def test_empty_cache_releases_unsplit_cached_segments_only():
    # release_blocks frees cached blocks with no prev and no next: the 12 MiB segment goes; the small
    # segment holding a live 256 KiB block stays, and goes once it is free and whole.
    a = sim_allocator()
    live = alloc(a, 256 * KiB)
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


# --- bad input --------------------------------------------------------------------------

def test_double_free_and_foreign_pointers_raise_and_change_nothing():
    # PyTorch: NativeCachingAllocator::free raises "invalid device pointer" for a pointer it did not hand
    # out. torchmem raises ValueError and leaves every statistic as it was.
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
    # Stat{current, peak, allocated, freed}: one 12 MiB block allocated and freed. resetPeakStats sets
    # peak to current (0); resetAccumulatedStats zeroes allocated/freed and num_device_alloc.
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
