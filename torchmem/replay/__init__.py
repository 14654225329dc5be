"""Replay allocation traces on a simulated GPU: exactly as recorded, or under other settings.

``replay()`` runs a trace (a snapshot written on a GPU, JSON lines, or event
dicts) through torchmem's caching allocator on a simulated device;
``advise()`` finds the settings under which it fits in the least memory;
``min_capacity(trace, conf)`` the least memory one config needs.
"""
from torchmem.replay.runner import (
    MAX_TIMELINE_POINTS,
    ReplayResult,
    as_trace,
    compare,
    normalize_conf,
    parse_capacity,
    replay,
)
from torchmem.replay.snapshot_trace import RecordedRun, recorded_conf, snapshot_trace
from torchmem.replay.start_state import StartState
from torchmem.formats.trace_types import Trace, TraceError
from torchmem.formats.traces import from_events
from torchmem.replay.trace_files import load_trace

__all__ = [
    "MAX_TIMELINE_POINTS", "RecordedRun", "ReplayResult", "StartState", "Trace", "TraceError", "as_trace", "compare",
    "from_events", "load_trace", "normalize_conf", "parse_capacity", "recorded_conf", "replay", "snapshot_trace",
]
from torchmem.replay.advise import STITCH, Advice, advise, candidates, min_capacity  # noqa: E402

__all__ += ["STITCH", "Advice", "advise", "candidates", "min_capacity"]
