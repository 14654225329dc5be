"""policy:stitch on a GPU: the policy on cuMem* pages (its own CudaDevice,
torchmem._C.cuda_stitch_allocator), data written through torch, memory
stitched from free pages. Skips without a GPU. (The policy itself is tested
on the host and simulated devices in tests/allocator/test_stitch.py and the C++
driver.)"""
import pytest
import torch

from tests.cuda.cuda_helpers import MiB, requires_gpu

pytestmark = requires_gpu


class Region:
    def __init__(self, ptr, size):
        self.__cuda_array_interface__ = {"shape": (size,), "typestr": "|u1", "data": (ptr, False), "version": 3}


def view(ptr, size):
    return torch.as_tensor(Region(ptr, size), device="cuda")


def put(t, value):
    """Writes by a copy from the host (real on the fake GPU, which runs no kernels)."""
    t.copy_(torch.full(tuple(t.shape), value, dtype=t.dtype))


def host(t):
    return t.cpu()


def test_blocks_hold_their_data_and_free_pages_are_stitched():
    from torchmem import _C

    total = torch.cuda.get_device_properties(0).total_memory
    a = _C.cuda_stitch_allocator(0, f"policy:stitch,per_process_memory_fraction:{(64 * MiB + MiB) / total:.12f}")
    blocks = [a.allocate(4 * MiB) for _ in range(16)]  # 64 MiB: the whole limit
    for i, p in enumerate(blocks):
        put(view(p, 4 * MiB), i)
    with pytest.raises(torch.OutOfMemoryError):
        a.allocate(4 * MiB)
    for p in blocks[::2]:
        a.deallocate(p)
    big = a.allocate(30 * MiB)  # from the freed pages, unmapped and mapped again
    put(view(big, 30 * MiB), 200)
    torch.cuda.synchronize()
    for i in range(1, 16, 2):
        v = host(view(blocks[i], 4 * MiB))
        assert int(v.min()) == i == int(v.max())
    assert int(host(view(big, 30 * MiB)).min()) == 200
    a.check_invariants()
    c = a.counters()
    assert c["reclaims"] == 1 and c["page_unmaps"] == 15
    a.deallocate(big)
    for p in blocks[1::2]:
        a.deallocate(p)
    a.empty_cache()
    assert a.stats()["reserved_bytes"]["all"]["current"] == 0


def test_page_calls_are_timed():
    from torchmem import _C

    t = _C.cuda_time_page_calls(0, 16, 2)
    assert t["page_size"] >= 2 * MiB
    assert 0 < t["map_us_per_page"] < 100_000 and 0 < t["unmap_us_per_page"] < 100_000
