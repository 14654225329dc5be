"""The allocation retries a recording implies, for a replay that follows it.

PyTorch counts num_alloc_retries when, after a failed device allocation, it
has released every unsplit cached segment and allocates again (the third
step of DeviceCachingAllocator::malloc; the second step, which releases only
blocks of max_split_size or more, counts nothing). A replay that follows a
recording makes the recorded releases itself, before allocating, so its
allocator never fails first and counts no retry: this module counts, from
the runs of releases the allocator made before a new segment, the retries
PyTorch made.

- Without max_split_size the second step does nothing: every such run is a
  retry.
- With it, the second step frees one cached oversize segment (max_split_size
  or more) of the request's stream and pool big enough for the request (so
  never for a small request: the small pool holds no such block), or else its
  stream's oversize segments from the largest down until they add up to
  the request; the third frees every unsplit cached segment. A run that
  released what the second step alone would have (one segment of the
  stream at least the request's size, or the stream's segments in falling
  sizes that reach the request's only with the last) is taken as the second
  step (no retry); any other run was the third. The second step never
  unmaps an expandable range's pages (release_available_cached_blocks skips
  them), so a run that unmaps under the request's own stack is the third.
  Without stacks, a run that unmaps oversize pages only is taken as no
  retry; with expandable segments, a run of oversize fixed segments alone
  (a private pool's) is taken as the second step.
- Where the trace records Python stacks (PyTorch's default, context="all"),
  a run under the stack of the request that made the new segment was the
  allocator's, and any other stack is the program's (empty_cache(), a pool
  dying): release_runs.release_origin. Without garbage_collection_threshold
  the allocator releases only after a failed device allocation, so its run
  is a retry even where the card seems to have had room (a memory fraction
  the program set is not in the snapshot). A free that completes in the middle
  of a run under its stack (the full release first completes the frees
  waiting on events) does not end the run.
- Without stacks, a program's empty_cache() followed by a new segment looks
  the same in the trace. Either way a run is a retry only where the
  allocator could not have made the new segment beside what was reserved
  before the run: over the card's memory (known from a recorded OOM;
  without one, the card holds at least
  the most the recording held, and a run over that is taken as a retry,
  unless it released a private pool's segments, as a dying pool does) or
  over a memory fraction's limit (memory_limit.py).
- The new segment asks the device for its request's alloc_size (for a map of
  an expandable range, the request's, not the pages mapped).
- Under garbage_collection_threshold (with a memory fraction) the collector
  releases first, when reserved memory is over its threshold of the
  fraction's limit, at least down to the threshold: a run is a retry only
  where that would not have made room. Where these rules guess wrong is an
  open deviation (retry-count, docs/fakegpu.md).

snapshot_trace.py places a RECORDED_RETRY event before the new segment of
each run taken as a retry; the replayer counts those that it reaches when it
follows the recording (kRecordedRetry, csrc/core/replay/replayer.h). PyTorch
searched its cache before the releases, so the request after the event skips
its search: a release can leave a block that the request would take (the
partial pages left at the ends of an unmapped oversize block, or a free
completed inside the release).
"""
from __future__ import annotations

from torchmem import _core
from torchmem.replay.memory_limit import conf_fraction
from torchmem.replay.release_runs import ALLOCATOR, PROGRAM, ReleaseRun


def retry_runs(runs: list[ReleaseRun], conf: str, start_reserved: int, peak_reserved: int, card: int,
               card_known: bool, fraction_inferred: bool, limit_low: int | None, held: int = 0) -> list[ReleaseRun]:
    """The runs of releases behind which the recording's allocator retried.

    The most the allocator could reserve: the card less what others `held`
    (where an OOM told it: card_known; else at least the most the recording
    held, `peak_reserved`), or a memory fraction's limit when lower (a share
    of the card; for an inferred fraction its lowest, `limit_low`, the
    trace's bound).
    """
    most = card - held if card_known else peak_reserved
    fraction = conf_fraction(conf)
    collector = None
    if fraction is not None and fraction < 1.0:
        collector = int(fraction * float(card))
        limit = limit_low if fraction_inferred else collector
        most = min(most or card, limit or card)
    return recorded_retries(runs, conf, start_reserved, most, collector, card_known)


def recorded_retries(retry_releases: list[ReleaseRun], conf: str, start_reserved: int,
                     capacity: int | None, collector_limit: int | None = None,
                     card_known: bool = True) -> list[ReleaseRun]:
    """The recorded runs of releases behind which PyTorch counted a retry.

    `capacity` is the most the allocator could reserve: the card's memory
    where a recorded OOM tells it (card_known; else the most the recording
    held: a lower bound), or a memory fraction's limit when lower; None
    counts none. `collector_limit`: the memory fraction's limit, when
    garbage_collection_threshold acts on it.
    """
    settings = _core.rules.config_fields(conf or "")
    max_split = settings["max_split_size"]
    threshold = _collector_threshold(settings, collector_limit)
    retried = []
    expandable = settings["expandable_segments"]
    for run in retry_releases:
        before = start_reserved + run.reserved_before
        # Under the request's own stack and with no collector in the settings, only a failed device
        # allocation makes the allocator release: a retry, whatever the card's room seemed (a fraction
        # the program set is not in the snapshot).
        failed = run.origin == ALLOCATOR and not settings["garbage_collection_threshold"]
        if run.origin == PROGRAM or (not failed and (capacity is None or before + run.new_segment <= capacity)):
            continue  # the program's (its stack says so), or the card had room: no request failed
        if run.origin is None and run.private and not card_known:
            continue  # a private pool's segments, released when the pool died
        if threshold is not None and before > threshold:
            # The collector ran first and released at least what took reserved memory back to its
            # threshold (or the whole run): if that made room, the allocator did not retry.
            collected = min(before - threshold, sum(run.sizes))
            if before - collected + run.new_segment <= capacity:
                continue
        if max_split is None or not _second_step(run, max_split, expandable):
            retried.append(run)
    return retried


def unsettled_runs(runs: list[ReleaseRun], conf: str, fraction_configured: bool) -> list[ReleaseRun]:
    """The runs whose count the snapshot cannot settle (retry-count, docs/fakegpu.md).

    Without stacks, any run may have been the allocator's retry or the
    program's empty_cache(), counted or not (a fraction the program set, not
    in the snapshot, refuses where the card seems to have room). Under
    garbage_collection_threshold with a fraction the settings do not hold
    (one the program set, inferred or unknown), any run of the allocator's
    may have been the collector's.
    tests/support/indistinguishable.py holds a pair of native runs for each.
    """
    if _core.rules.config_fields(conf or "")["garbage_collection_threshold"] and not fraction_configured:
        return [run for run in runs if run.origin != PROGRAM]
    return [run for run in runs if run.origin is None]


def _second_step(run: ReleaseRun, max_split: int, expandable: bool) -> bool:
    """Whether release_available_cached_blocks alone made this run (see the module's docstring)."""
    if run.new_segment == _core.rules.SMALL_BUFFER:
        return False  # it searches the request's pool, and the small pool has no block of max_split_size
    if any(size < max_split for size in run.sizes):
        return False
    if run.unmapped:
        # The second step releases whole fixed segments only: under the request's own stack an unmap was the
        # full release. Without stacks such a run is taken as the program's empty_cache(), the guess the
        # oracle finds right more often; the snapshot cannot tell (retry-count).
        return run.origin is None
    if expandable:
        return True
    if any(stream != run.stream for stream in run.streams):
        return False
    need = max(max_split, run.new_segment)  # the request's size, to within the 2 MiB a large segment rounds up
    if len(run.sizes) == 1:
        return run.sizes[0] >= need
    falling = all(a >= b for a, b in zip(run.sizes, run.sizes[1:]))
    return falling and sum(run.sizes[:-1]) < need <= sum(run.sizes)


def _collector_threshold(settings: dict, limit: int | None) -> int | None:
    """garbage_collection_threshold's bytes under a memory limit (None: no collector acts)."""
    value = settings["garbage_collection_threshold"]
    return int(value * limit) if value and limit is not None else None
