"""torchmem.install(): make torchmem PyTorch's allocator in one line."""
from __future__ import annotations

import os
import warnings

import torch  # loads libc10 before the extension

from torchmem import _C

from torchmem.runtime import devices
from torchmem.runtime.devices import ENV_CONF, given_conf, resolve_conf
from torchmem.runtime.oom.dump import check_install_request, start_after_install
from torchmem.pytorch_env import pytorch_conf
from torchmem.runtime.cpu_settings import with_cpu_defaults
from torchmem.runtime.cuda import install_cuda

KINDS = ("caching",)


def install(kind: str = "caching", conf: str | None = None,
            dump_on_oom: "str | os.PathLike | bool | None" = None) -> None:
    """Make torchmem's caching allocator PyTorch's allocator: on a machine
    with CUDA, the CUDA allocator (before CUDA initialises; see docs/cuda.md);
    otherwise the CPU allocator.

    Args:
        kind: the allocator; "caching" (PyTorch's native policy).
        conf: settings in PYTORCH_CUDA_ALLOC_CONF's grammar
            ("max_split_size_mb:128,garbage_collection_threshold:0.8");
            defaults to $TORCHMEM_ALLOC_CONF, and on CUDA then to the
            variable PyTorch's own allocator reads (PYTORCH_CUDA_ALLOC_CONF,
            else PYTORCH_ALLOC_CONF from torch 2.10; Note [Settings on CUDA]
            in torchmem/runtime/cuda.py). torchmem adds ``capacity``
            (e.g. "8GiB"), ``per_process_memory_fraction`` and ``policy``:
            ``native`` (PyTorch's rules, the default) or ``stitch`` (the
            policy that needs the least memory, docs/stitch.md). On the CPU
            the config applies over ``reuse_order:recent,min_block_size:64``
            (torchmem.runtime.cpu_settings); give ``reuse_order:address,
            min_block_size:512`` for the native policy there.
        dump_on_oom: True, or a path template, to call
            ``torchmem.dump_on_oom(path)`` once installed: history is recorded
            and an out-of-memory error writes a snapshot (True: the default
            path, "oom_rank{rank}_pid{pid}.pickle"). See torchmem.runtime.oom.

    Installing again with another config starts a fresh caching allocator;
    tensors made by the old one are still freed correctly, but leave the
    figures (a warning says how many bytes). On CUDA, a warning says once
    when the settings come from PyTorch's variable, and one names each key
    torchmem cannot honour. On the CPU, PyTorch's variables are not read
    (a warning says so when one is set and neither `conf` nor
    TORCHMEM_ALLOC_CONF is).
    """
    if kind not in KINDS:
        raise ValueError(f"unknown allocator kind {kind!r}; choose one of {', '.join(KINDS)}")
    if not (dump_on_oom is None or isinstance(dump_on_oom, (bool, str, os.PathLike))):
        raise TypeError(f"dump_on_oom must be True, False, None or a path, not {type(dump_on_oom).__name__}")
    check_install_request(dump_on_oom)  # a bad template is refused before anything is installed
    if torch.cuda.is_available():
        install_cuda(kind, conf)  # Note [Settings on CUDA]: conf, TORCHMEM_ALLOC_CONF, then PyTorch's variable
    else:
        _install_cpu(conf)
    start_after_install(dump_on_oom)  # records history, and dumps on OOM when asked (torchmem/runtime/oom/dump.py)


def _install_cpu(conf: str | None) -> None:
    """The CPU install: `conf`, else $TORCHMEM_ALLOC_CONF, over torchmem's CPU defaults.

    PyTorch's CPU allocator has no settings variable, so PyTorch's
    (PYTORCH_CUDA_ALLOC_CONF, else PYTORCH_ALLOC_CONF) is not read here; a
    warning names it when it is set and torchmem's settings are not."""

    given = given_conf(conf)
    resolve_conf(given)  # a bad config is refused before anything is installed
    pytorch_setting = pytorch_conf()  # PYTORCH_CUDA_ALLOC_CONF, else PYTORCH_ALLOC_CONF, as PyTorch reads them
    if conf is None and not os.environ.get(ENV_CONF) and pytorch_setting and pytorch_setting[1]:
        name, value = pytorch_setting
        warnings.warn(f"torchmem.install(): {name}={value} is not applied: it configures PyTorch's own "
                      f"allocator, and on the CPU torchmem reads {ENV_CONF} or install(conf=...); the CPU "
                      "allocator runs with torchmem's defaults", stacklevel=3)
    previous = _C.cpu_caching_allocator() if _C.cpu_installed() else None
    live_before = previous.stats()["allocated_bytes"]["all"]["current"] if previous is not None else 0
    _C.cpu_install(with_cpu_defaults(given))  # the keys as given: a native value overrides a CPU default
    now = _C.cpu_caching_allocator()
    if live_before and now is not None and now.stats()["allocated_bytes"]["all"]["current"] < live_before:
        warnings.warn(f"torchmem.install(): installed again with other settings, so a fresh caching allocator "
                      f"serves new tensors; the {live_before:,} bytes of tensors made before stay with the previous "
                      f"one (they are freed correctly) and are left out of memory_stats(), memory_allocated() and "
                      f"memory_summary() from now on", stacklevel=3)


def uninstall() -> None:
    """Restore the CPU allocator PyTorch had before install().

    Tensors allocated by torchmem stay valid and are freed by torchmem.
    """
    _C.cpu_uninstall()


def installed() -> bool:
    """Whether torchmem is PyTorch's CPU allocator now."""
    return devices.cpu_installed()
