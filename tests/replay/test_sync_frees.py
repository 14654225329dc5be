"""Frees that complete inside a request's full release (Note [Frees completed at a release], sync_frees.py).

The trace pass turns a free_completed of a block whose free was requested
earlier (record_stream) into FREE_AT_SYNC only where it lies directly before
an OOM entry. The native case (a cached block that fitted the failed
request, completed by PyTorch's synchronize_and_free_events) is
tests/fakegpu/fixed/sync-free-before-oom.json, run on the fake GPU.
"""
from __future__ import annotations

from torchmem.replay.trace_pass import BadEntries, run_pass
from torchmem.formats.trace_types import FREE, FREE_AT_SYNC

MiB = 1 << 20
BASE = 0x7F0000000000


def _frames(line: int) -> list[dict]:
    return [{"filename": "train.py", "line": line, "name": "step"}]


def _trace(free_line: int = 7, oom_line: int = 7) -> list[dict]:
    """A 100 MiB segment with a 70 MiB block freed while stream 1 used it (its free completes after another
    allocation), then a 30 MiB request that fails."""
    return [
        {"action": "segment_alloc", "addr": BASE, "size": 100 * MiB, "stream": 0},
        {"action": "alloc", "addr": BASE, "size": 70 * MiB, "stream": 0, "frames": _frames(3)},
        {"action": "alloc", "addr": BASE + 70 * MiB, "size": 30 * MiB, "stream": 0, "frames": _frames(4)},
        {"action": "free_requested", "addr": BASE, "size": 70 * MiB, "stream": 0, "frames": _frames(5)},
        {"action": "segment_alloc", "addr": BASE + 100 * MiB, "size": 2 * MiB, "stream": 0},
        {"action": "alloc", "addr": BASE + 100 * MiB, "size": MiB, "stream": 0, "frames": _frames(6)},
        {"action": "free_completed", "addr": BASE, "size": 70 * MiB, "stream": 0, "frames": _frames(free_line)},
        {"action": "oom", "size": 30 * MiB, "device_free": 0, "stream": 0, "frames": _frames(oom_line)},
    ]


def _op_of_free(entries: list[dict]) -> int:
    """The event the pass wrote for the free_completed of the 70 MiB block."""
    events = run_pass(entries, BadEntries("trace", 0, skip=False)).events
    at = next(i for i, e in enumerate(entries) if e["action"] == "free_completed")
    return next(op for op, entry in zip(events.ops, events.entries) if entry == at)


def test_a_free_directly_before_an_oom_completes_at_the_release():
    assert _op_of_free(_trace()) == FREE_AT_SYNC


def test_a_free_with_a_request_between_stays_a_free():
    """An allocation between the free and the OOM: the free completed before that request, which could use it."""
    trace = _trace()
    small = trace.pop(5)
    trace.insert(len(trace) - 1, small)  # the 1 MiB allocation, now between the free and the OOM
    assert _op_of_free(trace) == FREE


def test_a_free_before_a_release_stays_a_free():
    """A release between: a replay that follows the recording makes it before the request, after the free."""
    trace = _trace()
    trace.insert(len(trace) - 1, {"action": "segment_free", "addr": BASE + 200 * MiB, "size": 2 * MiB, "stream": 0,
                                  "frames": _frames(7)})
    trace.insert(0, {"action": "segment_alloc", "addr": BASE + 200 * MiB, "size": 2 * MiB, "stream": 0})
    assert _op_of_free(trace) == FREE


def test_a_free_under_another_stack_stays_a_free():
    """Recorded stacks that differ: the free completed in an earlier call of the program, not in the request."""
    assert _op_of_free(_trace(free_line=6, oom_line=7)) == FREE


def test_a_free_completed_with_its_request_stays_a_free():
    """free_requested directly followed by its free_completed: a plain free, which no release completed."""
    trace = _trace()
    request = trace.pop(3)
    trace.insert(len(trace) - 2, request)  # the free_requested, now directly before its free_completed
    assert _op_of_free(trace) == FREE
