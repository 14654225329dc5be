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
import sys
import warnings
from typing import Any

import torch

from torchmem import _C, _core
from torchmem.runtime.devices import ENV_CONF, cuda_glue_built, cuda_index
from torchmem.pytorch_env import conf_items, cuda_conf_vars, cuda_pytorch_conf

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
            "expandable_segments:True,max_split_size_mb:128". When None, the
            settings come from $TORCHMEM_ALLOC_CONF, else from the variable
            PyTorch's own allocator would read (see :func:`cuda_settings`).

    Raises:
        CUDAAlreadyInitializedError: CUDA initialised before this call.
        CUDANotBuiltError: torchmem was built without its CUDA part.
        ValueError: unknown kind or a bad config.

    Installing again with the same config does nothing; a different config is
    accepted only while CUDA has not initialised yet.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown allocator kind {kind!r}; choose one of {', '.join(KINDS)}")
    given = cuda_settings(conf)
    if native_reuse_order() == "segment" and "reuse_order" not in given:
        given = "reuse_order:segment" + ("," + given if given else "")
    resolved = _core.parse_config(given)
    _require_glue()
    if torch.cuda.is_initialized() and not _C.cuda_installed():
        raise CUDAAlreadyInitializedError(ALREADY_INITIALIZED)
    try:
        _C.cuda_install(resolved)
    except RuntimeError as e:
        if "already initialised" in str(e):
            raise CUDAAlreadyInitializedError(f"{ALREADY_INITIALIZED} ({e})") from None
        raise


# Note [Settings on CUDA]
# torchmem.install() on CUDA takes its settings from the first of:
#   1. install(conf=...), the argument;
#   2. $TORCHMEM_ALLOC_CONF, when set and not empty;
#   3. the variable PyTorch's own CUDA allocator reads, with PyTorch's
#      precedence for the installed release (Note [PyTorch's settings
#      variables] in torchmem/pytorch_env.py): PYTORCH_CUDA_ALLOC_CONF, else
#      PYTORCH_ALLOC_CONF from torch 2.10 (torch 2.6 and 2.9 read only
#      PYTORCH_CUDA_ALLOC_CONF).
# Once per process, a warning says when the settings came from PyTorch's
# variable, or when PyTorch's variable is set but torchmem's settings win.
# Keys torchmem cannot honour are named in a warning, never dropped silently:
# see NOT_HONOURED. From PyTorch's variable, a backend other than native and a
# key torchmem does not know are named and skipped; given to torchmem they
# are errors. A bad value is an error either way, as PyTorch makes it.

# Keys torchmem accepts and cannot honour, with the reason.
NOT_HONOURED = {
    "release_lock_on_cudamalloc": "torchmem holds its lock while it calls the driver",
    "release_lock_on_hipmalloc": "torchmem holds its lock while it calls the driver",
    "graph_capture_record_stream_reuse": "torchmem does not implement it",
    "throw_on_cudamalloc_oom": "torchmem does not implement it",
}
# Keys of PyTorch's pinned host allocator: it still serves pinned memory, and reads only PyTorch's variable.
PINNED = "pinned_"

_SAID: set[str] = set()


def _warn(message: str) -> None:
    """warnings.warn, attributed to the first caller outside torchmem (the program's install() line)."""
    package = os.path.dirname(os.path.abspath(__file__)) + os.sep
    frame, level = sys._getframe(0), 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, stacklevel=level)


def _say_once(what: str, message: str) -> None:
    if what not in _SAID:
        _SAID.add(what)
        _warn(message)


def cuda_settings(conf: str | None = None, environ: "dict[str, str] | None" = None) -> str:
    """The settings torchmem's CUDA allocator takes (Note [Settings on CUDA]), as a config string.

    Warns once per process where they came from when PyTorch's variable is
    involved, and names every key that cannot be honoured. Raises TypeError
    for a conf that is not a string, ValueError for a bad setting.
    """
    environ = dict(os.environ) if environ is None else environ
    if conf is not None and not isinstance(conf, str):
        raise TypeError(f"conf must be a string like 'max_split_size_mb:128', not {type(conf).__name__}")
    pytorch = cuda_pytorch_conf(environ)
    if conf is not None or environ.get(ENV_CONF):
        source = "install(conf=...)" if conf is not None else ENV_CONF
        text = conf if conf is not None else environ[ENV_CONF]
        if pytorch is not None and pytorch[1].strip() != text.strip():
            _say_once("shadowed", f"torchmem.install(): {pytorch[0]}={pytorch[1]} is not applied to torchmem's CUDA "
                                  f"allocator: {source} takes precedence over PyTorch's variable")
        return _checked(text, source, from_pytorch=False)
    if pytorch is None:
        return ""
    name, value = pytorch
    order = " else ".join(cuda_conf_vars())
    _say_once("taken", f"torchmem.install(): torchmem's CUDA allocator takes its settings from {name}={value}, "
                       f"as PyTorch's allocator would (torch {torch.__version__} reads {order}); "
                       f"{ENV_CONF} or install(conf=...) take precedence")
    return _checked(value, name, from_pytorch=True)


def _checked(text: str, source: str, from_pytorch: bool) -> str:
    """`text` with the keys torchmem cannot honour named in one warning (and, from PyTorch's variable, left out)."""
    kept, named = [], []
    try:
        items = conf_items(text)
    except ValueError as exc:
        raise ValueError(f"{source}: {exc}") from None
    for item in items:
        key = item.partition(":")[0].strip()
        try:
            _core.parse_config(item)
        except ValueError as exc:
            message = str(exc)
            if from_pytorch and "unknown key" in message:
                named.append(f"{item} (torchmem does not know this key)")
                continue
            if from_pytorch and key == "backend":
                named.append(f"{item} (torchmem is a caching allocator with PyTorch's native policy)")
                continue
            raise ValueError(f"{source}: {message}") from None
        if key in NOT_HONOURED:
            named.append(f"{item} ({NOT_HONOURED[key]})")
        elif key.startswith(PINNED) and not from_pytorch:
            named.append(f"{item} (PyTorch's pinned-memory allocator reads it from PyTorch's variable only)")
        kept.append(item)
    if named:
        _say_once(f"named {source}={text}",
                  f"torchmem.install(): {source}: not honoured by torchmem's CUDA allocator: " + "; ".join(named))
    try:
        _core.parse_config(",".join(kept))  # keys that bound each other (max_split_size_mb, large_segment_size_mb)
    except ValueError as exc:
        raise ValueError(f"{source}: {exc}") from None
    return ",".join(kept)


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
    """The CUDA device `device` names (torchmem.runtime.devices' rule; None: the current one)."""
    return torch.cuda.current_device() if device is None else cuda_index(device)


def caching_allocator(device: Any = None) -> "_core.CachingAllocator":
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
