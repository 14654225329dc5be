"""PlannedSlab rule by rule, on a simulated device: slots hit only with the
recorded size and stream and free bytes; plans share one region drawn from
the fallback allocator (so its statistics include it); the region grows only
when nothing in it is live, and never when the fallback is out of memory."""
import pytest

from tests.support.sim import GiB, MiB, sim_allocator
from torchmem import _core

U = _core.PlannedSlab.UNPLANNED


def slab_on(capacity: int = 80 * GiB):
    fallback = sim_allocator(capacity)
    return _core.PlannedSlab(fallback), fallback


def reserved(allocator) -> int:
    return allocator.stats()["reserved_bytes"]["all"]["current"]


def test_slots_hit_in_order_at_their_offsets():
    slab, _ = slab_on()
    plan = slab.add_plan([1024, 4096, 1024], [0, 1024, 0], [0, 0, 0], 5120)
    slab.begin_step(plan)
    a = slab.allocate(1024)
    b = slab.allocate(4096)
    assert b - a == 1024
    slab.deallocate(a)
    c = slab.allocate(1024)
    assert c == a  # slot 2 reuses slot 0's bytes, which are free again
    slab.deallocate(b)
    slab.deallocate(c)
    assert slab.end_step() == 0
    st = slab.stats()
    assert (st["step_hits"], st["step_misses"]) == (3, 0)


def test_other_size_other_stream_and_beyond_the_plan_miss_an_unplanned_slot_goes_to_the_fallback_as_planned():
    slab, fallback = slab_on()
    plan = slab.add_plan([1024, 2048, 512], [0, 1024, U], [0, 0, 0], 3072)
    slab.begin_step(plan)
    other_size = slab.allocate(1000)          # slot 0 asked for 1024
    other_stream = slab.allocate(2048, 7)     # slot 1 was on stream 0
    unplanned = slab.allocate(512)            # slot 2 outlived its step: the fallback serves it, as planned
    beyond = slab.allocate(1024)              # no slot 3
    st = slab.stats()
    assert (st["step_hits"], st["step_misses"], st["step_unplanned"]) == (0, 3, 1)
    assert (st["misses"], st["unplanned"]) == (3, 1)
    assert all(fallback.owns(p) for p in (other_size, other_stream, unplanned, beyond))
    for p in (other_size, other_stream, unplanned, beyond):
        slab.deallocate(p)
    slab.end_step()
    assert fallback.stats()["allocated_bytes"]["all"]["current"] == st["region_bytes"] == 3072


def test_a_slot_whose_bytes_are_held_is_never_handed_out():
    slab, _ = slab_on()
    plan = slab.add_plan([4096, 4096], [0, 0], [0, 0], 4096)
    slab.begin_step(plan)
    a = slab.allocate(4096)
    b = slab.allocate(4096)  # the plan expected a to be freed first
    assert b != a and slab.stats()["step_misses"] == 1
    assert slab.end_step() == 1  # a escaped
    slab.begin_step(plan)
    c = slab.allocate(4096)  # slot 0 overlaps the escaped a
    assert c != a
    for p in (a, b, c):
        slab.deallocate(p)
    slab.end_step()


def test_plans_share_one_region_as_tall_as_the_tallest_and_the_fallback_counts_it():
    slab, fallback = slab_on()
    small = slab.add_plan([10 * MiB], [0], [0], 10 * MiB)
    big = slab.add_plan([30 * MiB], [0], [0], 30 * MiB)
    assert slab.stats()["region_bytes"] == 30 * MiB
    assert fallback.stats()["allocated_bytes"]["all"]["current"] == 30 * MiB
    fallback.empty_cache()
    assert reserved(fallback) == 30 * MiB  # the 10 MiB region was given back
    for plan, size in ((small, 10 * MiB), (big, 30 * MiB), (small, 10 * MiB)):
        slab.begin_step(plan)
        p = slab.allocate(size)
        slab.deallocate(p)
        slab.end_step()
    assert slab.stats()["hits"] == 3 and reserved(fallback) == 30 * MiB


def test_region_grows_only_when_nothing_in_it_is_live():
    slab, _ = slab_on()
    small = slab.add_plan([MiB], [0], [0], MiB)
    slab.begin_step(small)
    kept = slab.allocate(MiB)
    slab.end_step()
    big = slab.add_plan([4 * MiB], [0], [0], 4 * MiB)
    assert slab.stats()["region_bytes"] == MiB  # kept lives in the region
    slab.begin_step(big)
    p = slab.allocate(4 * MiB)
    assert slab.stats()["step_misses"] == 1  # served by the fallback until the region can grow
    slab.deallocate(p)
    slab.end_step()
    slab.deallocate(kept)
    slab.begin_step(big)
    p = slab.allocate(4 * MiB)
    assert slab.stats()["step_hits"] == 1 and slab.stats()["region_bytes"] == 4 * MiB
    slab.deallocate(p)
    slab.end_step()


def test_fallback_out_of_memory_leaves_the_plan_served_by_the_fallback():
    slab, fallback = slab_on(capacity=64 * MiB)
    plan = slab.add_plan([100 * MiB], [0], [0], 100 * MiB)
    st = slab.stats()
    assert st["grow_failures"] == 1 and st["region_bytes"] == 0
    slab.begin_step(plan)
    p = slab.allocate(MiB)
    assert slab.stats()["step_misses"] == 1 and fallback.owns(p)
    slab.deallocate(p)
    slab.end_step()


def test_removing_the_last_plan_returns_the_region_once_nothing_lives_in_it():
    slab, fallback = slab_on()
    plan = slab.add_plan([MiB], [0], [0], 2 * MiB)
    slab.begin_step(plan)
    kept = slab.allocate(MiB)
    slab.end_step()
    slab.remove_plan(plan)
    assert slab.stats()["region_bytes"] == 2 * MiB and slab.stats()["plans"] == 0
    slab.deallocate(kept)
    assert slab.stats()["region_bytes"] == 0
    assert fallback.stats()["allocated_bytes"]["all"]["current"] == 0


def test_allocations_outside_a_step_go_to_the_fallback_without_counting():
    slab, fallback = slab_on()
    slab.add_plan([MiB], [0], [0], MiB)
    p = slab.allocate(MiB)
    assert fallback.owns(p) and slab.owns(p)
    assert slab.stats()["misses"] == 0
    slab.deallocate(p)
    assert not slab.owns(p) and not fallback.owns(p)


@pytest.mark.parametrize(
    "sizes, offsets, streams, height",
    [
        ([1024], [32], [0], 4096),        # misaligned
        ([4096], [64], [0], 4096),        # past the height
        ([1024, 1], [0], [0], 4096),      # lengths differ
    ],
)
def test_inconsistent_plans_are_refused(sizes, offsets, streams, height):
    slab, _ = slab_on()
    with pytest.raises(ValueError):
        slab.add_plan(sizes, offsets, streams, height)


def test_misuse_is_refused_with_clear_errors():
    slab, _ = slab_on()
    with pytest.raises(ValueError, match="no plan"):
        slab.begin_step(3)
    plan = slab.add_plan([64], [0], [0], 64)
    slab.begin_step(plan)
    with pytest.raises(RuntimeError, match="under way"):
        slab.begin_step(plan)
    with pytest.raises(ValueError, match="under way"):
        slab.remove_plan(plan)
    slab.end_step()
    with pytest.raises(ValueError, match="did not hand out"):
        slab.deallocate(12345 * 64)
    with pytest.raises(ValueError, match="fallback"):
        _core.PlannedSlab(None)


def test_region_lives_on_the_plans_main_stream_and_moves_with_it():
    slab, fallback = slab_on()
    on7 = slab.add_plan([MiB, 4096], [0, MiB], [7, 0], 2 * MiB)
    assert [s["stream"] for s in fallback.segments() if s["blocks"][0]["allocated"]] == [7]
    slab.begin_step(on7)
    a = slab.allocate(MiB, 7)
    b = slab.allocate(4096, 0)   # planned on another stream than the region's: a miss
    assert (slab.stats()["step_hits"], slab.stats()["step_misses"]) == (1, 1)
    slab.deallocate(a)
    slab.deallocate(b)
    slab.end_step()
    on3 = slab.add_plan([MiB], [0], [3], MiB)   # nothing live: the region moves to stream 3
    live = [s["stream"] for s in fallback.segments() for blk in s["blocks"] if blk["allocated"]]
    assert live == [3]
    slab.begin_step(on3)
    p = slab.allocate(MiB, 3)
    assert slab.stats()["step_hits"] == 1
    slab.deallocate(p)
    slab.end_step()


def test_a_slab_outlives_its_python_fallback_safely():
    import gc

    fallback = sim_allocator()
    slab = _core.PlannedSlab(fallback)
    slab.add_plan([MiB], [0], [0], MiB)
    del fallback
    gc.collect()
    slab.begin_step(0)
    slab.deallocate(slab.allocate(MiB))
    slab.end_step()
    del slab   # returns the region to a fallback whose device is still alive
    gc.collect()


def test_an_idle_region_can_be_released_and_is_drawn_again_at_the_tallest_height():
    slab, fallback = slab_on()
    small = slab.add_plan([MiB], [0], [0], MiB)
    slab.add_plan([3 * MiB], [0], [0], 3 * MiB)
    slab.begin_step(small)
    assert slab.release_idle_region() is False  # a step is under way
    kept = slab.allocate(MiB)
    slab.end_step()
    assert slab.release_idle_region() is False  # kept lives in the region
    slab.deallocate(kept)
    assert slab.release_idle_region() is True
    assert slab.stats()["region_bytes"] == 0
    assert fallback.stats()["allocated_bytes"]["all"]["current"] == 0
    slab.begin_step(small)  # draws the region again, as tall as the tallest plan
    assert slab.stats()["region_bytes"] == 3 * MiB
    slab.deallocate(slab.allocate(MiB))
    slab.end_step()
    assert slab.stats()["step_hits"] == 1
