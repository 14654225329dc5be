"""Statistics of the installed allocator, mirroring torch.cuda.memory.

Keys and meanings are those of ``torch.cuda.memory_stats()``: ``allocated``
counts bytes in live tensors, ``reserved`` the bytes held from the device
(allocated plus cached), each with ``.all`` / ``.large_pool`` /
``.small_pool`` and ``.current`` / ``.peak`` / ``.allocated`` / ``.freed``.

``device``: None (the device torchmem is installed on: the current CUDA
device when it is installed on CUDA, else the CPU), "cpu", "cuda", "cuda:N",
an index or a torch.device (torchmem/runtime/devices.py).
"""
from __future__ import annotations

import warnings
from collections import OrderedDict
from typing import Any

from torchmem.runtime.devices import caching_allocator  # the allocator serving a device, by torchmem.runtime.devices' rule


def flatten_stats(nested: dict) -> "OrderedDict[str, int]":
    """{"allocation": {"all": {"current": 1}}} -> {"allocation.all.current": 1}, sorted."""
    flat: dict[str, int] = {}

    def walk(prefix: str, obj: Any) -> None:
        if isinstance(obj, dict):
            for key, value in obj.items():
                walk(f"{prefix}.{key}" if prefix else key, value)
        else:
            flat[prefix] = obj

    walk("", nested)
    return OrderedDict(sorted(flat.items()))


class NotInstalledWarning(UserWarning):
    """A statistic was asked for before torchmem.install(): it describes no allocator."""


def _warn_not_installed(what: str, stacklevel: int) -> None:
    warnings.warn(f"torchmem.{what}: torchmem is not installed, so there are no figures "
                  f"({'an empty dict' if what == 'memory_stats()' else '0'} returned); call torchmem.install() first",
                  NotInstalledWarning, stacklevel=stacklevel + 1)


def memory_stats(device: Any = None) -> "OrderedDict[str, int]":
    """All statistics, under the keys of torch.cuda.memory_stats(); before install(), an empty dict and a
    NotInstalledWarning."""
    allocator = caching_allocator(device)
    if allocator is None:
        _warn_not_installed("memory_stats()", 2)
        return OrderedDict()
    return flatten_stats(allocator.stats())


def _stat(key: str, device: Any, what: str) -> int:
    allocator = caching_allocator(device)
    if allocator is None:
        _warn_not_installed(f"{what}()", 3)
        return 0
    return int(flatten_stats(allocator.stats()).get(key, 0))


def memory_allocated(device: Any = None) -> int:
    """Bytes in live allocations."""
    return _stat("allocated_bytes.all.current", device, "memory_allocated")


def max_memory_allocated(device: Any = None) -> int:
    """Peak of memory_allocated() since start or reset_peak_memory_stats()."""
    return _stat("allocated_bytes.all.peak", device, "max_memory_allocated")


def memory_reserved(device: Any = None) -> int:
    """Bytes held from the device: allocated plus cached."""
    return _stat("reserved_bytes.all.current", device, "memory_reserved")


def max_memory_reserved(device: Any = None) -> int:
    """Peak of memory_reserved() since start or reset_peak_memory_stats()."""
    return _stat("reserved_bytes.all.peak", device, "max_memory_reserved")


def reset_peak_memory_stats(device: Any = None) -> None:
    """Set every peak to its current value."""
    allocator = caching_allocator(device)
    if allocator:
        allocator.reset_peak_stats()


def reset_accumulated_memory_stats(device: Any = None) -> None:
    """Zero the accumulated counters (.allocated, .freed, num_*)."""
    allocator = caching_allocator(device)
    if allocator:
        allocator.reset_accumulated_stats()


def empty_cache(device: Any = None) -> None:
    """Return every cached, unused segment to the device."""
    allocator = caching_allocator(device)
    if allocator:
        allocator.empty_cache()


def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
    """Cap reserved memory at fraction * device capacity (and enable garbage collection)."""
    allocator = caching_allocator(device)
    if allocator is None:
        raise RuntimeError("torchmem is not installed: call torchmem.install() first")
    allocator.set_memory_fraction(float(fraction))
