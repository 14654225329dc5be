"""Runs of segment releases in a trace, and who made them: the allocator or the program.

A run of segment_free / segment_unmap entries that a new segment follows
is the allocator's own (a retry after a failed device allocation, its
release of oversize blocks under max_split_size_mb, or the garbage
collector) or the program's (empty_cache(), a CUDA graph's or MemPool's
pool dying) followed by a request. retries.py counts PyTorch's retries
from these runs; snapshot_trace.py builds them.
"""
from __future__ import annotations

from typing import NamedTuple

ALLOCATOR, PROGRAM = "allocator", "program"


NO_SEGMENT = -1  # a run's new segment in the trace pass where its retry made none (TracePass.retry_without_segment)


class ReleaseRun(NamedTuple):
    """One run of releases that a new segment followed."""

    reserved_before: int      # reserved when the run began, relative to the start of recording
    new_segment: int          # what the segment that followed asked of the device (its request's alloc_size)
    sizes: list[int]          # the sizes released, in order
    streams: list[int]        # the streams of the segments released, in order
    stream: int               # the new segment's stream
    private: bool             # a private pool's segment was among them (a pool that died)
    origin: str | None        # release_origin(): ALLOCATOR, PROGRAM, or None (no stacks recorded)
    position: int = 0         # the event position of the new segment (of the allocation, where it made none)
    unmapped: bool = False    # some of the releases unmapped pages of an expandable range


def python_stack(entry: dict) -> tuple | None:
    """The Python frames (filename, line, name) of a trace entry's stack; None where none was recorded
    (context=None, a free under context="alloc", or a replay's load, which drops stacks)."""
    frames = entry.get("frames")
    if not isinstance(frames, list):
        return None
    stack = tuple((f.get("filename"), f.get("line"), f.get("name")) for f in frames
                  if isinstance(f, dict) and str(f.get("filename", "")).endswith(".py"))
    return stack or None


def release_origin(release: tuple | None, new_segment: tuple | None) -> str | None:
    """Who released a run of segments that a new segment followed, by their Python stacks.

    The allocator (ALLOCATOR) releases inside the request that then makes the
    segment: a retry, its release of oversize blocks, or the garbage
    collector, all under that request's Python stack. Another stack is the
    program's (PROGRAM): empty_cache(), or a graph or MemPool dying. None
    where either stack was not recorded.
    """
    if release is None or new_segment is None:
        return None
    return ALLOCATOR if release == new_segment else PROGRAM
