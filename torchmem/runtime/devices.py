"""Which allocator serves which device, and under which settings.

The one place the rest of torchmem asks; it imports nothing of torchmem but
the compiled extension, so every module may read it:

- the settings: ``given_conf`` / ``resolve_conf`` (``conf``, else
  $TORCHMEM_ALLOC_CONF, else the defaults); on CUDA, install() then falls
  back to PyTorch's variable (Note [Settings on CUDA] in torchmem/runtime/cuda.py);
- what is installed: ``cpu_installed()``, ``cuda_glue_built()``,
  ``cuda_installed()``;
- the one device rule, ``device_name``: ``None`` is the device torchmem is
  installed on (the current CUDA device when it is installed on CUDA, else
  the CPU); an int ``N`` is ``cuda:N``; ``"cuda"`` is the current CUDA
  device; ``"cpu"``, ``"cuda:N"`` and ``torch.device`` are themselves.
  ``memory_stats()``, ``memory_snapshot()``, ``planned()``, ``Arena``,
  ``compact()`` and the other functions that take a device all resolve it
  here;
- the caching allocator serving a device, ``caching_allocator``.
"""
from __future__ import annotations

import os
from typing import Any

import torch  # loads libc10 before the extension

from torchmem import _C, _core
ENV_CONF = "TORCHMEM_ALLOC_CONF"


def given_conf(conf: str | None) -> str:
    """`conf` if given, else $TORCHMEM_ALLOC_CONF, else "", as written."""
    if conf is None:
        conf = os.environ.get(ENV_CONF, "")
    if not isinstance(conf, str):
        raise TypeError(f"conf must be a string like 'max_split_size_mb:128', not {type(conf).__name__}")
    return conf


def resolve_conf(conf: str | None) -> str:
    """The config to use: `conf` if given, else $TORCHMEM_ALLOC_CONF, else defaults.

    Raises ValueError naming the key and its allowed values when it is bad.
    """
    return _core.parse_config(given_conf(conf))


def cpu_installed() -> bool:
    """Whether torchmem is PyTorch's CPU allocator now."""
    return bool(_C.cpu_installed())


def cuda_glue_built() -> bool:
    """Whether this build of torchmem has its CUDA part (compiled against a CUDA torch)."""
    return bool(getattr(_C, "has_cuda_glue", False))


def cuda_installed() -> bool:
    """Whether torchmem is PyTorch's CUDA allocator in this process."""
    return cuda_glue_built() and bool(_C.cuda_installed())


def device_name(device: Any = None) -> str:
    """The device `device` names, as "cpu" or "cuda:N" (the module's rule; ValueError for any other)."""
    if device is None:
        device = "cuda" if cuda_installed() else "cpu"
    if isinstance(device, int) and not isinstance(device, bool):
        if device < 0:
            raise ValueError(f"a CUDA device index is not negative, got {device}")
        return f"cuda:{device}"
    if not isinstance(device, (str, torch.device)):
        raise ValueError(f"expected 'cpu', 'cuda', 'cuda:N', an index or a torch.device, got {device!r}")
    name = str(device)
    if name == "cpu":
        return name
    if name == "cuda":
        return f"cuda:{torch.cuda.current_device()}"
    if name.startswith("cuda:") and name[5:].isdigit():
        return f"cuda:{int(name[5:])}"
    raise ValueError(f"expected 'cpu', 'cuda', 'cuda:N', an index or a torch.device, got {device!r}")


def cuda_index(device: Any = None) -> int:
    """The index of the CUDA device `device` names (ValueError for the CPU)."""
    name = device_name(device)
    if name == "cpu":
        raise ValueError(f"expected a CUDA device, got {device!r}")
    return int(name[5:])


def is_cuda(device: Any) -> bool:
    """Whether `device` names a CUDA device by its form alone (None does not): nothing is initialised."""
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, int):
        return not isinstance(device, bool)
    return isinstance(device, str) and device.split(":")[0] == "cuda"


def caching_allocator(device: Any = None) -> "_core.CachingAllocator | None":
    """The caching allocator serving `device` (None before torchmem.install() on the CPU).

    ValueError for a CUDA device when torchmem is not installed on CUDA, and
    for anything that names no device.
    """
    if is_cuda(device) and not cuda_installed():
        raise ValueError(f"torchmem manages the CPU on this machine (it is not installed on CUDA); got device {device!r}")
    try:
        name = device_name(device)
    except ValueError:
        raise ValueError(f"torchmem manages the CPU and CUDA devices; got device {device!r}") from None
    if name == "cpu":
        return _C.cpu_caching_allocator()
    return _C.cuda_caching_allocator(int(name[5:]))

