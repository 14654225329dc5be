"""torchmem on CUDA: the caching allocator as PyTorch's CUDA allocator.

``torchmem.install()`` calls :func:`install_cuda` when CUDA is available.
After it, PyTorch's own APIs report torchmem's allocator, unchanged:
``torch.cuda.memory_stats()``, ``memory_allocated()``, ``memory_reserved()``,
``max_memory_allocated()``, ``reset_peak_memory_stats()``,
``memory_snapshot()``, ``torch.cuda.memory._record_memory_history()`` and
``_dump_snapshot()``, ``empty_cache()``, ``set_per_process_memory_fraction()``,
``Tensor.record_stream()``, CUDA graphs, and running out of memory raises
``torch.cuda.OutOfMemoryError``.

PyTorch allows one swap of its CUDA allocator per process, before CUDA
initialises; :func:`install_cuda` raises :class:`CUDAAlreadyInitializedError`
otherwise.
"""
from __future__ import annotations

import os
from typing import Any

import torch

from torchmem import _C
from torchmem.devices import cuda_glue_built, cuda_index, given_conf, resolve_conf
from torchmem.devices import cuda_installed as installed  # noqa: F401  (torchmem.cuda.installed())

KINDS = ("caching",)


class CUDAAlreadyInitializedError(RuntimeError):
    """torchmem.install() came after CUDA initialised; PyTorch's allocator can no longer be swapped."""


class CUDANotBuiltError(RuntimeError):
    """This torchmem build has no CUDA part."""


ALREADY_INITIALIZED = (
    "torchmem.install() must run before CUDA initialises, and CUDA is already initialised in this "
    "process, so PyTorch's CUDA allocator can no longer be replaced (PyTorch allows the swap only "
    "once, before CUDA starts). Call torchmem.install() first thing in the program, before anything "
    "touches CUDA: creating a CUDA tensor, model.cuda() or .to('cuda'), torch.cuda.init(), "
    "torch.cuda.memory_allocated() or torch.cuda.get_device_properties(). In a notebook, restart "
    "the kernel and run it in the first cell."
)


def _require_glue() -> None:
    if not cuda_glue_built():
        raise CUDANotBuiltError(
            "this torchmem was built without its CUDA part: at build time torch.version.cuda was "
            f"{torch.version.cuda!r} or CUDA_HOME was not found. Rebuild it against a CUDA build of "
            "torch with the CUDA toolkit present: CUDA_HOME=/usr/local/cuda pip install "
            "--no-build-isolation -e ."
        )


def install_cuda(kind: str = "caching", conf: str | None = None) -> None:
    """Make torchmem's caching allocator PyTorch's CUDA allocator, on every GPU.

    Args:
        kind: the allocator; "caching" (PyTorch's native policy).
        conf: settings in PYTORCH_CUDA_ALLOC_CONF's grammar, e.g.
            "expandable_segments:True,max_split_size_mb:128"; defaults to
            $TORCHMEM_ALLOC_CONF.

    Raises:
        CUDAAlreadyInitializedError: CUDA initialised before this call.
        CUDANotBuiltError: torchmem was built without its CUDA part.
        ValueError: unknown kind or a bad config.

    Installing again with the same config does nothing; a different config is
    accepted only while CUDA has not initialised yet.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown allocator kind {kind!r}; choose one of {', '.join(KINDS)}")
    given = given_conf(conf)
    if native_reuse_order() == "segment" and "reuse_order" not in given:
        given = "reuse_order:segment" + ("," + given if given else "")
    resolved = resolve_conf(given)
    _require_glue()
    if torch.cuda.is_initialized() and not _C.cuda_installed():
        raise CUDAAlreadyInitializedError(ALREADY_INITIALIZED)
    try:
        _C.cuda_install(resolved)
    except RuntimeError as e:
        if "already initialised" in str(e):
            raise CUDAAlreadyInitializedError(f"{ALREADY_INITIALIZED} ({e})") from None
        raise


_NATIVE_REUSE_ORDER: list[str] = []


def native_reuse_order() -> str:
    """How this torch's own CUDA allocator orders free blocks of one size:
    "segment" (oldest segment first, then lowest address: its comparator
    BlockComparatorSizeCounterAddress, in torch 2.14.1) or "address" (lowest
    address first: BlockComparatorSize, torch 2.11). Read once from
    libc10_cuda.so's symbol names; torchmem's CUDA install follows it."""
    if not _NATIVE_REUSE_ORDER:
        order = "address"
        path = os.path.join(os.path.dirname(torch.__file__), "lib", "libc10_cuda.so")
        try:
            with open(path, "rb") as f:
                if b"BlockComparatorSizeCounterAddress" in f.read():
                    order = "segment"
        except OSError:
            pass
        _NATIVE_REUSE_ORDER.append(order)
    return _NATIVE_REUSE_ORDER[0]


def _index(device: Any) -> int:
    """The CUDA device `device` names (torchmem.devices' rule; None: the current one)."""
    return torch.cuda.current_device() if device is None else cuda_index(device)


def caching_allocator(device: Any = None) -> "_C.CachingAllocator":
    """The caching allocator behind a GPU's default pool (its stats, segments, history)."""
    _require_glue()
    return _C.cuda_caching_allocator(_index(device))


def pending_frees(device: Any = None) -> int:
    """Freed blocks still waiting for other streams' work (Tensor.record_stream)."""
    _require_glue()
    return int(_C.cuda_pending_frees(_index(device)))


def pool_count(device: Any = None) -> int:
    """Private pools (CUDA graphs, torch.cuda.MemPool) alive on a GPU."""
    _require_glue()
    return int(_C.cuda_pool_count(_index(device)))
