"""The Python API mirrors torch.cuda.memory: the same keys, the same meanings."""
import torch

import torchmem
from torchmem.runtime.memory import flatten_stats
from torchmem.runtime.summary import format_bytes

from tests.support.sim import MiB, sim_allocator

# The keys of torch.cuda.memory_stats() (PyTorch 2.x), checked against its docs.
TORCH_KEYS = {
    f"{stat}.{pool}.{field}"
    for stat in (
        "allocation", "segment", "active", "inactive_split", "allocated_bytes", "reserved_bytes",
        "active_bytes", "inactive_split_bytes", "requested_bytes",
    )
    for pool in ("all", "large_pool", "small_pool")
    for field in ("current", "peak", "allocated", "freed")
} | {
    f"{stat}.{field}" for stat in ("oversize_allocations", "oversize_segments")
    for field in ("current", "peak", "allocated", "freed")
} | {"num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc", "num_device_free", "max_split_size"}


def test_stat_keys_are_torch_cuda_memory_stats_keys():
    a = sim_allocator()
    assert set(flatten_stats(a.stats())) == TORCH_KEYS


def test_flattened_stats_are_sorted_like_torch():
    flat = flatten_stats(sim_allocator().stats())
    assert list(flat) == sorted(flat)


def test_summary_table_shows_current_and_peak():
    torchmem.install()
    try:
        x = torch.empty(3 * MiB, dtype=torch.uint8)
        text = torchmem.memory_summary()
        assert "Allocated memory" in text and "Reserved memory" in text
        line = next(l for l in text.splitlines() if l.startswith("| Allocated memory"))
        assert "3.0 MiB" in line
        del x
    finally:
        torchmem.uninstall()


def test_format_bytes():
    assert format_bytes(0) == "0 B"
    assert format_bytes(1536) == "1.5 KiB"
    assert format_bytes(20 * MiB) == "20.0 MiB"
    assert format_bytes(-2048) == "-2.0 KiB"
