"""PyTorch's allocator settings variables, read as PyTorch reads them.

PyTorch reads its allocator settings from two variables. Checked on torch
2.13 (CPU) and 2.14.1 (CUDA) with both set:
``torch._C._accelerator_getAllocatorSettings()`` returns
PYTORCH_CUDA_ALLOC_CONF's value, so that one wins and PYTORCH_ALLOC_CONF is
read only when PYTORCH_CUDA_ALLOC_CONF is unset (c10/cuda/CUDAAllocatorConfig.h:
"keep the parsing order ... stable"; ROCm's PYTORCH_HIP_ALLOC_CONF comes
between them). tests/test_config.py holds this to the installed torch.

torchmem's own allocator reads TORCHMEM_ALLOC_CONF (torchmem/_install.py);
these are what PyTorch's allocator runs with, named in notes and in the
settings a snapshot records.
"""
from __future__ import annotations

import os
from typing import Mapping

# In PyTorch's order: the first one set is the one PyTorch uses.
PYTORCH_CONF_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


def pytorch_conf(environ: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """(variable, value) of the settings PyTorch's allocator reads from `environ` (default os.environ)."""
    environ = os.environ if environ is None else environ
    for name in PYTORCH_CONF_VARS:
        if name in environ:
            return name, environ[name]
    return None


def conf_value(conf: str, key: str) -> str | None:
    """The value of `key` in a settings string ("max_split_size_mb:64,..."), or None when it has none."""
    for item in conf.split(","):
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
