"""Memory snapshots and allocation history, in PyTorch's own format.

``memory_snapshot()`` returns the dict that ``torch.cuda.memory._snapshot()``
returns, so every tool that reads a PyTorch snapshot (``torch.cuda._memory_viz``,
the memory_viz web page, ``torchmem plot`` / ``viz`` / ``stats`` / ``replay``)
reads torchmem's::

    import torchmem
    torchmem.install()
    torchmem.record_memory_history(max_entries=100_000)   # Python stacks too
    ...                                                   # run the model
    torchmem.dump_snapshot("snapshot.pickle")
    torchmem.record_memory_history(None)                  # stop recording

The history is a ring buffer in the allocator: once ``max_entries`` events
were recorded, each new event replaces the oldest. A block's ``frames`` come
from the history (the stack of the allocation that made it), so blocks
allocated before the oldest entry still in the ring have none.

Reading, checking and building snapshot files needs no torch:
torchmem.formats.snapshot_format.
"""
from __future__ import annotations

import atexit
import os
import pickle
from typing import Any

from torchmem import _core
from torchmem.runtime.devices import caching_allocator, device_name
from torchmem.formats.snapshot_format import build_snapshot

__all__ = ["dump_snapshot", "memory_snapshot", "record_memory_history"]

DEFAULT_MAX_ENTRIES = 100_000

# What record_memory_history() last set, per device ("cpu", 0) / ("cuda", N).
_recording: dict[tuple, dict] = {}
_OFF = {"mode": None, "stacks": None, "max_entries": 0}


def _device_key(device: Any) -> tuple[str, int]:
    name = device_name(device)
    return ("cpu", 0) if name == "cpu" else ("cuda", int(name[5:]))


def record_memory_history(
    enabled: str | None = "all",
    max_entries: int = DEFAULT_MAX_ENTRIES,
    stacks: str | None = "python",
    device: Any = None,
) -> None:
    """Start or stop recording allocator events, like torch.cuda.memory._record_memory_history.

    Args:
        enabled: "all" records every event (device_traces) and the stack of
            each live block; "state" keeps only what the blocks' frames need
            (snapshots have empty device_traces); None stops recording and
            drops what was recorded.
        max_entries: size of the ring buffer of events.
        stacks: "python" tags each allocation with the Python stack (file,
            line, function) that made it; None records events without stacks.
            "all" (PyTorch's default, Python and C++ frames) is taken as
            "python": torchmem records no C++ frames.
        device: the device whose allocator records (None or "cpu").
    """
    if enabled not in ("all", "state", None):
        raise ValueError(f"enabled must be 'all', 'state' or None, not {enabled!r}")
    if stacks not in ("python", "all", None):
        raise ValueError(f"stacks must be 'python' (or 'all', the same here) or None, not {stacks!r}")
    if enabled is not None and (isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries <= 0):
        raise ValueError(f"max_entries must be a positive int, not {max_entries!r}")
    allocator = caching_allocator(device)
    key = _device_key(device)
    if allocator is None:
        if enabled is None:
            return
        raise RuntimeError("torchmem is not installed: call torchmem.install() before record_memory_history()")
    if enabled is None:
        _core.enable_history(allocator, 0)
        _recording.pop(key, None)
        return
    table = _core.StackTable() if stacks in ("python", "all") else None
    _core.enable_history(allocator, int(max_entries), table)
    _recording[key] = {"mode": enabled, "stacks": table, "max_entries": int(max_entries)}


@atexit.register
def _stop_at_exit() -> None:
    # Stacks are captured with the interpreter's help: stop before it goes.
    for kind, index in list(_recording):
        try:
            allocator = caching_allocator("cpu" if kind == "cpu" else f"{kind}:{index}")
            if allocator is not None:
                _core.enable_history(allocator, 0)
        except Exception:  # pragma: no cover - nothing to stop
            pass
    _recording.clear()


def memory_snapshot(device: Any = None) -> dict:
    """The allocator's segments, blocks and history as torch.cuda.memory._snapshot() gives them."""
    allocator = caching_allocator(device)
    key = _device_key(device)
    if allocator is None:
        return build_snapshot([], [], settings={"backend": "torchmem", "installed": False})
    recording = _core.history_enabled(allocator)  # False after install() made a fresh allocator
    state = _recording.get(key, _OFF) if recording else _OFF
    entries = _core.history_entries(allocator) if recording else []
    segments = allocator.segments()
    table = state["stacks"]
    return build_snapshot(
        segments,
        entries,
        frames_of=table.frames if table is not None else None,
        include_traces=recording and state["mode"] != "state",
        device=key[1],
        settings={**allocator.allocator_settings, "backend": "torchmem", "conf": allocator.config,
                  "device": allocator.device},
    )


def dump_snapshot(path: str | os.PathLike, snapshot: dict | None = None) -> None:
    """Write memory_snapshot() (or `snapshot`) as a pickle, like torch.cuda.memory._dump_snapshot."""
    data = memory_snapshot() if snapshot is None else snapshot
    with open(path, "wb") as f:
        pickle.dump(data, f)
