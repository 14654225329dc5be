"""Any trace file users give, as the replay's Trace: JSON lines read by torchmem.formats.traces, snapshots
(pickles or one JSON object) read by torchmem.formats.input_files, whose events the replay infers
(torchmem.replay.snapshot_trace: the start state, recorded addresses, the OOM)."""
from __future__ import annotations

import mmap
import os

from torchmem.formats.input_files import JSONL, PICKLE, file_format, load_snapshot_json, load_snapshot_pickle, open_head
from torchmem.formats.safe_pickle import gc_paused
from torchmem.formats.trace_types import Trace, TraceError
from torchmem.formats.traces import load_jsonl
from torchmem.replay.snapshot_trace import snapshot_trace


def load_trace(path: str, device: int | None = None, skip_bad_events: bool = False) -> Trace:
    """Any supported trace file, by its content (input_files.py).

    Snapshots (pickles, read as data only, or one JSON object) replay one
    device: `device`, or by default the device with an OOM, else the one
    with the most history (torchmem.formats.snapshot_devices).
    """
    path = os.fspath(path)
    fmt = file_format(path, open_head(path))
    if fmt == JSONL:
        if device is not None:
            raise TraceError(f"{path}: JSON lines hold one device; --device applies to snapshots only")
        return load_jsonl(path, skip_bad_events)
    with gc_paused():  # millions of entries are built and read: see gc_paused
        # A replay needs no stacks: the pickle's frames lists are not even built...
        snapshot = load_snapshot_pickle(path, without_frames=True) if fmt == PICKLE else load_snapshot_json(path)
        trace = snapshot_trace(snapshot, path, device, skip_bad_events)
        if fmt == PICKLE and trace.recorded is not None and trace.recorded.retry_releases and _has_stacks(path):
            # ...except to tell who released segments before a new one: the allocator's retry, or the
            # program's empty_cache() (release_runs.release_origin). Rare: the file is read again, whole.
            del snapshot, trace
            trace = snapshot_trace(load_snapshot_pickle(path), path, device, skip_bad_events)
        return trace


def _has_stacks(path: str) -> bool:
    """Whether a snapshot pickle holds any stack frame (PyTorch names each frame's "filename")."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        return data.find(b"filename") >= 0
