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
"""
from __future__ import annotations

import atexit
import os
import pickle
from typing import Any, Callable

from torchmem import _C
from torchmem.devices import caching_allocator, device_name
from torchmem.trace_types import MEMORY_ACTIONS, SNAPSHOT_ACTIONS, TraceError, unknown_action

__all__ = [
    "block_state",
    "dump_snapshot",
    "load",
    "memory_snapshot",
    "record_memory_history",
    "snapshot_from_replay",
    "validate_snapshot",
]

BLOCK_STATES = ("active_allocated", "active_pending_free", "inactive")


def block_state(block: dict[str, Any]) -> str:
    """A block's state as PyTorch's snapshots name it, from a snapshot's block or a replay's
    (which says allocated and active: active but not allocated is a free awaiting its streams)."""
    if "allocated" not in block:
        return block["state"]
    if block["allocated"]:
        return "active_allocated"
    return "active_pending_free" if block.get("active") else "inactive"
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
        _C.enable_history(allocator, 0)
        _recording.pop(key, None)
        return
    table = _C.StackTable() if stacks in ("python", "all") else None
    _C.enable_history(allocator, int(max_entries), table)
    _recording[key] = {"mode": enabled, "stacks": table, "max_entries": int(max_entries)}


@atexit.register
def _stop_at_exit() -> None:
    # Stacks are captured with the interpreter's help: stop before it goes.
    for kind, index in list(_recording):
        try:
            allocator = caching_allocator("cpu" if kind == "cpu" else f"{kind}:{index}")
            if allocator is not None:
                _C.enable_history(allocator, 0)
        except Exception:  # pragma: no cover - nothing to stop
            pass
    _recording.clear()


def memory_snapshot(device: Any = None) -> dict:
    """The allocator's segments, blocks and history as torch.cuda.memory._snapshot() gives them."""
    allocator = caching_allocator(device)
    key = _device_key(device)
    if allocator is None:
        return build_snapshot([], [], settings={"backend": "torchmem", "installed": False})
    recording = _C.history_enabled(allocator)  # False after install() made a fresh allocator
    state = _recording.get(key, _OFF) if recording else _OFF
    entries = _C.history_entries(allocator) if recording else []
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


def snapshot_from_replay(result: Any) -> dict:
    """The snapshot of a sim.replay() result: its final segments, and its history if recorded.

    Replay with ``history=N`` to get device_traces (and so the timeline
    pictures); without it, the snapshot has the final segments only.
    """
    replayer = result.replayer
    entries = replayer.history() if replayer is not None else []
    settings = {"backend": "torchmem-sim", "conf": result.conf, "capacity": result.capacity,
                "in_use_by_others": result.in_use_by_others, "completed": result.completed}
    return build_snapshot(result.segments, entries, include_traces=True, settings=settings)


def build_snapshot(
    segments: list[dict],
    entries: list[dict],
    frames_of: Callable[[int], list] | None = None,
    include_traces: bool = True,
    device: int = 0,
    settings: dict | None = None,
) -> dict:
    """A PyTorch-format snapshot from _C segments and _C history entries."""
    frames_of = frames_of or (lambda _context: [])
    frame_cache: dict[int, list] = {}

    def frames(context: int) -> list:
        if not context:
            return []
        if context not in frame_cache:
            frame_cache[context] = frames_of(context)
        return frame_cache[context]

    # The context of each live allocation, and the blocks whose free was
    # requested but not completed yet.
    alloc_context: dict[int, int] = {}
    pending: set[int] = set()
    for e in entries:
        action = e["action"]
        if action == "alloc":
            alloc_context[e["addr"]] = e["context"]
            pending.discard(e["addr"])
        elif action == "free_requested":
            pending.add(e["addr"])
        elif action == "free_completed":
            pending.discard(e["addr"])
            alloc_context.pop(e["addr"], None)

    out_segments = []
    for seg in segments:
        blocks = []
        active_size = 0
        for b in seg["blocks"]:
            if b["allocated"] or b.get("active"):
                pending_free = not b["allocated"] or b["address"] in pending
                state = "active_pending_free" if pending_free else "active_allocated"
                active_size += b["size"]
                block_frames = frames(alloc_context.get(b["address"], 0))
                requested = b["requested_size"]
            else:
                state, block_frames, requested = "inactive", [], 0
            blocks.append({"address": b["address"], "size": b["size"], "requested_size": requested,
                           "state": state, "frames": block_frames})
        out_segments.append({
            "device": device,
            "address": seg["address"],
            "total_size": seg["total_size"],
            "stream": seg["stream"],
            "segment_type": seg["segment_type"],
            "segment_pool_id": tuple(seg.get("segment_pool_id", (0, 0))),
            "allocated_size": seg["allocated_size"],
            "active_size": active_size,
            "requested_size": seg["requested_size"],
            "is_expandable": seg["is_expandable"],
            "frames": [],
            "blocks": blocks,
        })

    trace = []
    if include_traces:
        for e in entries:
            entry = {"action": e["action"], "size": e["size"], "stream": e["stream"], "time_us": e["time_us"],
                     "frames": frames(e["context"]) if e["action"] == "alloc" else []}
            if e["action"] == "oom":
                entry["device_free"] = e["addr"]  # PyTorch's OOM entries carry the free bytes, not an address
            else:
                entry["addr"] = e["addr"]
            trace.append(entry)
    traces = [[] for _ in range(device)] + [trace]  # device_traces is indexed by device
    snapshot = {"segments": out_segments, "device_traces": traces, "allocator_settings": dict(settings or {})}
    return snapshot


# --- Reading ----------------------------------------------------------------

_SEGMENT_KEYS = {"address": int, "total_size": int, "stream": int, "segment_type": str, "blocks": list}
_BLOCK_KEYS = {"address": int, "size": int, "state": str}
_TRACE_KEYS = {"action": str, "size": int}
# Fields every reader may use when present: checked when present.
_OPTIONAL_KEYS = {"requested_size": int, "device": int, "stream": int, "device_free": int, "addr": int,
                  "time_us": (int, float), "frames": list}
# Addresses, sizes and streams are below 2**62, so that a sum of two stays below 2**63 (int64 everywhere).
INT_LIMIT = 2**62


def load(path: str | os.PathLike) -> dict:
    """Read and check a snapshot (PyTorch's or torchmem's): a pickle, read as data only, or one JSON object.

    Raises FileNotFoundError, IsADirectoryError or PermissionError naming the
    file, and TraceError, naming the file and what is wrong, for an empty,
    truncated, foreign or hostile file (a pickle that names code is refused
    and nothing in it runs: safe_pickle.py) or a snapshot whose fields are
    missing, of the wrong type, or have unknown values.
    """
    from torchmem.input_files import read_snapshot
    from torchmem.safe_pickle import gc_paused

    path = os.fspath(path)
    with gc_paused():
        return validate_snapshot(read_snapshot(path), path)


def validate_snapshot(data: Any, name: str = "snapshot") -> dict:
    """Check the fields every reader relies on; TraceError naming `name` and the field otherwise.

    Keys this reader does not know are accepted (PyTorch adds some in each
    release); unknown block states and trace actions are not.
    """
    if not isinstance(data, dict):
        raise TraceError(f"{name}: not a memory snapshot (a {type(data).__name__}, expected a dict with 'segments')")
    segments = data.get("segments")
    if not isinstance(segments, list):
        raise TraceError(f"{name}: 'segments' must be a list, not {type(segments).__name__}")
    for i, seg in enumerate(segments):
        where = f"{name}: segment {i}"
        _check_keys(seg, _SEGMENT_KEYS, where)
        if seg["segment_type"] not in ("small", "large"):
            raise TraceError(f"{where}: unknown segment_type {seg['segment_type']!r} (expected 'small' or 'large')")
        total = 0
        for j, block in enumerate(seg["blocks"]):
            bwhere = f"{where} block {j}"
            _check_keys(block, _BLOCK_KEYS, bwhere)
            if block["state"] not in BLOCK_STATES and block["state"] != "active_awaiting_free":
                raise TraceError(f"{bwhere}: unknown state {block['state']!r} (expected one of {', '.join(BLOCK_STATES)})")
            total += block["size"]
        if seg["blocks"] and total != seg["total_size"]:
            raise TraceError(f"{where}: blocks add up to {total} bytes but total_size is {seg['total_size']}")
    traces = data.get("device_traces", [])
    if not isinstance(traces, list):
        raise TraceError(f"{name}: 'device_traces' must be a list of lists, not {type(traces).__name__}")
    for d, device_trace in enumerate(traces):
        if not isinstance(device_trace, list):
            raise TraceError(f"{name}: device_traces[{d}] must be a list, not {type(device_trace).__name__}")
        for k, entry in enumerate(device_trace):
            where = f"{name}: device {d} entry {k}"
            if isinstance(entry, dict) and "action" in entry and not (isinstance(entry["action"], str)
                                                                      and entry["action"] in SNAPSHOT_ACTIONS):
                unknown_action(entry, where)  # a warning where it changes no memory, else TraceError
                _check_keys(entry, {"action": str}, where)
                continue
            _check_keys(entry, _TRACE_KEYS, where)
            if entry["action"] in MEMORY_ACTIONS and entry["action"] != "oom" and not isinstance(entry.get("addr"), int):
                raise TraceError(f"{where}: {entry['action']} without an integer 'addr'")
    return data


def _check_keys(obj: Any, keys: dict, where: str) -> None:
    if not isinstance(obj, dict):
        raise TraceError(f"{where}: expected a dict, got {type(obj).__name__}")
    for key, typ in keys.items():
        if key not in obj:
            raise TraceError(f"{where}: missing field {key!r}")
        _check_value(obj[key], key, typ, where)
    for key, typ in _OPTIONAL_KEYS.items():
        if key in obj and key not in keys:
            _check_value(obj[key], key, typ, where)


def _check_value(value: Any, key: str, typ: Any, where: str) -> None:
    from torchmem.input_files import short_repr

    if not isinstance(value, typ) or isinstance(value, bool):
        name = typ.__name__ if isinstance(typ, type) else " or ".join(t.__name__ for t in typ)
        raise TraceError(f"{where}: field {key!r} should be {name}, got {type(value).__name__} {short_repr(value)}")
    if isinstance(value, int) and not 0 <= value < INT_LIMIT and key != "time_us":
        raise TraceError(f"{where}: field {key!r} is {value:,}, outside 0 to 2**62")
