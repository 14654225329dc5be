"""A failed map's own release (Note [A failed map's own release], trace_pass.py).

The releases that come after a request's first map, before its alloc or OOM
entry, are listed as the request's own. The native case (a request that
mapped pages, released the cache and failed) is
tests/fakegpu/fixed/expandable-failed-map.json, run on the fake GPU.
"""
from __future__ import annotations

from torchmem.replay.trace_pass import BadEntries, run_pass
from torchmem.formats.trace_types import RELEASE_SEGMENT

MiB = 1 << 20
RANGE = 0x7F0000000000  # stream 0's range
OTHER = 0x7F4000000000  # stream 1's range


def _map(addr: int, size: int, stream: int) -> dict:
    return {"action": "segment_map", "addr": addr, "size": size, "stream": stream}


def _unmap(addr: int, size: int, stream: int) -> dict:
    return {"action": "segment_unmap", "addr": addr, "size": size, "stream": stream}


def _start() -> list[dict]:
    """Stream 0 maps 40 MiB and caches a 30 MiB block there."""
    return [_map(RANGE, 40 * MiB, 0), {"action": "alloc", "addr": RANGE, "size": 30 * MiB, "stream": 0},
            {"action": "free_completed", "addr": RANGE, "size": 30 * MiB, "stream": 0}]


def _released(entries: list[dict]) -> tuple[list[int], list[int]]:
    """The trace entries of the pass's request releases, and of all its releases."""
    p = run_pass(entries, BadEntries("trace", 0, skip=False))
    own = [p.events.entries[pos] for pos in p.request_releases]
    every = [e for op, e in zip(p.events.ops, p.events.entries) if op == RELEASE_SEGMENT]
    return own, every


def test_releases_after_a_map_before_an_oom_are_the_requests():
    trace = _start() + [_map(OTHER, 60 * MiB, 1), _unmap(RANGE, 40 * MiB, 0), _unmap(OTHER, 60 * MiB, 1),
                        {"action": "oom", "size": 500 * MiB, "device_free": 0, "stream": 1}]
    assert _released(trace) == ([4, 5], [4, 5])


def test_releases_between_maps_of_a_request_that_succeeds_are_its_own():
    trace = _start() + [_map(OTHER, 60 * MiB, 1), _unmap(RANGE, 40 * MiB, 0), _map(OTHER + 60 * MiB, 20 * MiB, 1),
                        {"action": "alloc", "addr": OTHER, "size": 80 * MiB, "stream": 1}]
    assert _released(trace) == ([4], [4])


def test_releases_before_a_requests_first_map_stay_where_they_are():
    """The program's empty_cache(), or a retry before any map: made before the request, as recorded."""
    trace = _start() + [_unmap(RANGE, 40 * MiB, 0), _map(OTHER, 80 * MiB, 1),
                        {"action": "alloc", "addr": OTHER, "size": 80 * MiB, "stream": 1}]
    assert _released(trace) == ([], [3])


def test_a_map_served_by_its_allocation_ends_the_request():
    trace = _start() + [_map(OTHER, 20 * MiB, 1), {"action": "alloc", "addr": OTHER, "size": 20 * MiB, "stream": 1},
                        {"action": "free_completed", "addr": OTHER, "size": 20 * MiB, "stream": 1},
                        _unmap(OTHER, 20 * MiB, 1)]
    assert _released(trace) == ([], [6])
