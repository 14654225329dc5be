"""One conformance suite, run against every allocator torchmem has.

Each allocator is reached through the same small interface: allocate(size)
-> address, deallocate(address), owns(address). Host-backed allocators also
get their memory written and read back, so overlapping blocks would show as
corrupted data.

"Every" is checked, not claimed: test_every_allocator_is_in_the_suite lists
the classes the extension registers as a ``torchmem._core.Allocator`` (the
``DeviceAllocator`` policies among them) and fails when a factory here makes
none of one of them.
"""
import ctypes
import random
import threading

import pytest

from torchmem import _core

from tests.support.sim import MiB


def _caching_host():
    return _core.CachingAllocator(_core.HostDevice(), ""), True


def _caching_sim():
    return _core.CachingAllocator(_core.SimDevice(64 << 30), ""), False


def _caching_host_small_split():
    return _core.CachingAllocator(_core.HostDevice(), "max_split_size_mb:21,roundup_power2_divisions:4"), True


def _caching_host_expandable():
    return _core.CachingAllocator(_core.HostDevice(), "expandable_segments:True"), True


def _stitch_host():
    return _core.StitchAllocator(_core.HostDevice(), "policy:stitch"), True


def _stitch_sim():
    return _core.device_allocator(_core.SimDevice(64 << 30), "policy:stitch"), False


def _stitch_host_small():
    # A small device: requests reclaim cached pages and stitch them at fresh places.
    return _core.device_allocator(_core.HostDevice(512 * MiB), "policy:stitch"), True


FACTORIES = {
    "caching-host-expandable": _caching_host_expandable,
    "stitch-host": _stitch_host,
    "stitch-sim": _stitch_sim,
    "stitch-host-small": _stitch_host_small,
    "caching-host": _caching_host,
    "caching-sim": _caching_sim,
    "caching-host-tuned": _caching_host_small_split,
}


def _planned_slab_in_step():
    # A step under way with a plan: requests of a slot's size hit the region, the others miss to the fallback.
    slab = _core.PlannedSlab(_core.CachingAllocator(_core.HostDevice(), ""))
    slab.begin_step(slab.add_plan([1 << 20, 512, 4096], [0, 1 << 20, 2 << 20], [0, 0, 0], 3 << 20))
    return slab, True


def _planned_slab_between_steps():
    return _core.PlannedSlab(_core.CachingAllocator(_core.HostDevice(), "")), True


def _recording_over_caching():
    return _core.RecordingAllocator(_core.CachingAllocator(_core.HostDevice(), "")), True


FACTORIES.update({
    "planned-slab-in-step": _planned_slab_in_step,
    "planned-slab-between-steps": _planned_slab_between_steps,
    "recording-over-caching": _recording_over_caching,
})


def register(name, factory):
    """Add an allocator to the suite: factory() -> (allocator, host_backed)."""
    FACTORIES[name] = factory


# Allocators that live in their own modules join the suite here; a missing one is an error, not a skip.
from torchmem.runtime.arena import conformance_factories as _arena_factories  # noqa: E402

for _name, _factory in _arena_factories().items():
    register(_name, _factory)


def registered_allocator_classes() -> set:
    """Every class the extension registers under torchmem._core.Allocator that can be made (the abstract
    interfaces, Allocator and DeviceAllocator, have no constructor)."""
    found, todo = set(), [_core.Allocator]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        try:
            cls()
        except TypeError as exc:
            if "No constructor defined" in str(exc):
                continue
        found.add(cls)
    return found


def test_every_allocator_is_in_the_suite():
    made = {}
    for name, factory in FACTORIES.items():
        allocator, _ = factory()
        made.setdefault(type(allocator), []).append(name)
    registered = registered_allocator_classes()
    assert {_core.CachingAllocator, _core.StitchAllocator, _core.Arena, _core.PlannedSlab, _core.RecordingAllocator} <= registered
    missing = sorted(cls.__name__ for cls in registered - set(made))
    assert not missing, f"allocators the extension registers and no factory of the suite makes: {missing}"


def test_every_policy_is_in_the_suite():
    """Each policy the registry has (torchmem._core.policies(), csrc/core/policy/policies.cpp) serves some factory."""
    policies = set()
    for factory in FACTORIES.values():
        allocator, _ = factory()
        if isinstance(allocator, _core.DeviceAllocator):
            policies.add(allocator.policy)
    assert {"native", "stitch"} <= set(_core.policies())
    missing = sorted(set(_core.policies()) - policies)
    assert not missing, f"policies the registry has and no factory of the suite makes: {missing}"


@pytest.fixture(params=sorted(FACTORIES))
def subject(request):
    allocator, host_backed = FACTORIES[request.param]()
    yield allocator, host_backed
    if hasattr(allocator, "check_invariants"):
        allocator.check_invariants()


def fill(addr, size, seed):
    ctypes.memset(addr, seed & 0xFF, size)


def intact(addr, size, seed):
    return ctypes.string_at(addr, size) == bytes([seed & 0xFF]) * size


def test_zero_size_is_null(subject):
    a, _ = subject
    assert a.allocate(0) == 0
    a.deallocate(0)


@pytest.mark.parametrize("size", [1, 3, 511, 512, 513, 4097, 1 << 20, (1 << 20) + 1, 3 * MiB + 7, 11 * MiB + 1])
def test_odd_sizes_are_aligned_and_usable(subject, size):
    a, host = subject
    p = a.allocate(size)
    assert p % 64 == 0
    assert a.owns(p)
    if host:
        fill(p, size, 0xA5)
        assert intact(p, size, 0xA5)
    a.deallocate(p)


def test_random_mix_keeps_every_block_intact(subject):
    a, host = subject
    rng = random.Random(7)
    live = {}
    for step in range(600):
        if live and rng.random() < 0.45:
            p, (size, seed) = live.popitem()
            if host:
                assert intact(p, size, seed), f"block {p:#x} corrupted by step {step}"
            a.deallocate(p)
        else:
            size = rng.choice([rng.randint(1, 4096), rng.randint(1, 2 * MiB), rng.randint(1, 24 * MiB)])
            p = a.allocate(size)
            assert p not in live
            if host:
                fill(p, size, step)
            live[p] = (size, step)
    for p, (size, seed) in live.items():
        if host:
            assert intact(p, size, seed)
        a.deallocate(p)


def test_several_threads(subject):
    a, host = subject
    errors = []

    def worker(seed):
        rng = random.Random(seed)
        mine = []
        try:
            for _ in range(400):
                if mine and rng.random() < 0.5:
                    p, size, tag = mine.pop(rng.randrange(len(mine)))
                    if host and not intact(p, min(size, 256), tag):
                        errors.append(f"thread {seed}: block {p:#x} corrupted")
                    a.deallocate(p)
                else:
                    size = rng.randint(1, 3 * MiB)
                    p = a.allocate(size)
                    if host:
                        fill(p, min(size, 256), seed)
                    mine.append((p, size, seed))
            for p, _, _ in mine:
                a.deallocate(p)
        except Exception as exc:  # surfaced below
            errors.append(repr(exc))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_foreign_pointer_is_rejected(subject):
    a, _ = subject
    p = a.allocate(100)
    assert not a.owns(p + 64)
    with pytest.raises(ValueError):
        a.deallocate(p + 64)
    a.deallocate(p)
