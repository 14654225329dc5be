"""The trace of one device of a PyTorch memory snapshot, ready to replay exactly.

A snapshot written on a GPU by ``torch.cuda.memory._dump_snapshot()`` holds
the allocator's final ``segments`` and, per device, the ``device_traces``
recorded since ``_record_memory_history()``. Recording usually begins
mid-run, so this module rebuilds what the trace needs to replay what
happened on the GPU:

- the start state (the segments that existed when recording began and the
  blocks live in them: start_state.py), from the trace's frees of blocks it
  never allocated, its frees of segments it never created, and the final
  segments;
- the recorded segment addresses, offered to the simulated device so that
  every allocation lands where it did on the GPU;
- the program's ``empty_cache()`` calls (runs of ``segment_free`` that are
  not the allocator's own release before an out-of-memory);
- the request an ``oom`` entry refused, and from the entry the memory the
  process could have held (reserved at that moment plus ``device_free``);
- the allocator settings of ``allocator_settings``, in the config grammar;
- the private pool of each allocation (CUDA graphs, ``torch.cuda.MemPool``):
  the entry's ``pool_id`` where the release records one (torch 2.13 and
  later), else the ``segment_pool_id`` of the final segment that holds its
  address (torch 2.11); an allocation in a segment freed before the end has
  no recorded pool there and is replayed in the default pool.

Frees take effect at ``free_completed`` (``free_requested`` when a trace has
no ``free_completed``), as blocks become reusable only then; a
``free_requested`` whose ``free_completed`` comes later (``record_stream``)
ends the allocation there, as PyTorch counts it (trace_pass.py, request_free).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np

from torchmem import _core
from torchmem.pytorch_env import conf_items, recorded_conf_string
from torchmem.formats.annotations import annotation_entries, metadata_values
from torchmem.replay.capacity import (DEFAULT_CAPACITY, SMALL_PAGE, card_from_spacing, card_of, expandable_capacity,
                                     segment_request)
from torchmem.replay.memory_limit import (LimitBounds, bounds, card_for_fraction, conf_fraction, format_fraction,
                                         infer_fraction, refused_retries)
from torchmem.replay.expandable_ranges import NO_OFFERS, FailureOffers, failure_offers, recorded_ranges
from torchmem.replay.kept_ranges import kept_ranges
from torchmem.replay.range_room import oom_placements
from torchmem.replay.release_runs import ReleaseRun
from torchmem.replay.retries import retry_runs, unsettled_runs
from torchmem.replay.start_state import StartState, fit_between, fix_block_sizes, rebase, rebuild_start_state
from torchmem.replay.trace_pass import BadEntries, PassEvents, TracePass, run_pass
from torchmem.formats.trace_types import (CHUNK, FREE_REQUESTED, RANGE_OFFER, RECORDED_RETRY, REQUEST_RELEASE, Chunk, Trace,
                                  TraceError)
from torchmem.formats.snapshot_devices import DeviceChoice, choose_device as device_rule, snapshot_devices


@dataclass
class RecordedRun:
    """What a snapshot says about the run on its GPU, beside the events."""

    device: int
    devices: list[tuple[int, int]]           # (device index, trace entries) of every device with entries
    conf: str | None                         # allocator settings in the config grammar; None if not recorded
    capacity: int | None                     # the card's memory, when the recording tells it (capacity_from)
    oom: dict | None                         # the first oom entry: index (event), entry, size, stream, device_free, reserved
    ooms: list[dict] = field(default_factory=list)  # every oom entry, the same fields
    empty_cache_calls: int = 0
    entries: int = 0
    max_address: int = 0
    event_entries: Any = None                # numpy: the trace entry each replay event comes from
    capacity_from: str | None = None         # "oom" (reserved + device_free at the OOM) or "expandable" (capacity.py)
    held: int = 0                            # the card's memory held outside PyTorch (Note [The card behind an OOM])
    fraction_from: str = "none"              # the conf's per_process_memory_fraction: "config", "inferred" or "none"
    limit_low: int | None = None             # an inferred fraction's lowest possible limit (memory_limit.py)
    peak_reserved: int = 0                   # the most the recording held (start state plus segments and maps)
    device_choice: str = ""                  # "device 0 (the one with the OOM)": torchmem.formats.snapshot_devices' rule
    retry_releases: list = field(default_factory=list)  # runs of releases a new segment followed (retries.py)
    start_reserved: int = 0                  # reserved when recording began
    # (trace entry, what it chose between) of the first choice the snapshot cannot settle that every replay
    # rests on: UNTOLD_GUESS or RETRY_GUESS; None where there is none
    guess: tuple[int, str] | None = None

    def entry_of(self, event: int | None) -> int | None:
        """The trace entry of replay event `event`."""
        if event is None or self.event_entries is None or not 0 <= event < len(self.event_entries):
            return None
        return int(self.event_entries[event])


# Settings that change the allocator's decisions but have no field of their own in
# ``allocator_settings``: read from its PYTORCH_CUDA_ALLOC_CONF string.
# reuse_order and min_block_size: torchmem's CPU settings (docs/cpu.md), recorded by a CPU install.
CONF_ONLY_KEYS = ("max_non_split_rounding_mb", "large_segment_size_mb", "per_process_memory_fraction",
                  "reuse_order", "min_block_size")


def recorded_conf(settings: Any) -> str | None:
    """The snapshot's ``allocator_settings`` in the config grammar ("" = defaults), None if absent.

    The fields (``expandable_segments``, ``max_split_size``, ...) give the
    settings in force when the snapshot was taken; the keys of
    CONF_ONLY_KEYS come from the recorded PYTORCH_CUDA_ALLOC_CONF string,
    each kept only when torchmem's parser accepts it.
    """
    if not isinstance(settings, dict):
        return None
    items = []
    if settings.get("expandable_segments"):
        items.append("expandable_segments:True")
    split = settings.get("max_split_size", -1)
    if isinstance(split, int) and 0 < split < 2**62:
        items.append(f"max_split_size_mb:{split // 2**20}")
    threshold = settings.get("garbage_collection_threshold", 0.0)
    if isinstance(threshold, (int, float)) and threshold > 0:
        items.append(f"garbage_collection_threshold:{threshold:g}")
    divisions = settings.get("roundup_power2_divisions")
    if isinstance(divisions, dict) and any(divisions.values()):
        pairs = sorted((int(k), int(v)) for k, v in divisions.items())
        values = {v for _, v in pairs}
        items.append(f"roundup_power2_divisions:{values.pop()}" if len(values) == 1
                     else "roundup_power2_divisions:[" + ",".join(f"{k}:{v}" for k, v in pairs) + "]")
    items += _conf_only_items(recorded_conf_string(settings))
    # torch 2.13 and later (their settings carry max_cached_size) break ties between equal free
    # blocks by the age of their segment, then by address (BlockComparatorSizeCounterAddress in
    # libc10_cuda.so); 2.11 and earlier by address. torchmem's reuse_order:segment is that rule.
    if ("max_cached_size" in settings or "max_round_threshold" in settings) and \
            not any(item.startswith("reuse_order") for item in items):
        items.append("reuse_order:segment")
    return ",".join(items)


def _creation_needs(b: TracePass, lss: int) -> list[int]:
    """What each segment made asked of the limit check: its size, or for a map its request's alloc_size (at
    least; 0 where no allocation followed). PyTorch checks a request's alloc_size, not the pages it maps,
    which may be more (20 MiB pages) or less (a free block at the range's end already covers part)."""
    return [size if request is None else segment_request(request, lss) if request else 0
            for _, size, request in b.creations]


def _device_needs(b: TracePass, lss: int) -> list[int]:
    """What each segment made asked of the device or the limit, whichever is more: its size, or for a map the
    pages it maps or its request's alloc_size (retries.py: a retry where either would have refused)."""
    return [size if request is None else max(size, segment_request(request, lss)) for _, size, request in b.creations]


def _asking(runs: tuple[ReleaseRun, ...], needs: list[int]) -> list[ReleaseRun]:
    """The runs with each new segment's creation index replaced by what it asked (`needs`; 0: unknown)."""
    return [run._replace(new_segment=needs[run.new_segment] if 0 <= run.new_segment < len(needs) else 0) for run in runs]


def _with_fraction(conf: str | None, capacity: int | None, limits: LimitBounds,
                   ooms: list[dict]) -> tuple[str | None, str, int | None]:
    """The recorded config with the memory fraction the trace shows (memory_limit.py), where it comes from,
    and for an inferred one the lowest limit the trace allows (`limits`: the trace's bounds)."""
    fraction, source = infer_fraction(capacity if ooms else None, limits, conf_fraction(conf or ""))
    if conf is None and fraction is None:
        return None, source, None  # no settings recorded, and nothing to add
    items = [item for item in conf_items(conf or "") if item.partition(":")[0].strip() != "per_process_memory_fraction"]
    if fraction is not None:
        items.append(f"per_process_memory_fraction:{format_fraction(fraction)}")
    return ",".join(items), source, limits.lo if source == "inferred" else None


def _unreserved_refusals(ooms: list[dict], unreserved: tuple[int, ...], large: int) -> list[tuple[int, int]]:
    """(reserved, what it asked) of each OOM the memory fraction refused, as the ranges show: it would have
    reserved a range, and none was (FailureOffers.unreserved)."""
    at = set(unreserved)
    return [(o["reserved"], segment_request(o["size"], large)) for o in ooms if o["index"] in at]


def _untold_oom(ooms: list[dict], limits: LimitBounds, capacity: int | None, conf: str | None,
                large: int) -> dict | None:
    """The first OOM whose bound on the memory fraction the replay leaves out (LimitBounds.untold), where
    counting it would give another fraction; None where there is none."""
    if not limits.untold or capacity is None:
        return None
    o = ooms[limits.untold[0]]
    hi = o["reserved"] + segment_request(o["size"], large)  # its bound, had the fraction refused it
    told = LimitBounds(limits.lo, hi if limits.hi is None else min(limits.hi, hi))
    fraction = conf_fraction(conf or "")
    return None if infer_fraction(capacity, told, fraction)[0] == fraction else o


def _untold_note(o: dict) -> str:
    return (f"entry {o['entry']}: an out-of-memory with {o['device_free'] / 2**20:.1f} MiB free on the card, less than "
            "the whole pages the request may have mapped: the memory fraction refused it only if its range had free "
            "pages at its tail, which this trace's maps do not tell; replayed as the card's refusal")


# What a recording's guesses chose between (RecordedRun.guess): every replay of the trace rests on them.
UNTOLD_GUESS = "whether the card or the memory fraction refused an out-of-memory, which sets the fraction replayed"
RETRY_GUESS = "whether a run of releases before a new segment was an allocation retry"


def large_segment_size(conf: str) -> int:
    """The large pool's segment size under a config (large_segment_size_mb, else 20 MiB), as the core reads it."""
    return _core.rules.config_fields(conf or "")["large_segment_size"]


def _conf_only_items(conf: Any) -> list[str]:
    if not isinstance(conf, str):
        return []
    try:
        items = conf_items(conf)
    except ValueError:
        return []  # not a string PyTorch would have taken
    out = []
    for item in items:
        key, _, value = item.partition(":")
        key, value = key.strip(), value.strip()
        if key in CONF_ONLY_KEYS and not any(o.startswith(key + ":") for o in out):
            try:
                _core.parse_config(f"{key}:{value}")
            except ValueError:
                continue
            out.append(f"{key}:{value}")
    return out


@dataclass(frozen=True)
class _Recording:
    """What the pass and the start state tell of one device's recording: what every later step reads."""

    bad: BadEntries      # the bad entries skipped (or raised)
    b: TracePass
    start: StartState    # its ranges and notes grow as the later steps place the ranges (rebase, kept_ranges)
    final_end: int       # the highest address the final segments reach (rebuild_start_state)
    conf: str | None     # the recorded allocator settings (recorded_conf), before the memory fraction is added
    ooms: list[dict]     # every oom entry: index (event), entry, size, stream, device_free, reserved
    expandable: bool     # the settings' expandable_segments
    large: int           # the large pool's segment size under conf (large_segment_size)
    peak_reserved: int   # the most the recording held (start state plus segments and maps)


def _device_entries(snapshot: dict, name: str, device: int | None) -> tuple[list, DeviceChoice, list]:
    """The snapshot's device_traces, the device to replay (`device`, else snapshot_devices' rule) and its entries."""
    traces = snapshot.get("device_traces")
    if not isinstance(traces, list):
        raise TraceError(f"{name}: no device_traces: record with torch.cuda.memory._record_memory_history() before dumping")

    choice = device_rule(snapshot) if device is None else DeviceChoice(device, "given", len(snapshot_devices(snapshot)))
    device = choice.device
    if isinstance(device, bool) or not isinstance(device, int) or device not in (snapshot_devices(snapshot) or [0]):
        raise TraceError(f"{name}: no device {device!r} (the snapshot has {len(traces)})")
    entries = traces[device] if device < len(traces) else []
    if not isinstance(entries, list):
        raise TraceError(f"{name}: device_traces[{device}] is not a list of trace entries")
    return traces, choice, entries


def _read_recording(snapshot: dict, name: str, device: int, entries: list, skip_bad_events: bool) -> _Recording:
    """One pass over the device's entries, the start state it rebuilds, and the recorded settings."""
    bad = BadEntries(name, device, skip_bad_events)
    b = run_pass(entries, bad, snapshot.get("segments"))
    start, final_end = rebuild_start_state(snapshot, b, bad)
    start.order_pools(b.pool_ids)
    conf = recorded_conf(snapshot.get("allocator_settings"))
    bad.count += fix_block_sizes(start, conf or "", f"{name}: device {device}", skip_bad_events)
    ooms = [{"index": o.index, "entry": o.entry, "size": o.size, "stream": o.stream, "device_free": o.device_free,
             "reserved": start.reserved + o.reserved_delta} for o in b.ooms]
    expandable = _core.rules.config_fields(conf or "")["expandable_segments"]
    return _Recording(bad, b, start, final_end, conf, ooms, expandable, large_segment_size(conf or ""),
                      start.reserved + b.reserved_peak)


# Note [The card behind an OOM]
# An oom entry records what the card still had free (device_free), so
# reserved + device_free is what the process could hold. A real GPU also
# holds memory outside PyTorch: its CUDA context, another process. That is
# not in the snapshot, nor is the card's size, yet PyTorch sizes each
# expandable range at 9/8 of the card (cudaDeviceProp.totalGlobalMem) and a
# memory fraction's limit as a share of it. Where two expandable ranges lie
# side by side, their spacing gives the card (capacity.card_from_spacing; to
# within a large page); when that is more than what the process could hold,
# the replay takes that card, with the difference held by others
# (RecordedRun.held, the replay's default in_use_by_others). Otherwise the
# card is taken to be what the process could hold. Checked on the fake GPU
# with memory held (tests/support/oracle.py draws it: Control.set_held).


def _recorded_card(r: _Recording) -> tuple[int | None, str | None, int]:
    """The card's memory as the recording tells it, where that comes from ("oom", "expandable" or None), and the
    memory held outside PyTorch; places the start ranges of an expandable recording on that card."""
    b, start = r.b, r.start
    capacity = capacity_from = None
    held = 0
    if r.ooms:
        oom = r.ooms[0]
        capacity, capacity_from = oom["reserved"] + oom["device_free"], "oom"
        card = card_from_spacing(recorded_ranges(b, start, r.large)) if r.expandable else None
        if card is not None and card > capacity:  # Note [The card behind an OOM]
            capacity, held = card, card - capacity
    elif r.expandable:
        ranges = recorded_ranges(b, start, r.large)
        capacity = expandable_capacity(ranges, DEFAULT_CAPACITY)
        if capacity is not None and start.ranges:
            # A start range's base lies at or below its lowest page, so the spacing may understate the card:
            # it is at least what the recording held. Place the start ranges on that card, and read it again.
            least = -(-r.peak_reserved // SMALL_PAGE) * SMALL_PAGE
            rebase(start.ranges, b, max(capacity, least))
            capacity = expandable_capacity(recorded_ranges(b, start, r.large), DEFAULT_CAPACITY)
            capacity = max(capacity, least) if capacity is not None else None
        if capacity is not None and capacity >= r.peak_reserved:
            capacity_from = "expandable"
        else:
            capacity = None
    if r.expandable and capacity is not None and capacity_from == "expandable":
        fit_between(start.ranges, capacity)  # as rebuild_start_state does with an OOM's card
    return capacity, capacity_from, held


def _limit_evidence(r: _Recording, capacity: int | None,
                    held: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]], list[ReleaseRun]]:
    """(reserved before, what it asked) of each segment made and of each retry only the limit can have refused,
    and the runs of releases a new segment followed, each with what that segment asked of the device."""
    b, conf = r.b, r.conf
    needs = _creation_needs(b, r.large)
    creations = [(r.start.reserved + c[0], need) for c, need in zip(b.creations, needs)]
    collects = _core.rules.config_fields(conf or "")["garbage_collection_threshold"] > 0
    refusals = refused_retries(_asking(b.retry_releases, needs), r.start.reserved,
                               capacity - held if r.ooms else None, collects)
    retry_releases = _asking(b.retry_releases, _device_needs(b, r.large))
    return creations, refusals, retry_releases


def _keep_unmapped_ranges(r: _Recording, capacity: int) -> None:
    """Adds to the start state the expandable ranges reserved before recording began and never mapped."""
    kept = kept_ranges(r.b, r.start, capacity, r.large, r.conf or "")
    r.start.ranges += kept
    if kept:
        r.start.notes.append(f"{len(kept)} expandable range{'s' if len(kept) != 1 else ''} reserved before recording "
                             "began and never mapped, rebuilt where the trace first maps in "
                             f"{'them' if len(kept) != 1 else 'it'}")


def _offers_and_limits(r: _Recording, capacity: int | None, creations: list[tuple[int, int]],
                       refusals: list[tuple[int, int]]) -> tuple[FailureOffers, LimitBounds]:
    """The range bases to offer before the failed requests, and the bounds the trace sets on the memory limit;
    adds to `refusals` the OOMs the ranges show the memory fraction refused."""
    b, start, ooms, large, conf = r.b, r.start, r.ooms, r.large, r.conf or ""
    # Note [Where a request of an expandable stream maps]
    placements = oom_placements(b, start, capacity, large, conf) if r.expandable and ooms and capacity else []
    reserves = {o["index"]: p.new_ranges for o, p in zip(ooms, placements) if p}
    offers = (failure_offers(b, start, capacity, large, conf, reserves)
              if r.expandable else NO_OFFERS)  # Note [Expandable ranges in a snapshot]
    refusals += _unreserved_refusals(ooms, offers.unreserved, large)
    limits = bounds(creations, [(o["reserved"], o["size"], o["device_free"]) for o in ooms], large, refusals,
                    maps_pages=r.expandable, map_bytes=[p.map_bytes if p else None for p in placements])
    return offers, limits


def _card_for_configured_fraction(r: _Recording, capacity: int | None, held: int, limits: LimitBounds,
                                  offers: FailureOffers) -> tuple[int | None, int, FailureOffers]:
    """The card, the memory held outside PyTorch and the offers, on the card a configured memory fraction
    shows behind an OOM (Note [The card behind an OOM]); as given where it shows none."""
    configured = conf_fraction(r.conf or "")
    if r.ooms and not held and configured is not None:
        card = card_for_fraction(configured, capacity, limits)
        if card is not None:  # Note [The card behind an OOM]
            capacity, held = card, card - capacity
            offers = (failure_offers(r.b, r.start, capacity, r.large, r.conf or "")
                      if r.expandable else NO_OFFERS)  # that card's
    return capacity, held, offers


def _first_guess(b: TracePass, untold: dict | None, unsettled: list[ReleaseRun]) -> tuple[int, str] | None:
    """The first choice the snapshot cannot settle that every replay rests on (RecordedRun.guess), or None."""
    guesses = [(untold["entry"], UNTOLD_GUESS)] if untold else []
    guesses += [(b.events.entries[unsettled[0].position], RETRY_GUESS)] if unsettled else []
    return min(guesses, default=None)


def _inferred_events(offers: FailureOffers, retried: list[ReleaseRun], retry_releases: list[ReleaseRun],
                     pending_frees: list[int]) -> list[tuple[int, list[tuple]]]:
    """The events the later steps infer, as _lower's `inserts`: (position, [(op, id, size, stream, addr)]),
    sorted by position."""
    inserts = [(pos, [(RANGE_OFFER, 0, 0, stream, base) for base, stream in bases]) for pos, bases in offers.offers]
    # Every run a new segment followed: its request missed its search (kRecordedRetry); size 0 for a counted retry.
    counted = {run.position for run in retried}
    inserts += [(run.position, [(RECORDED_RETRY, 0, 0 if run.position in counted else 1, run.stream, 0)])
                for run in retry_releases if run.position in counted or run.new_segment > 0]
    if pending_frees:  # frees still waiting at the end (StartState.pending_frees)
        inserts.insert(0, (0, [(FREE_REQUESTED, id_, 0, 0, 0) for id_ in pending_frees]))
    return sorted(inserts, key=lambda insert: insert[0])


def _trace_notes(r: _Recording, conf: str | None, fraction_from: str, untold: dict | None,
                 unsettled: list[ReleaseRun], found: list, stamped: list) -> list[str]:
    """The trace's notes: what the replay inferred or guessed, and what it skipped or carries through."""
    b, bad = r.b, r.bad
    notes = []
    if fraction_from == "inferred":
        shown = f"{conf_fraction(conf):.4g}"
        notes.append(f"a memory fraction of {'just under 1' if shown == '1' else shown} (the highest that makes the "
                     "recording's refusals; a snapshot does not record one set by "
                     "torch.cuda.set_per_process_memory_fraction)")
    if untold:
        notes.append(_untold_note(untold))
    if b.pools_inferred:
        pools = b.pools - 1
        notes.append(f"{pools} private pool{'s' if pools != 1 else ''} (CUDA graphs or torch.cuda.MemPool): this release records "
                     "no pool_id in its trace, so each allocation's pool comes from the final segment that holds it; "
                     "allocations in segments freed before the end are replayed in the default pool")
    if unsettled:
        n = len(unsettled)
        notes.append(f"entry {b.events.entries[unsettled[0].position]}: a run of releases before a new segment, "
                     "counted as an allocation retry or not, may have been the program's or the garbage collector's; "
                     f"the snapshot cannot tell ({n} such run{'s' if n != 1 else ''}; num_alloc_retries may be off)")
    if bad.count:
        notes.append(f"skipped {bad.count} bad trace entries" + (f" (first: {bad.first})" if bad.first else ""))
    notes += r.start.notes
    if found or stamped:
        notes.append(f"{len(found):,} annotation{'s' if len(found) != 1 else ''} and {len(stamped):,} user metadata "
                     f"value{'s' if len(stamped) != 1 else ''} carried through: they change no memory "
                     "(torchmem stats lists them)")
    return notes


def _chunk_factory(cols: list[np.ndarray]) -> Callable[[], Iterator[Chunk]]:
    """The trace's source of chunks: the event columns (ops, ids, sizes, streams, addrs) CHUNK events at a time."""
    ops, ids, sizes, streams, addrs = cols[:5]

    def factory() -> Iterator[Chunk]:
        for lo in range(0, len(ops), CHUNK):
            hi = lo + CHUNK
            yield Chunk(ops[lo:hi], ids[lo:hi], sizes[lo:hi], streams[lo:hi], addrs[lo:hi])

    return factory


def snapshot_trace(snapshot: dict, name: str, device: int | None = None, skip_bad_events: bool = False) -> Trace:
    """The replayable trace of one device of a snapshot (see the module docstring).

    Raises TraceError naming the entry for an unknown action that may change
    memory (trace_types.unknown_action; one that cannot is a warning), a malformed
    entry, an oom entry without device_free, or a trace that contradicts its
    final segments; with skip_bad_events those entries are skipped and counted
    in the trace's notes instead.
    """
    traces, choice, entries = _device_entries(snapshot, name, device)
    r = _read_recording(snapshot, name, choice.device, entries, skip_bad_events)
    b, start, ooms = r.b, r.start, r.ooms
    capacity, capacity_from, held = _recorded_card(r)
    creations, refusals, retry_releases = _limit_evidence(r, capacity, held)
    if r.expandable and capacity:  # Note [Ranges kept unmapped from before recording]
        _keep_unmapped_ranges(r, capacity)
    offers, limits = _offers_and_limits(r, capacity, creations, refusals)
    capacity, held, offers = _card_for_configured_fraction(r, capacity, held, limits, offers)
    conf, fraction_from, limit_low = _with_fraction(r.conf, capacity, limits, ooms)
    untold = _untold_oom(ooms, limits, capacity, conf, r.large)
    unsettled = unsettled_runs(retry_releases, conf or "", fraction_from == "config")
    guess = _first_guess(b, untold, unsettled)
    card, card_from = card_of(capacity, capacity_from, r.peak_reserved)
    # The ranges' spacing tells the card to within a large page, as an OOM does (capacity.py).
    retried = retry_runs(retry_releases, conf or "", start.reserved, r.peak_reserved, card,
                         card_from in ("oom", "expandable"),
                         fraction_from == "inferred", limit_low, held)
    cols = _lower(b.events, _inferred_events(offers, retried, retry_releases, start.pending_frees), ooms,
                  b.request_releases)
    devices = [(d, len(t)) for d, t in enumerate(traces) if isinstance(t, list) and t]
    recorded = RecordedRun(device=choice.device, devices=devices, conf=conf, capacity=capacity,
                           oom=ooms[0] if ooms else None, ooms=ooms,
                           capacity_from=capacity_from, held=held, fraction_from=fraction_from, limit_low=limit_low,
                           peak_reserved=r.peak_reserved,
                           empty_cache_calls=b.empty_cache_calls, entries=len(entries),
                           max_address=max(b.max_address, r.final_end, offers.floor),
                           retry_releases=retry_releases, start_reserved=start.reserved,
                           event_entries=cols[5], device_choice=choice.describe(), guess=guess)
    found, stamped = annotation_entries(entries), metadata_values(entries)
    notes = _trace_notes(r, conf, fraction_from, untold, unsettled, found, stamped)
    return Trace(name, _chunk_factory(cols), total=len(cols[0]), notes=notes, start=start, recorded=recorded,
                 skipped_lines=r.bad.count, first_skipped=r.bad.first, annotations=found)


def _lower(events: PassEvents, inserts: list[tuple[int, list[tuple]]], ooms: list[dict],
           request_releases: tuple[int, ...] = ()) -> list[np.ndarray]:
    """The replay's event columns (ops, ids, sizes, streams, addrs, entries as numpy arrays): the pass's
    events with the events the later steps infer placed where they belong. `inserts`: (position,
    [(op, id, size, stream, addr)]) sorted by position, each placed just before the pass's event at
    `position` (the failed request of a RANGE_OFFER, the new segment of a RECORDED_RETRY) and given its
    trace entry. Shifts each oom's "index" past the events placed before it. The releases at
    `request_releases` become REQUEST_RELEASE events."""
    columns = [events.ops, events.ids, events.sizes, events.streams, events.addrs, events.entries]
    if request_releases:  # Note [A failed map's own release] (trace_pass.py)
        ops = list(events.ops)
        for pos in request_releases:
            ops[pos] = REQUEST_RELEASE
        columns[0] = ops
    if inserts:
        merged: list[list[int]] = [[] for _ in columns]
        done = 0
        for pos, rows in inserts:
            for into, column in zip(merged, columns):
                into.extend(column[done:pos])
            entry = events.entries[pos] if pos < len(events.entries) else 0  # 0: a trace with no events
            for row in rows:
                for into, value in zip(merged, (*row, entry)):
                    into.append(value)
            done = pos
        for into, column in zip(merged, columns):
            into.extend(column[done:])
        columns = merged
        for o in ooms:
            o["index"] += sum(len(rows) for pos, rows in inserts if pos <= o["index"])
    dtypes = (np.uint8, np.uint64, np.uint64, np.uint64, np.uint64, np.int64)
    return [np.asarray(c, dtype=t) for c, t in zip(columns, dtypes)]
