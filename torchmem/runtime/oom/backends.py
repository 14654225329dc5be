"""The allocator PyTorch is using, and how dump_on_oom() records, watches and snapshots it.

Three backends, chosen by :func:`current_backend`:

- ``torchmem-cpu``: torchmem installed as PyTorch's CPU allocator. History
  through torchmem.record_memory_history(); the snapshot is
  torchmem.memory_snapshot(); the observer is torchmem's, and its note ends
  the out-of-memory error's message.
- ``torchmem-cuda``: torchmem installed as PyTorch's CUDA allocator. History
  through torch.cuda.memory._record_memory_history() (torchmem's allocator
  answers it, on every GPU); the snapshot is torch.cuda.memory._snapshot();
  the observer is torchmem's, and its note ends the message.
- ``native-cuda``: PyTorch's own CUDA caching allocator. History through
  torch.cuda.memory._record_memory_history(); the snapshot is
  torch.cuda.memory._snapshot(); the observer is PyTorch's
  (torch._C._cuda_attach_out_of_memory_observer), which cannot change the
  message, so the note is printed to stderr. PyTorch cannot detach an
  observer: it is attached once per process and does nothing while
  dump_on_oom() is off.

The CUDA backends are written against PyTorch's documented hooks but have
not run on a GPU (the tests run on CPU); see docs/oom.md.
"""
from __future__ import annotations

from typing import Any, Callable, Protocol

import torch

from torchmem import _C
from torchmem.runtime.devices import cpu_installed, cuda_installed
from torchmem.runtime.snapshot import memory_snapshot, record_memory_history

# fn(device, info) -> note or None; info has at least "requested" and "device_free".
OomCallback = Callable[[int, dict], "str | None"]


class Backend(Protocol):
    name: str
    note_in_message: bool  # False: the note can only be printed

    def start_recording(self, max_entries: int) -> None: ...
    def stop_recording(self) -> None: ...
    def snapshot(self) -> dict: ...
    def watch(self, callback: OomCallback) -> Callable[[], None]:
        """Call `callback` at each OOM until the returned function is called."""
        ...


class TorchmemCpu:
    name = "torchmem-cpu"
    note_in_message = True

    def start_recording(self, max_entries: int) -> None:
        record_memory_history("all", max_entries=max_entries, stacks="python")

    def stop_recording(self) -> None:
        record_memory_history(None)

    def snapshot(self) -> dict:
        return memory_snapshot()

    def watch(self, callback: OomCallback) -> Callable[[], None]:
        observer_id = _C.cpu_add_oom_observer(callback)
        return lambda: _C.cpu_remove_oom_observer(observer_id)


class TorchmemCuda:
    name = "torchmem-cuda"
    note_in_message = True

    def start_recording(self, max_entries: int) -> None:
        torch.cuda.memory._record_memory_history("all", max_entries=max_entries, stacks="python")

    def stop_recording(self) -> None:
        torch.cuda.memory._record_memory_history(None)

    def snapshot(self) -> dict:
        return torch.cuda.memory._snapshot()

    def watch(self, callback: OomCallback) -> Callable[[], None]:
        observer_id = _C.cuda_add_oom_observer(callback)
        return lambda: _C.cuda_remove_oom_observer(observer_id)


class NativeCuda(TorchmemCuda):
    """PyTorch's own CUDA allocator: recorded and snapshotted as torchmem's CUDA path
    (through torch.cuda.memory), watched through torch's OOM observer."""

    name = "native-cuda"
    note_in_message = False
    _attached = False
    _callback: OomCallback | None = None

    def watch(self, callback: OomCallback) -> Callable[[], None]:
        NativeCuda._callback = callback
        if not NativeCuda._attached:
            torch._C._cuda_attach_out_of_memory_observer(NativeCuda._observe)
            NativeCuda._attached = True

        def stop() -> None:
            NativeCuda._callback = None

        return stop

    @staticmethod
    def _observe(device: int, requested: int, device_total: int, device_free: int) -> None:
        # PyTorch calls this after releasing its allocator's lock, before it raises the error.
        callback = NativeCuda._callback
        if callback is None:
            return
        note = callback(int(device), {"requested": int(requested), "device_total": int(device_total),
                                      "device_free": int(device_free)})
        if note:
            import sys

            print(note, file=sys.stderr, flush=True)


def current_backend() -> Any:
    """The backend of the allocator PyTorch uses now; RuntimeError when no backend can record one."""

    if cuda_installed():
        return TorchmemCuda()
    if torch.cuda.is_available():
        return NativeCuda()
    if cpu_installed():
        return TorchmemCpu()
    raise RuntimeError(
        "torchmem.dump_on_oom() on a machine without CUDA needs torchmem as PyTorch's CPU allocator: call "
        "torchmem.install() first, or torchmem.install(dump_on_oom=True). PyTorch's own CPU allocator records "
        "no history and raises no out-of-memory error to observe."
    )
