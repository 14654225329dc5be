"""torchmem: a memory toolkit for PyTorch.

One line swaps PyTorch's allocator for torchmem's caching allocator::

    import torchmem
    torchmem.install()          # CPU: replaces PyTorch's CPU allocator

and the functions below mirror ``torch.cuda.memory``: ``memory_stats()``,
``memory_allocated()``, ``memory_reserved()``, ``empty_cache()``,
``memory_summary()`` and friends. ``dump_on_oom()`` (or
``install(dump_on_oom=True)``) writes a snapshot when an out-of-memory error
is raised, for ``torchmem replay`` and ``torchmem advise`` (docs/oom.md).
"""
import os as _os

if _os.environ.get("TORCHMEM_EXT_DIR"):
    # The extension built for another torch (the fake-GPU tier's CUDA build,
    # `make test-fakegpu`) loaded from that folder in place of the in-tree one.
    from torchmem._extension import load_extension_from

    load_extension_from(_os.environ["TORCHMEM_EXT_DIR"])

from torchmem._install import install, installed, uninstall
from torchmem.memory import (
    caching_allocator,
    empty_cache,
    max_memory_allocated,
    max_memory_reserved,
    memory_allocated,
    memory_reserved,
    memory_stats,
    reset_accumulated_memory_stats,
    reset_peak_memory_stats,
    set_per_process_memory_fraction,
)
from torchmem.summary import memory_summary
from torchmem.snapshot import dump_snapshot, memory_snapshot, record_memory_history, snapshot_from_replay
from torchmem.arena import Arena, ArenaEscapeError, arena
from torchmem.paged import OutOfBlocksError, PagedKVCache
from torchmem.planned import forget, fragmentation_watch, planned, planned_step
from torchmem.compact import CompactReport, compact
from torchmem.oom import dump_on_oom

__version__ = "0.1.0"

__all__ = [
    "Arena",
    "ArenaEscapeError",
    "CompactReport",
    "OutOfBlocksError",
    "PagedKVCache",
    "arena",
    "caching_allocator",
    "compact",
    "dump_on_oom",
    "dump_snapshot",
    "empty_cache",
    "forget",
    "fragmentation_watch",
    "install",
    "installed",
    "max_memory_allocated",
    "max_memory_reserved",
    "memory_allocated",
    "memory_reserved",
    "memory_snapshot",
    "memory_stats",
    "memory_summary",
    "planned",
    "planned_step",
    "record_memory_history",
    "reset_accumulated_memory_stats",
    "reset_peak_memory_stats",
    "set_per_process_memory_fraction",
    "snapshot_from_replay",
    "uninstall",
]
