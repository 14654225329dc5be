"""Opening the files users give: one reader for every command.

Every command that reads a snapshot (``replay``, ``advise``, ``ranks``,
``stats``, ``plot``, ``viz``) and ``sim.replay()`` read it here, so they
accept the same formats and say the same things about a bad file:

- a pickle (``torch.cuda.memory._dump_snapshot()``, ``torchmem.dump_snapshot()``,
  ``torchmem.dump_on_oom()``), read as data only (safe_pickle.py: a pickle
  that names code or a class is refused and nothing runs);
- the same dict saved as one JSON object;
- JSON lines of events (``{"op": "alloc", "id": 7, "size": 4096}``), a
  trace without segments: ``replay`` and ``advise`` read them.

Errors name the file and say what is wrong in one line: a missing file
(FileNotFoundError), a directory (IsADirectoryError), no permission
(PermissionError), an empty or unknown file, a damaged, truncated or
hostile pickle, JSON that is not a snapshot (TraceError).
"""
from __future__ import annotations

import json
import os
import re
from typing import Any

from torchmem.formats.safe_pickle import DamagedPickleError, UnsafePickleError, load_plain
from torchmem.formats.trace_types import TraceError

PICKLE, JSON_SNAPSHOT, JSONL = "pickle", "json", "jsonl"

# For each command's --help.
SNAPSHOT_FORMATS = ("a memory snapshot: a pickle from torch.cuda.memory._dump_snapshot() or "
                    "torchmem.dump_snapshot() (read as data only, never run), or the same snapshot as one JSON object")
TRACE_FORMATS = SNAPSHOT_FORMATS + ', or JSON lines of events {"op": "alloc"|"free", "id": N, "size": BYTES, "stream": S}'

_JSON_SNAPSHOT = re.compile(rb'\A\s*\{\s*("(segments|device_traces|allocator_settings|external_annotations)"|\Z|\n)')


def open_head(path: str | os.PathLike, size: int = 4096) -> bytes:
    """The first bytes of a file the user named; one-line errors for the usual ways it cannot be read."""
    path = os.fspath(path)
    if not os.path.lexists(path):
        raise FileNotFoundError(f"{path}: no such file")
    if os.path.isdir(path):
        raise IsADirectoryError(f"{path}: a directory, not a file")
    try:
        with open(path, "rb") as f:
            head = f.read(size)
    except PermissionError:
        raise PermissionError(f"{path}: permission denied (the file cannot be read by this user)") from None
    except FileNotFoundError:  # a dangling symbolic link
        raise FileNotFoundError(f"{path}: no such file (a link to a missing file)") from None
    except OSError as exc:
        raise OSError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if not head.strip():
        raise TraceError(f"{path}: empty file")
    return head


def file_format(path: str, head: bytes) -> str:
    """PICKLE, JSON_SNAPSHOT or JSONL, by content; TraceError for anything else."""
    start = head.lstrip()
    if head[:1] == b"\x80":
        return PICKLE
    if _JSON_SNAPSHOT.match(head):
        return JSON_SNAPSHOT
    if start[:1] == b"{":
        return JSONL
    raise TraceError(f"{path}: unknown format: not a pickle, a JSON snapshot or JSON lines of events (expected {TRACE_FORMATS})")


def read_snapshot(path: str | os.PathLike) -> dict:
    """A snapshot from a pickle or a JSON file, not yet checked field by field (snapshot_format.validate_snapshot)."""
    path = os.fspath(path)
    fmt = file_format(path, open_head(path))
    if fmt == JSONL:
        raise TraceError(f"{path}: JSON lines of events, not a snapshot: this command needs a snapshot "
                         "(replay and advise also read JSON lines)")
    return load_snapshot_pickle(path) if fmt == PICKLE else load_snapshot_json(path)


def load_snapshot_pickle(path: str, without_frames: bool = False) -> dict:
    """A snapshot pickle, as data only; errors name the file and what is wrong.

    `without_frames`: every ``frames`` list comes back empty, never built
    (what a replay needs: the stacks are most of a big snapshot).
    """
    try:
        data = load_plain(path, "frames" if without_frames else None)
    except UnsafePickleError as exc:
        raise TraceError(f"{path}: refused to load: {exc}; torchmem reads only plain data from a pickle, "
                         "nothing in it is run") from None
    except DamagedPickleError as exc:
        raise TraceError(f"{path}: not a readable snapshot pickle: {exc}") from None
    except MemoryError:
        raise TraceError(f"{path}: not enough memory to read this pickle") from None
    except OSError as exc:
        raise OSError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    except Exception as exc:  # what the unpickler raises for a damaged file (EOFError, ValueError, ...)
        raise TraceError(f"{path}: not a readable snapshot pickle ({type(exc).__name__}: {_short(exc)}); "
                         "truncated file?") from None
    if not isinstance(data, dict) or "segments" not in data:
        raise TraceError(f"{path}: a pickle, but not a memory snapshot (expected a dict with 'segments' and "
                         "'device_traces')")
    return data


def load_snapshot_json(path: str) -> dict:
    """A snapshot saved as one JSON object; errors name the file."""
    try:
        with open(path, "rb") as f:
            data = json.load(f)
    except json.JSONDecodeError as exc:
        raise TraceError(f"{path}: not a readable JSON snapshot ({exc.msg} at line {exc.lineno}); "
                         "truncated file?") from None
    except UnicodeDecodeError:
        raise TraceError(f"{path}: not UTF-8 text") from None
    except RecursionError:
        raise TraceError(f"{path}: JSON nested too deeply to be a snapshot") from None
    except MemoryError:
        raise TraceError(f"{path}: not enough memory to read this JSON file") from None
    if not isinstance(data, dict) or "segments" not in data:
        raise TraceError(f"{path}: JSON, but not a memory snapshot (expected an object with 'segments' and "
                         "'device_traces')")
    return data


def _short(exc: BaseException) -> str:
    text = str(exc).replace("\n", " ")
    return text if len(text) <= 120 else text[:117] + "..."
