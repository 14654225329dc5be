"""Frees that PyTorch completed inside a request's full release, read from a trace.

Note [Frees completed at a release]
A block freed while other streams still use it (record_stream) is cached
only when their events complete: `free_requested` now, `free_completed`
later. PyTorch completes such frees at two points of a request: at its
start (process_events), before it searches the cache, and inside its full
release after a failed device allocation (release_cached_blocks first calls
synchronize_and_free_events), after the search missed. The trace writes the
same `free_completed` entries for both, under the request's Python stack.

A free completed inside the release could not serve the request that
released: PyTorch searched the cache before it. A replay that frees it
where the trace has it offers the block to that search, and where the block
fits it allocates where PyTorch ran out of memory. So the frees that come
directly before an OOM entry (nothing else between) become FREE_AT_SYNC: the
replay completes them where its allocator makes its own full release, or
after that request. Either way the request's search does not see them. A
free completed at the request's start did not fit it (PyTorch's search
missed with it cached), so deferring it changes nothing for that search.
Where the release gave segments back, the trace has those releases between
the frees and the OOM; a replay that follows the recording makes them
before the request, so the frees stay where they are, before them (the
release after them needs them cached, and the order is the trace's).
"""
from __future__ import annotations


class SyncFrees:
    """The two-step frees since the last request, which may have completed inside the next one's release."""

    def __init__(self) -> None:
        self.candidates: list[tuple[int, tuple | None]] = []  # (event position, Python stack)

    def freed(self, position: int, stack: tuple | None) -> None:
        """A free_completed of a block whose free was requested earlier: its FREE event is at `position`."""
        self.candidates.append((position, stack))

    def clear(self) -> None:
        """Anything else came between (a request, a release): the frees so far stay where they are."""
        self.candidates.clear()

    def at_oom(self, stack: tuple | None) -> list[int]:
        """The event positions of the frees before an OOM entry that complete at its release (under its
        Python stack, where both were recorded); then forgets them all."""
        positions = [p for p, s in self.candidates if s is None or stack is None or s == stack]
        self.candidates.clear()
        return positions
