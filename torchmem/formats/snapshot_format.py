"""PyTorch's snapshot format: reading a snapshot file (load), checking it
(validate_snapshot), and building one from the core's segments and history
(build_snapshot, snapshot_from_replay). No torch: the command line's tools
read snapshots with it. Recording one is torchmem.runtime.snapshot's.
"""
from __future__ import annotations

import os
from typing import Any, Callable

from torchmem.formats.trace_types import MEMORY_ACTIONS, SNAPSHOT_ACTIONS, TraceError, short_repr, unknown_action
from torchmem.formats.input_files import read_snapshot
from torchmem.formats.safe_pickle import gc_paused

__all__ = ["block_state", "build_snapshot", "load", "snapshot_from_replay", "validate_snapshot"]

BLOCK_STATES = ("active_allocated", "active_pending_free", "inactive")


def block_state(block: dict[str, Any]) -> str:
    """A block's state as PyTorch's snapshots name it, from a snapshot's block or a replay's
    (which says allocated and active: active but not allocated is a free awaiting its streams)."""
    if "allocated" not in block:
        return block["state"]
    if block["allocated"]:
        return "active_allocated"
    return "active_pending_free" if block.get("active") else "inactive"
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
    """A PyTorch-format snapshot from _core segments and _core history entries."""
    frames = _cached_frames(frames_of or (lambda _context: []))
    alloc_context, pending = _live_alloc_contexts(entries)
    out_segments = [_snapshot_segment(seg, device, alloc_context, pending, frames) for seg in segments]
    trace = [_trace_entry(e, frames) for e in entries] if include_traces else []
    traces = [[] for _ in range(device)] + [trace]  # device_traces is indexed by device
    snapshot = {"segments": out_segments, "device_traces": traces, "allocator_settings": dict(settings or {})}
    return snapshot


def _cached_frames(frames_of: Callable[[int], list]) -> Callable[[int], list]:
    """`frames_of` asked once per context, and no frames for context 0."""
    frame_cache: dict[int, list] = {}

    def frames(context: int) -> list:
        if not context:
            return []
        if context not in frame_cache:
            frame_cache[context] = frames_of(context)
        return frame_cache[context]

    return frames


def _live_alloc_contexts(entries: list[dict]) -> tuple[dict[int, int], set[int]]:
    """The context of each live allocation, and the blocks whose free was requested but not completed yet."""
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
    return alloc_context, pending


def _snapshot_segment(seg: dict, device: int, alloc_context: dict[int, int], pending: set[int],
                      frames: Callable[[int], list]) -> dict:
    """One _core segment as a PyTorch snapshot's segment, with its blocks."""
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
    return {
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
    }


def _trace_entry(e: dict, frames: Callable[[int], list]) -> dict:
    """One _core history entry as a PyTorch snapshot's trace entry."""
    entry = {"action": e["action"], "size": e["size"], "stream": e["stream"], "time_us": e["time_us"],
             "frames": frames(e["context"]) if e["action"] == "alloc" else []}
    if e["action"] == "oom":
        entry["device_free"] = e["addr"]  # PyTorch's OOM entries carry the free bytes, not an address
    else:
        entry["addr"] = e["addr"]
    return entry


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
    if not isinstance(value, typ) or isinstance(value, bool):
        name = typ.__name__ if isinstance(typ, type) else " or ".join(t.__name__ for t in typ)
        raise TraceError(f"{where}: field {key!r} should be {name}, got {type(value).__name__} {short_repr(value)}")
    if isinstance(value, int) and not 0 <= value < INT_LIMIT and key != "time_us":
        raise TraceError(f"{where}: field {key!r} is {value:,}, outside 0 to 2**62")
