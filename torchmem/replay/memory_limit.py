"""The memory fraction a recording ran under, from what its trace shows.

PyTorch's allocator refuses a new segment when the memory it reserves would
pass `fraction * the card's memory` (torch.cuda.set_per_process_memory_fraction,
or per_process_memory_fraction in PYTORCH_CUDA_ALLOC_CONF): in
DeviceCachingAllocator::alloc_block, `total_allocated_memory + alloc_size >
allowed_memory_maximum`, where alloc_size is what the request asks of the
device (get_allocation_size) and allowed_memory_maximum is
`size_t(fraction * total)`. A snapshot records the config string but not a
fraction set through the API, nor the limit; its trace bounds the limit:

- every segment made (segment_alloc, or segment_map of an expandable range)
  passed the check: limit >= reserved before it + the request's alloc_size
  (for a map, the request is the allocation that follows it; its size,
  unrounded, gives a lower bound of alloc_size);
- every OOM at which the card still had room for alloc_size (device_free,
  recorded at the failure, was at least alloc_size) failed the check:
  limit < reserved at the OOM + alloc_size; with expandable segments the
  device is asked for whole pages, up to alloc_size rounded up to the page,
  so only an OOM with room for those tells (a 12 MiB request on a card with
  12 MiB free needs a 20 MiB page, and the card refused it); a free block
  below the request's gap lowers that need, and range_room.py works out the
  bytes its maps take (Placement.map_bytes); where the trace's maps do not
  tell them, an OOM with room for the request but not its whole pages is
  listed as untold;
- so did every request that released the cache and retried, under its own
  Python stack, where the card had room (refused_retries);
- so did, with expandable segments, every failed request that would have
  reserved a range that the trace shows it did not reserve
  (FailureOffers.unreserved, expandable_ranges.py).

`infer_fraction()` returns the fraction to replay with: the config's when it
fits these bounds, else the highest that does, else none. Any fraction inside
the bounds makes the refusals the trace shows; the highest is the one that
never runs garbage collection (garbage_collection_threshold * limit) where
PyTorch did not: a replay that follows the recording makes the collector's
recorded releases itself, so a limit above the real one loses nothing, and
one below it would release more. The card's memory comes from an OOM
(reserved + device_free): without one, a fraction set through the API cannot
be told from no fraction at all, and none is inferred.
"""
from __future__ import annotations

from dataclasses import dataclass
import math
from typing import Sequence

from torchmem import _core
from torchmem.replay.capacity import SMALL_PAGE, segment_request
from torchmem.replay.release_runs import ALLOCATOR, ReleaseRun


@dataclass(frozen=True)
class LimitBounds:
    """What a trace says about the limit: lo <= limit < hi (hi None: no refusal seen).

    `untold`: the OOMs (their positions in bounds()'s list) that bound it only
    if the request's range had free pages at its tail: the card had room for
    the request, not for all of its whole pages, and the bytes its maps take
    are not known (bounds()' map_bytes). Their bound is left out.
    """

    lo: int
    hi: int | None
    untold: tuple[int, ...] = ()


def bounds(creations: list[tuple[int, int]], ooms: list[tuple[int, int, int]],
           large_segment_size: int, refusals: list[tuple[int, int]] = (), maps_pages: bool = False,
           map_bytes: Sequence[int | None] = ()) -> LimitBounds:
    """The limit's bounds from a trace.

    `creations`: (reserved before, what it asked of the device) of every
    segment made (a segment's size; for a map, the alloc_size of the request
    that followed); `ooms`: (reserved at the OOM, the refused size,
    device_free) of every OOM; `refusals`: (reserved before, what it asked)
    of every request the limit refused before a retry made its segment
    (refused_retries); `maps_pages`: expandable segments, whose maps take
    whole pages; `map_bytes`: for each OOM, the bytes its maps would have
    taken from the card, where known (range_room.Placement.map_bytes).
    Reserved bytes are absolute (start state included).
    """
    lo = max((reserved + need for reserved, need in creations), default=0)
    hi = min((reserved + need for reserved, need in refusals), default=None)
    untold = []
    for k, (reserved, size, device_free) in enumerate(ooms):
        need = segment_request(size, large_segment_size)
        page = SMALL_PAGE if size <= _core.rules.SMALL_SIZE else large_segment_size
        known = map_bytes[k] if maps_pages and k < len(map_bytes) else None
        device_need = known if known is not None else -(-need // page) * page if maps_pages else need
        if device_free >= device_need:  # the card had room: the allocator's own limit refused
            hi = reserved + need if hi is None else min(hi, reserved + need)
        elif known is None and device_free >= need:
            untold.append(k)
    return LimitBounds(lo, hi, tuple(untold))


def refused_retries(runs: list[ReleaseRun], start_reserved: int, usable: int | None,
                    collects: bool) -> list[tuple[int, int]]:
    """(reserved before, what it asked) of each retry that only the limit can have refused.

    PyTorch releases its cache inside a request (a run under the request's
    own Python stack, release_runs.ALLOCATOR) only after a device allocation
    failed, but for the garbage collector (`collects`: a threshold is set),
    which releases before. Where the card had room for the request then
    (`usable`: what the process could hold, from an OOM), the limit refused
    it.
    """
    if usable is None or collects:
        return []
    out = []
    for run in runs:
        reserved = start_reserved + run.reserved_before
        if run.origin == ALLOCATOR and run.new_segment and reserved + run.new_segment <= usable:
            out.append((reserved, run.new_segment))
    return out


def limit_of(fraction: float, total: int) -> int:
    """The bytes a fraction allows on a card of `total` bytes, as PyTorch computes them."""
    return int(fraction * float(total))


def fits(fraction: float, total: int, b: LimitBounds) -> bool:
    limit = limit_of(fraction, total)
    return b.lo <= limit and (b.hi is None or limit < b.hi)


def highest_fraction(total: int, b: LimitBounds) -> float | None:
    """The largest fraction whose limit lies in the bounds, or None (no refusal seen, or none fits).

    A refusal of more than the card (hi above `total`) says only that some
    fraction was set: the largest below 1.
    """
    if b.hi is None or total <= 0:
        return None
    fraction = min((b.hi - 1) / total, math.nextafter(1.0, 0.0))
    while fraction > 0 and limit_of(fraction, total) >= b.hi:
        fraction = math.nextafter(fraction, 0.0)
    return fraction if 0 < fraction < 1.0 and fits(fraction, total, b) else None


def infer_fraction(total: int | None, b: LimitBounds, configured: float | None) -> tuple[float | None, str]:
    """The fraction to replay under and where it comes from.

    Returns (fraction, source): source is "config" (the recorded
    per_process_memory_fraction fits the trace), "inferred" (from the
    bounds: the program set another, or set one through the API), or
    "none" (no fraction: fraction None).
    """
    if configured is not None and configured < 1.0:
        if total is None or fits(configured, total, b):
            return configured, "config"
    if total is None:
        return None, "none"
    fraction = highest_fraction(total, b)
    return (fraction, "inferred") if fraction is not None else (None, "none")


def card_for_fraction(configured: float, usable: int, b: LimitBounds) -> int | None:
    """The card under which the configured fraction's limit lies in the bounds, where the card an OOM shows
    (`usable`: what the process could hold) gives one below them: the rest of the card was held outside
    PyTorch (Note [The card behind an OOM], snapshot_trace.py). The least such card, whose limit just allows
    every segment made: what others hold is usually small (a CUDA context). None where `usable` fits, or no
    card does."""
    if configured <= 0 or fits(configured, usable, b) or limit_of(configured, usable) >= b.lo:
        return None
    card = math.ceil(b.lo / configured)
    while limit_of(configured, card) < b.lo:
        card += 1
    return card if card > usable and fits(configured, card, b) else None


def conf_fraction(conf: str) -> float | None:
    """The per_process_memory_fraction of a config string as the core reads it; None for none, or for 1 (no
    limit, as PyTorch sets one only below 1), or for a string the core refuses."""
    try:
        fraction = _core.rules.config_fields(conf)["per_process_memory_fraction"]
    except ValueError:
        return None
    return fraction if fraction < 1.0 else None


def format_fraction(fraction: float) -> str:
    """The fraction as the config grammar takes it, exact to the double."""
    return repr(float(fraction))
