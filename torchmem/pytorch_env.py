"""PyTorch's allocator settings variables, read as PyTorch reads them.

Note [PyTorch's settings variables]
PyTorch's CUDA caching allocator reads one of two variables, whole: the
first one set (an empty value counts as set) in this order:

    torch 2.6, 2.9        PYTORCH_CUDA_ALLOC_CONF only (PYTORCH_ALLOC_CONF is ignored)
    torch 2.10 and later  PYTORCH_CUDA_ALLOC_CONF, else PYTORCH_ALLOC_CONF

The keys of the other variable are not merged in. Read in
c10/cuda/CUDAAllocatorConfig.h (CUDAAllocatorConfig::instance()) of the
wheels of 2.6.0, 2.9.1, 2.10.0, 2.11.0, 2.13.0 and 2.14.1; checked on those
wheels' libc10_cuda.so with both variables set (CUDAAllocatorConfig's
expandable_segments() and max_split_size()); on the fake GPU with torch
2.14.1, the native snapshot's allocator_settings and segments agree
(tests/cuda/test_install_honours_settings.py). From 2.10 the keys shared by
every device (expandable_segments, max_split_size_mb, ...) live in
c10::CachingAllocator::AcceleratorAllocatorConfig, which reads the variables
in the same order. ROCm builds read PYTORCH_HIP_ALLOC_CONF between the two.

On a CPU build, ``torch._C._accelerator_getAllocatorSettings()`` returns
PYTORCH_CUDA_ALLOC_CONF's value when both are set (torch 2.13); no CPU
allocator of PyTorch's takes these settings. tests/allocator/test_config.py holds
pytorch_conf() to the installed torch.

torchmem's own allocator reads install(conf=...), then TORCHMEM_ALLOC_CONF,
then on CUDA the variable above (torchmem/runtime/cuda.py, cuda_settings()).
"""
from __future__ import annotations

import os
import re
from typing import Mapping

from torchmem import _core

# In PyTorch's order: the first one set is the one PyTorch uses.
PYTORCH_CONF_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


def pytorch_conf(environ: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """(variable, value) of the settings PyTorch's allocator reads from `environ` (default os.environ)."""
    environ = os.environ if environ is None else environ
    for name in PYTORCH_CONF_VARS:
        if name in environ:
            return name, environ[name]
    return None


# The first torch release whose CUDA allocator falls back to PYTORCH_ALLOC_CONF (Note above).
ALLOC_CONF_FROM = (2, 10)


def torch_release(version: str | None = None) -> tuple[int, int]:
    """(major, minor) of a torch version string (default: the installed torch's)."""
    if version is None:
        import torch

        version = torch.__version__
    found = re.match(r"(\d+)\.(\d+)", str(version))
    if found is None:
        raise ValueError(f"not a torch version: {version!r}")
    return int(found.group(1)), int(found.group(2))


def cuda_conf_vars(version: str | None = None) -> tuple[str, ...]:
    """The variables the CUDA allocator of torch `version` (default: the installed one) reads, in its order."""
    return PYTORCH_CONF_VARS if torch_release(version) >= ALLOC_CONF_FROM else PYTORCH_CONF_VARS[:1]


def cuda_pytorch_conf(environ: Mapping[str, str] | None = None,
                      version: str | None = None) -> tuple[str, str] | None:
    """(variable, value) that the CUDA allocator of torch `version` (default: the installed one) takes
    from `environ` (default os.environ), or None when it takes none (Note [PyTorch's settings variables])."""
    environ = os.environ if environ is None else environ
    for name in cuda_conf_vars(version):
        if name in environ:
            return name, environ[name]
    return None


def conf_items(conf: str) -> list[str]:
    """The top-level "key:value" items of a settings string, as the core splits it (a list value such as
    "[256:1,>:4]" stays whole); ValueError for an empty item or unbalanced brackets, as PyTorch refuses them."""

    return _core.rules.config_items(conf) if conf.strip() else []


def conf_value(conf: str, key: str) -> str | None:
    """The value of `key` in a settings string ("max_split_size_mb:64,..."), or None when it has none."""
    for item in conf_items(conf):
        name, _, value = item.partition(":")
        if name.strip() == key:
            return value.strip()
    return None


def recorded_conf_string(settings: Mapping) -> str | None:
    """The settings string of a snapshot's ``allocator_settings`` (CUDA builds write it under
    PYTORCH_CUDA_ALLOC_CONF, some builds for other devices under PYTORCH_ALLOC_CONF)."""
    for name in PYTORCH_CONF_VARS:
        value = settings.get(name)
        if isinstance(value, str):
            return value
    return None
