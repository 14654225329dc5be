"""A caching allocator on a simulated device, and the size units the tests write."""
from __future__ import annotations

from torchmem import _core

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB


def sim_allocator(capacity: int = 80 * GiB, conf: str = "") -> "_core.CachingAllocator":
    """A caching allocator on a simulated device of `capacity` bytes."""
    return _core.CachingAllocator(_core.SimDevice(capacity), conf)


def block_of(allocator, addr: int) -> dict:
    """The block at `addr`, with its segment under key "segment"."""
    for seg in allocator.segments():
        for block in seg["blocks"]:
            if block["address"] == addr:
                return dict(block, segment=seg)
    raise KeyError(hex(addr))
