"""Replay an allocation trace on a simulated GPU of any size.

The replay runs torchmem's caching allocator itself on a simulated device
(an address space with a capacity and nothing behind it), so a trace
recorded on an 80 GiB GPU reproduces its fragmentation out-of-memory on a
laptop, and fixes (expandable segments, split limits, rounding, garbage
collection) can be tried in seconds::

    from torchmem.replay import compare, replay
    result = replay("snapshot.pickle")          # exactly what happened on the GPU
    print(result.explain())
    for row in compare("snapshot.pickle", ["", "expandable_segments:True"], capacity="80GiB"):
        print(row.summary())

A snapshot replays exactly by default: its recorded settings, the memory
live when recording began, every segment at its recorded address, the
program's empty_cache() calls, and the capacity its OOM implies.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from torchmem import _core
from torchmem.replay.capacity import recorded_capacity
from torchmem.sizes import fmt_size, parse_bytes
from torchmem.formats.traces import Trace, TraceError, from_events
from torchmem.replay.trace_files import load_trace

MAX_TIMELINE_POINTS = 4000


@dataclass
class ReplayResult:
    """What happened when a trace was replayed under one config."""

    conf: str
    capacity: int
    in_use_by_others: int
    completed: bool
    events: int
    seconds: float
    peak_allocated: int
    peak_reserved: int
    oom: dict | None
    timeline: np.ndarray  # rows of (event index, allocated, reserved), peaks per window
    stats: dict = field(repr=False, default_factory=dict)
    segments: list = field(repr=False, default_factory=list)
    skipped: int = 0                 # bad events skipped (skip_bad_events): unreadable entries plus events refused
    skipped_detail: str = ""         # what they were, in words (the CLI's warning)
    notes: list[str] = field(default_factory=list)
    replayer: Any = field(default=None, repr=False)  # the allocator's state and history, for snapshots
    capacity_source: str = "given"   # "given", "oom" (reserved + device_free at the recorded OOM),
                                     # "expandable" (the recorded ranges' spacing, replay/capacity.py) or "default"
    conf_source: str = "given"       # "given", "recorded" (the snapshot's allocator_settings) or "default"
    start: Any = None                # StartState of a snapshot recorded mid-run
    recorded: Any = None             # RecordedRun: what the snapshot says (device, OOM, settings)
    fidelity: dict | None = None     # placements and segments matched, for a replay that follows a recording
    survived_ooms: list = field(default_factory=list)  # the recording's OOMs the replay met and went past, as the program did
    policy: str = "native"           # the allocator policy the config chose: "native" or "stitch"
    counters: dict | None = None     # policy:stitch: page_maps, page_unmaps, reclaims, ... (None for native)
    allocations: int = 0             # allocations made (the start state's included)
    start_age_guesses: int = 0       # allocations a tie between start segments decided (Note [Start segments' ages])
    start_age_guess_entry: int | None = None  # the trace entry of the first of them

    @property
    def follows_recording(self) -> bool:
        """True when this replay was asked to make the recording's own decisions."""
        return self.fidelity is not None

    @property
    def exact(self) -> bool:
        """Every allocation at its recorded address and every recorded segment taken."""
        f = self.fidelity
        return bool(f) and f["placements_differed"] == 0 and f["segments_missed"] == 0

    @property
    def recorded_ooms(self) -> list[dict]:
        """Each of the recording's OOMs, in order, and whether the replay reproduced it.

        Reproduced: the replay refused the same request at the same trace
        entry with the native reserved bytes. A replay that follows the
        recording goes past the OOMs the program survived (it allocated
        again after them) and stops at the last one it did not.
        """
        if self.recorded is None:
            return []
        met = list(self.survived_ooms) + ([self.oom] if self.oom and self.oom.get("recorded") else [])
        by_entry = {o.get("entry"): o for o in met}
        out = []
        for native in self.recorded.ooms:
            o = by_entry.get(native["entry"])
            out.append({"size": native["size"], "reserved": native["reserved"], "device_free": native["device_free"],
                        "entry": native["entry"], "replay_reserved": o["reserved"] if o else None,
                        "reproduced": o is not None and o["size"] == native["size"] and o["reserved"] == native["reserved"]})
        return out

    @property
    def recorded_oom(self) -> dict | None:
        """The recording's first OOM and whether the replay reproduced it (see recorded_ooms)."""
        ooms = self.recorded_ooms
        return ooms[0] if ooms else None

    def to_json(self) -> dict:
        oom = None
        if self.oom:  # "entry": the snapshot's trace entry, as every command numbers it (else the event's position)
            oom = {k: self.oom.get(k) for k in ("entry", "size", "allocated", "reserved", "reserved_but_free",
                                                "largest_free", "message", "recorded")}
            if oom["entry"] is None:
                oom["entry"] = self.oom.get("index")
        return {
            "conf": self.conf,
            "capacity": self.capacity,
            "in_use_by_others": self.in_use_by_others,
            "completed": self.completed,
            "oom": oom,
            "peak_allocated": self.peak_allocated,
            "peak_reserved": self.peak_reserved,
            "events": self.events,
            "seconds": round(self.seconds, 4),
            "num_alloc_retries": self.stats.get("num_alloc_retries", 0),
            "num_device_alloc": self.stats.get("num_device_alloc", 0),
            "skipped_events": self.skipped,
            "notes": self.notes,
            "capacity_source": self.capacity_source,
            "conf_source": self.conf_source,
            "device": self.recorded.device if self.recorded else None,
            "start_state": None if self.start is None else {
                "segments": len(self.start.segments), "expandable_ranges": len(self.start.ranges),
                "live_blocks": self.start.live_blocks,
                "reserved": self.start.reserved, "requested": self.start.requested},
            "recorded_oom": self.recorded_oom,
            "recorded_ooms": self.recorded_ooms,
            "fidelity": self.fidelity,
            "exact": self.exact,
            "policy": self.policy,
            "allocations": self.allocations,
            "counters": self.counters,
            "start_age_guesses": self.start_age_guesses,
            "start_age_guess_entry": self.start_age_guess_entry,
        }

    def summary(self) -> str:
        conf = self.conf or "(default)"
        if self.completed:
            outcome = "completed"
        else:
            o = self.oom
            where = f"trace entry {o['entry']:,}" if o.get("entry") is not None else f"event {o['index']:,}"
            outcome = f"OOM at {where}: {fmt_size(o['size'])} refused ({fmt_size(o['allocated'])} allocated, {fmt_size(o['reserved'])} reserved)"
        line = f"{conf:<40} peak allocated {fmt_size(self.peak_allocated):>10}, peak reserved {fmt_size(self.peak_reserved):>10}: {outcome}"
        if self.counters:
            c = self.counters
            line += f" ({c['page_maps']:,} page maps, {c['page_unmaps']:,} unmaps for {self.allocations:,} allocations)"
        return line

    def explain(self) -> str:
        """Why the replay ran out of memory (or that it did not), in words."""
        if self.completed:
            return (f"Completed {self.events:,} events on {fmt_size(self.capacity)}: peak allocated {fmt_size(self.peak_allocated)}, "
                    f"peak reserved {fmt_size(self.peak_reserved)} (cache overhead {fmt_size(self.peak_reserved - self.peak_allocated)}).")
        o = self.oom
        free_device = o["device_free"]
        where = f"trace entry {o['entry']:,}" if o.get("entry") is not None else f"event {o['index']:,}"
        lines = [
            f"Out of memory at {where}: a request for {fmt_size(o['size'])} was refused.",
            f"  allocated          {fmt_size(o['allocated']):>10}  (live tensors)",
            f"  reserved           {fmt_size(o['reserved']):>10}  (held from the device)",
            f"  reserved but free  {fmt_size(o['reserved_but_free']):>10}  (cached, in {self._free_block_count()} free blocks)",
            f"  largest free block {fmt_size(o['largest_free']):>10}",
            f"  device free        {fmt_size(free_device):>10}  of {fmt_size(self.capacity)}"
            + (f" ({fmt_size(self.in_use_by_others)} held outside PyTorch)" if self.in_use_by_others else ""),
        ]
        if o["reserved_but_free"] >= o["size"] > o["largest_free"]:
            lines.append(
                f"Fragmentation: {fmt_size(o['reserved_but_free'])} are free inside reserved segments, more than the request, "
                f"but no free block is large enough, and the segments that hold them also hold live tensors, so they "
                f"cannot be released. Try expandable_segments:True (free pages are unmapped and the range grows in place), "
                f"or max_split_size_mb to stop large cached blocks from being split; with torchmem installed, "
                f"policy:stitch serves a request from free pages wherever they are."
            )
        else:
            lines.append("Not fragmentation: the live tensors themselves need more memory than the device has.")
        return "\n".join(lines)

    def _free_block_count(self) -> int:
        return sum(1 for s in self.segments for b in s["blocks"] if not b["allocated"])


def parse_capacity(capacity: int | str) -> int:
    return parse_bytes(capacity, "capacity")


def as_trace(trace: Trace | str | Iterable[dict], device: int | None = None, skip_bad_events: bool = False) -> Trace:
    if isinstance(trace, Trace):
        if device is not None and trace.recorded is not None and trace.recorded.device != device:
            raise ValueError(f"{trace.name}: loaded for device {trace.recorded.device}, not {device}; load it again")
        return trace
    if isinstance(trace, (str, bytes)) or hasattr(trace, "__fspath__"):
        return load_trace(os.fsdecode(trace), device=device, skip_bad_events=skip_bad_events)
    if device is not None:
        raise ValueError("device applies to snapshots only")
    return from_events(trace)


def normalize_conf(conf: str) -> str:
    """The config with only the keys that differ from the defaults, in a fixed order."""
    return _core.parse_config(conf)


def replay(
    trace: Trace | str | Iterable[dict],
    capacity: int | str | None = None,
    conf: str | None = None,
    *,
    device: int | None = None,
    skip_bad_events: bool = False,
    progress: Callable[[int], None] | None = None,
    history: int = 0,
    in_use_by_others: int | str | None = None,
    follow_recording: bool | None = None,
) -> ReplayResult:
    """Replay `trace` through the caching allocator on a simulated device.

    A snapshot with nothing else given replays exactly what happened on its
    GPU (see the module docstring); give `capacity` or `conf` to ask what
    would happen on another card or under other settings.

    Args:
        trace: a Trace, a path (snapshot pickle, JSON snapshot or JSON lines), or event dicts.
        capacity: device size in bytes or as "80GiB". Default: for a snapshot
            with an OOM, the memory the process could hold (reserved at the OOM
            plus its device_free); for one with several expandable ranges, the
            largest card whose ranges fit between the recorded ones
            (replay/capacity.py); else 80 GiB, or the most the recording held
            when that is more.
        conf: allocator config, e.g. "expandable_segments:True". Default: a
            snapshot's recorded allocator_settings, else PyTorch's defaults.
        device: which device of a snapshot (default: the one with an OOM,
            else the one with the most history: torchmem.formats.snapshot_devices).
        skip_bad_events: skip (and count) bad events instead of raising.
        progress: called with the number of events done after each chunk.
        history: keep this many history entries (for snapshots of the replay).
        in_use_by_others: bytes of the device held outside PyTorch's allocator
            (CUDA context, NCCL buffers, other processes), e.g. "6GiB".
            Default: on the recording's own card (no `capacity` given),
            what its card held outside PyTorch (Note [The card behind an
            OOM] in replay/snapshot_trace.py), else 0.
        follow_recording: offer each recorded segment address to the device
            and compare every placement with the recording. Default: when the
            config is the recorded one.
    """
    trace = as_trace(trace, device, skip_bad_events)
    settings = _replay_settings(trace, capacity, conf, in_use_by_others, follow_recording)
    replayer, follow_recording = _new_replayer(trace, settings, skip_bad_events, history)
    notes = list(trace.notes)
    if trace.start is not None:
        _restore_start_state(replayer, trace, settings, notes)
    seconds = _run_chunks(replayer, trace, progress)
    return _replay_result(trace, replayer, settings, follow_recording, notes, seconds)


def compare(
    trace: Trace | str | Iterable[dict],
    confs: Sequence[str],
    capacity: int | str | None = "80GiB",
    **kwargs: Any,
) -> list[ReplayResult]:
    """Replay the same trace under each config; one result per config."""
    trace = as_trace(trace, kwargs.pop("device", None), kwargs.get("skip_bad_events", False))
    if not confs:
        raise ValueError("compare needs at least one config")
    return [replay(trace, capacity, conf, **kwargs) for conf in confs]


@dataclass(frozen=True)
class _ReplaySettings:
    """What a replay runs under, and where the capacity and the config came from."""

    capacity: int
    capacity_source: str
    conf: str
    conf_source: str
    others: int              # bytes of the device held outside PyTorch's allocator
    follow_recording: bool   # asked of the replayer (a policy that places blocks its own way then drops it)
    sample_every: int        # events between timeline samples


def _replay_settings(trace: Trace, capacity: int | str | None, conf: str | None,
                     in_use_by_others: int | str | None, follow_recording: bool | None) -> _ReplaySettings:
    """The settings of replay()'s arguments: those given, else the recording's, else the defaults; validated."""
    recorded = trace.recorded
    capacity_source = "given"
    if capacity is None:
        capacity, capacity_source = recorded_capacity(recorded)
        if in_use_by_others is None and recorded is not None:
            in_use_by_others = recorded.held
    capacity = parse_capacity(capacity)
    conf, conf_source = _conf_and_source(conf, recorded)
    if follow_recording is None:
        follow_recording = recorded is not None and normalize_conf(conf) == normalize_conf(recorded.conf or "")
    follow_recording = bool(follow_recording and recorded is not None)
    sample_every = max(1, (trace.total or 0) // MAX_TIMELINE_POINTS) if trace.total else 256
    others = parse_bytes(in_use_by_others or 0, "in_use_by_others", allow_zero=True)
    if others >= capacity:
        raise ValueError(f"in_use_by_others ({others} bytes) must be less than the capacity ({capacity} bytes)")
    return _ReplaySettings(capacity=capacity, capacity_source=capacity_source, conf=conf, conf_source=conf_source,
                           others=others, follow_recording=follow_recording, sample_every=sample_every)


def _conf_and_source(conf: str | None, recorded: Any) -> tuple[str, str]:
    """The config to replay under (given, else recorded, else the defaults), validated and stripped; its source."""
    conf_source = "given"
    if conf is None:
        if recorded is not None and recorded.conf is not None:
            conf, conf_source = recorded.conf, "recorded"
        else:
            conf, conf_source = "", "default"
    if not isinstance(conf, str):
        raise TypeError(f"conf must be a string like 'expandable_segments:True', not {type(conf).__name__}")
    _core.parse_config(conf)  # validates; names the bad key
    return conf.strip(), conf_source


def _new_replayer(trace: Trace, settings: _ReplaySettings, skip_bad_events: bool,
                  history: int) -> tuple[_core.Replayer, bool]:
    """A replayer for these settings, keeping history and above the recorded addresses; whether it follows."""
    replayer = _core.Replayer(settings.capacity, settings.others, settings.conf, settings.sample_every,
                              skip_bad_events, settings.follow_recording)
    follow_recording = settings.follow_recording
    if replayer.policy != "native":
        follow_recording = False  # the stitch policy places blocks its own way: nothing recorded to follow
    if history:
        replayer.enable_history(history)
    if trace.recorded is not None:
        replayer.set_address_floor(trace.recorded.max_address)
    return replayer, follow_recording


def _restore_start_state(replayer: _core.Replayer, trace: Trace, settings: _ReplaySettings, notes: list[str]) -> None:
    """Rebuild the memory held when recording began: its private pools, expandable ranges, then segments."""
    segments = list(trace.start.segments)
    pool_index = {pid: i + 1 for i, pid in enumerate(trace.start.pools)}
    for pid, i in pool_index.items():  # private pools that held memory when recording began
        replayer.enter_pool(i, *pid)
    replayer.enter_pool(0, 0, 0)
    segments += _restore_start_ranges(replayer, trace, settings, pool_index, notes)
    _restore_start_segments(replayer, trace, settings, pool_index, segments)


def _restore_start_ranges(replayer: _core.Replayer, trace: Trace, settings: _ReplaySettings,
                          pool_index: dict[tuple, int], notes: list[str]) -> list:
    """Rebuild the start state's expandable ranges; the fixed segments of those that do not fit this capacity."""
    fallback = []
    # Highest first: a range too large for the recorded layout then overlaps a range already
    # rebuilt above it, and only its own pages fall back to fixed segments.
    for r in sorted(trace.start.ranges, key=lambda r: -r.base):
        try:
            replayer.restore_expandable(r.base, r.stream, r.is_small, r.runs, r.blocks, r.ids,
                                        pool_index.get(r.pool, 0))
        except ValueError as exc:  # e.g. the range does not reach its runs on a smaller card
            if "do not fit in the capacity" in str(exc):
                raise _start_state_too_large(trace, settings) from None
            fallback += r.as_segments()
            notes.append(f"an expandable range is rebuilt as fixed segments on this capacity ({exc})")
    return fallback


def _restore_start_segments(replayer: _core.Replayer, trace: Trace, settings: _ReplaySettings,
                            pool_index: dict[tuple, int], segments: list) -> None:
    """Rebuild the start state's fixed segments, each at its recorded address."""
    for seg in segments:
        try:
            replayer.restore(seg.addr, seg.size, seg.stream, seg.is_small, seg.blocks, seg.ids,
                             pool_index.get(seg.pool, 0))
        except ValueError as exc:
            if "does not fit in the capacity" in str(exc):
                raise _start_state_too_large(trace, settings) from None
            raise TraceError(f"{trace.name}: start state: {exc}") from None


def _start_state_too_large(trace: Trace, settings: _ReplaySettings) -> ValueError:
    """The error for a capacity smaller than the memory held when recording began."""
    return ValueError(
        f"{trace.name}: the capacity ({fmt_size(settings.capacity)}) is smaller than the memory held when "
        f"recording began ({fmt_size(trace.start.reserved + settings.others)} with what others hold)")


def _run_chunks(replayer: _core.Replayer, trace: Trace, progress: Callable[[int], None] | None) -> float:
    """Run the trace's chunks through the replayer until the end or an OOM stops it; the seconds that took."""
    start = time.perf_counter()
    for chunk in trace.chunks():
        try:
            replayer.run(chunk.ops, chunk.ids, chunk.sizes, chunk.streams, chunk.addrs)
        except ValueError as exc:
            raise TraceError(f"{trace.name}: {exc}") from None
        if progress:
            progress(replayer.events)
        if replayer.stopped:
            break
    return time.perf_counter() - start


def _replay_result(trace: Trace, replayer: _core.Replayer, settings: _ReplaySettings, follow_recording: bool,
                   notes: list[str], seconds: float) -> ReplayResult:
    """The result of a finished replay, its OOMs and first difference named by the recording's trace entries."""
    recorded = trace.recorded
    unread = trace.skipped_lines  # known once the trace has been read
    stats = replayer.stats()
    oom = replayer.oom
    fidelity = replayer.fidelity if follow_recording else None
    survived = replayer.recorded_ooms
    if recorded is not None:
        _number_by_entry(recorded, survived + ([oom] if oom is not None else []), fidelity)
    age_guess_entry = _note_start_age_guesses(replayer, recorded, notes)
    timeline = _downsample(replayer.timeline(), MAX_TIMELINE_POINTS)
    return ReplayResult(
        conf=settings.conf,
        capacity=settings.capacity,
        in_use_by_others=settings.others,
        completed=not replayer.stopped,
        events=replayer.events,
        seconds=seconds,
        peak_allocated=stats["allocated_bytes"]["all"]["peak"],
        peak_reserved=stats["reserved_bytes"]["all"]["peak"],
        oom=oom,
        timeline=timeline,
        stats=stats,
        segments=replayer.segments(),
        skipped=replayer.skipped + unread,
        skipped_detail=_skipped_detail(unread, trace.first_skipped, replayer.skipped,
                                       "entries" if recorded is not None else "lines"),
        notes=notes,
        replayer=replayer,
        capacity_source=settings.capacity_source,
        conf_source=settings.conf_source,
        start=trace.start,
        recorded=recorded,
        fidelity=fidelity,
        survived_ooms=survived,
        policy=replayer.policy,
        counters=replayer.counters(),
        allocations=stats["allocation"]["all"]["allocated"],
        start_age_guesses=replayer.start_age_guesses,
        start_age_guess_entry=age_guess_entry,
    )


def _number_by_entry(recorded: Any, ooms: list[dict], fidelity: dict | None) -> None:
    """Give each OOM met, and the first difference from the recording, its trace entry (in place)."""
    for o in ooms:
        o["entry"] = recorded.entry_of(o["index"])
    if fidelity is not None:
        fidelity["first_difference_entry"] = recorded.entry_of(fidelity["first_difference"])


def _note_start_age_guesses(replayer: _core.Replayer, recorded: Any, notes: list[str]) -> int | None:
    """Note where the replay guessed between start segments' ages; the entry of the first guess (None if none)."""
    age_guess_entry = None
    if replayer.start_age_guesses:
        first = replayer.first_start_age_guess
        age_guess_entry = recorded.entry_of(first) if recorded is not None else first
        notes.append(_age_guess_note(age_guess_entry, replayer.start_age_guesses))
    return age_guess_entry


def _age_guess_note(entry: int | None, n: int) -> str:
    """Where the replay chose between two segments of the start state (Note [Start segments' ages])."""
    where = f"entry {entry}" if entry is not None else "an allocation"
    return (f"{where}: equal free blocks lay in two segments made before recording began; PyTorch serves the "
            f"older, which the snapshot does not say, and this replay took the lower address "
            f"({n:,} such choice{'s' if n != 1 else ''})")


def _skipped_detail(unread: int, first: str, refused: int, kind: str) -> str:
    """'3 bad events: 2 trace lines that could not be read (first: line 3: unknown op ...), 1 event refused
    (a free of an id not live, or an alloc of a live id)'; '' when nothing was skipped."""
    if not unread and not refused:
        return ""
    parts = []
    if unread:
        noun = {"lines": ("line", "lines"), "entries": ("entry", "entries")}[kind][unread != 1]
        parts.append(f"{unread:,} trace {noun} that could not be used" + (f" (first: {first})" if first else ""))
    if refused:
        parts.append(f"{refused:,} event{'s' if refused != 1 else ''} refused (a free of an id that is not live, "
                     "or an alloc of one that is)")
    total = unread + refused
    return f"{total:,} bad event{'s' if total != 1 else ''}: " + "; ".join(parts)


def _downsample(timeline: np.ndarray, points: int) -> np.ndarray:
    if len(timeline) <= points:
        return timeline
    group = -(-len(timeline) // points)
    pad = (-len(timeline)) % group
    padded = np.concatenate([timeline, np.repeat(timeline[-1:], pad, axis=0)]) if pad else timeline
    blocks = padded.reshape(-1, group, 3)
    return np.stack([blocks[:, -1, 0], blocks[:, :, 1].max(axis=1), blocks[:, :, 2].max(axis=1)], axis=1)
