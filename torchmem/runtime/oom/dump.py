"""dump_on_oom(): a snapshot in PyTorch's format written when an out-of-memory error is raised.

::

    import torchmem
    torchmem.install(dump_on_oom=True)       # or: torchmem.install(); torchmem.dump_on_oom()
    train()                                  # an OOM writes oom_rank{rank}_pid{pid}.pickle

    $ torchmem replay oom_rank1_pid4242.pickle     # why it happened
    $ torchmem advise oom_rank1_pid4242.pickle     # which setting avoids it

Rules (see docs/oom.md):

- One dump_on_oom per process. Calling it again with the same path and
  max_entries does nothing; with others it raises RuntimeError:
  ``dump_on_oom(None)`` stops it first (and stops the history recording).
- The path's directory is made if missing and must be writable: checked at
  the call (OSError naming the directory) and again at each OOM.
- The OOM is raised as it would have been, whatever happens while writing
  (a full disk, a bad path): the message says the snapshot was lost and why.
- torchmem's allocators name the file in the error's message; with
  PyTorch's native CUDA allocator the note is printed to stderr instead.
"""
from __future__ import annotations

import os
import pickle
import shlex
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from torchmem.runtime.oom.backends import current_backend
from torchmem.runtime.oom.files import DEFAULT_PATH, check_template, current_rank, format_path, prepare_directory, write_new

DEFAULT_MAX_ENTRIES = 100_000
METADATA_KEY = "torchmem_oom"  # top-level key of the snapshot; readers of PyTorch's format ignore it

__all__ = ["DEFAULT_MAX_ENTRIES", "DEFAULT_PATH", "METADATA_KEY", "dump_on_oom", "dumping", "written_snapshots"]


@dataclass
class _Dumping:
    template: str
    max_entries: int
    backend: Any
    stop_watching: Callable[[], None] | None = None
    written: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


_lock = threading.Lock()
_active: _Dumping | None = None
_written: list[str] = []  # every file written in this process, across dump_on_oom() calls


def dump_on_oom(path: str | os.PathLike | None = DEFAULT_PATH, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
    """Record the allocator's history and write a snapshot when an out-of-memory error is raised.

    Args:
        path: where to write; ``{rank}`` and ``{pid}`` are filled in at the
            OOM (rank from torch.distributed once initialised, else $RANK,
            else 0). An existing file is never overwritten: a second OOM
            writes ``NAME-2.pickle``, then ``-3`` ... None stops dumping.
        max_entries: the history's ring size (events kept before the OOM).

    Starts history recording with Python stacks on the allocator PyTorch is
    using (torchmem's on CPU or CUDA, or PyTorch's native CUDA allocator),
    replacing any recording already on. The snapshot is PyTorch's format
    with the ``oom`` entry (``size``, ``device_free``) that ``torchmem
    replay`` and ``torchmem advise`` reproduce, plus a ``torchmem_oom`` key
    (rank, world size, pid, host, time).

    Raises:
        RuntimeError: dump_on_oom is on already with another path or
            max_entries, or no allocator can be recorded (CPU without
            torchmem.install()).
        OSError: the path's directory cannot be made or written to.
        ValueError / TypeError: a bad path template or max_entries.
    """
    global _active
    if path is None:
        _stop()
        return
    template = check_template(path)
    if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries <= 0:
        raise ValueError(f"max_entries must be a positive int, not {max_entries!r}")
    with _lock:
        if _active is not None:
            if _active.template == template and _active.max_entries == max_entries:
                return
            raise RuntimeError(
                f"torchmem.dump_on_oom() is already writing snapshots to {_active.template!r} "
                f"(max_entries={_active.max_entries}); call torchmem.dump_on_oom(None) to stop it before "
                f"starting it with path={template!r}, max_entries={max_entries}")
        backend = current_backend()
        prepare_directory(format_path(template))
        state = _Dumping(template, max_entries, backend)
        backend.start_recording(max_entries)
        try:
            state.stop_watching = backend.watch(_on_oom)
        except BaseException:
            backend.stop_recording()
            raise
        _active = state


def dumping() -> dict | None:
    """What dump_on_oom() is doing: {"path", "max_entries", "backend", "written", "failures"}, or None when off."""
    state = _active
    if state is None:
        return None
    return {"path": state.template, "max_entries": state.max_entries, "backend": state.backend.name,
            "written": list(state.written), "failures": list(state.failures)}


def written_snapshots() -> list[str]:
    """Every snapshot file dump_on_oom() wrote in this process, oldest first."""
    return list(_written)


def after_install() -> None:
    """torchmem.install() made a new CPU caching allocator: record its history too."""
    state = _active
    if state is not None and state.backend.name == "torchmem-cpu":
        state.backend.start_recording(state.max_entries)


def check_install_request(request: Any) -> None:
    """install(dump_on_oom=...)'s argument, checked before anything is installed: a bad template is refused."""
    if not isinstance(request, (bool, type(None))):
        check_template(request)


def start_after_install(request: Any) -> None:
    """What install(dump_on_oom=request) does once installed: keep recording, and start dumping when asked."""
    after_install()
    if request is True:
        dump_on_oom()
    elif request not in (None, False):
        dump_on_oom(request)


def _stop() -> None:
    global _active
    with _lock:
        state, _active = _active, None
    if state is None:
        return
    if state.stop_watching is not None:
        state.stop_watching()
    state.backend.stop_recording()


def _world_size() -> int:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return int(dist.get_world_size())
    except Exception:
        pass
    value = os.environ.get("WORLD_SIZE", "").strip()
    return int(value) if value.isdigit() else 1


def _on_oom(device: int, info: dict) -> str | None:
    """The observer: write the snapshot, return the note for the error message. Never raises."""
    state = _active
    if state is None:
        return None
    target = "(unknown)"
    try:
        rank = current_rank()
        target = format_path(state.template, rank=rank)
        snapshot = state.backend.snapshot()
        snapshot[METADATA_KEY] = {
            "rank": rank, "world_size": _world_size(), "pid": os.getpid(), "host": socket.gethostname(),
            "time": time.time(), "device": device, "backend": state.backend.name,
            "requested": info.get("requested"), "device_free": info.get("device_free"),
        }
        name = write_new(target, lambda f: pickle.dump(snapshot, f))
    except BaseException as e:  # a full disk, a bad path, no memory left: the OOM must still be raised
        state.failures.append(f"{target}: {type(e).__name__}: {e}")
        return (f"torchmem.dump_on_oom: could not write the snapshot of this out-of-memory error to {target}: "
                f"{type(e).__name__}: {e}. The snapshot is lost; the error above is the original one.")
    state.written.append(name)
    _written.append(name)
    quoted = shlex.quote(name)
    return (f"torchmem.dump_on_oom: wrote a snapshot of this out-of-memory error to {name} (rank {rank}).\n"
            f"  To see why it happened:               torchmem replay {quoted}\n"
            f"  To see which setting would avoid it:  torchmem advise {quoted}")
