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
from typing import TYPE_CHECKING, Any

if _os.environ.get("TORCHMEM_EXT_DIR"):
    # The extensions built for another torch (the fake-GPU tier's CUDA build, `make test-fakegpu`) are found
    # in that folder before the in-tree ones: `torchmem._core` and `torchmem._C` import from there.
    from torchmem._extension import prefer_extensions_in

    prefer_extensions_in(__path__, _os.environ["TORCHMEM_EXT_DIR"])

# The user's names, each imported from its module on first use (PEP 562), so `import torchmem` and the
# command line's tools import no torch; the runtime's modules import it.
_HOMES = {
    "torchmem.runtime._install": ("install", "installed", "uninstall"),
    "torchmem.runtime.memory": ("caching_allocator", "empty_cache", "max_memory_allocated", "max_memory_reserved",
                        "memory_allocated", "memory_reserved", "memory_stats", "reset_accumulated_memory_stats",
                        "reset_peak_memory_stats", "set_per_process_memory_fraction"),
    "torchmem.runtime.summary": ("memory_summary",),
    "torchmem.runtime.snapshot": ("dump_snapshot", "memory_snapshot", "record_memory_history"),
    "torchmem.formats.snapshot_format": ("snapshot_from_replay",),
    "torchmem.runtime.arena": ("Arena", "ArenaEscapeError", "arena"),
    "torchmem.runtime.paged": ("OutOfBlocksError", "PagedKVCache"),
    "torchmem.runtime.planned": ("forget", "fragmentation_watch", "planned", "planned_step"),
    "torchmem.runtime.compact": ("CompactReport", "compact"),
    "torchmem.runtime.oom": ("dump_on_oom",),
}
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}

if TYPE_CHECKING:
    from torchmem.runtime._install import install, installed, uninstall
    from torchmem.runtime.arena import Arena, ArenaEscapeError, arena
    from torchmem.runtime.compact import CompactReport, compact
    from torchmem.runtime.memory import (caching_allocator, empty_cache, max_memory_allocated, max_memory_reserved,
                                 memory_allocated, memory_reserved, memory_stats, reset_accumulated_memory_stats,
                                 reset_peak_memory_stats, set_per_process_memory_fraction)
    from torchmem.runtime.oom import dump_on_oom
    from torchmem.runtime.paged import OutOfBlocksError, PagedKVCache
    from torchmem.runtime.planned import forget, fragmentation_watch, planned, planned_step
    from torchmem.runtime.snapshot import dump_snapshot, memory_snapshot, record_memory_history
    from torchmem.formats.snapshot_format import snapshot_from_replay
    from torchmem.runtime.summary import memory_summary


def __getattr__(name: str) -> Any:
    module = _HOME_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'torchmem' has no attribute {name!r}")
    import importlib
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOME_OF))


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
