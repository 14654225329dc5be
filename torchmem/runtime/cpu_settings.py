"""The settings torchmem.install() uses on the CPU, where they depart from
the native policy (Note [CPU settings] in csrc/core/base/alloc_config.h).

On the CPU nothing has to match PyTorch's CUDA allocator decision for
decision, so install() adds two settings there, each of which a config can
set back to its native value:

- ``reuse_order:recent``: among the free blocks of the best-fitting size,
  the most recently freed one, whose cache lines are the likeliest to be warm
  (native: ``address``, the lowest address).
- ``min_block_size:64``: sizes round up to 64 B (c10's CPU alignment) instead
  of 512 B, so a four-float tensor takes 64 B, about what glibc charges
  (native: ``512``).

The simulated device (torchmem.replay) and CUDA keep the native policy.
"""
from __future__ import annotations

from torchmem import _core

CPU_DEFAULTS = "reuse_order:recent,min_block_size:64"


def with_cpu_defaults(conf: str) -> str:
    """`conf` (a config string) over CPU_DEFAULTS: keys `conf` sets win.

    Returns the normalised config (only keys that differ from the native
    defaults); raises ValueError for a bad config.
    """
    if not isinstance(conf, str):
        raise TypeError(f"conf must be a string like 'max_split_size_mb:128', not {type(conf).__name__}")
    return _core.parse_config(CPU_DEFAULTS + ("," + conf if conf.strip() else ""))
