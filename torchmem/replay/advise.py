"""Which allocator setting would have avoided an out-of-memory: the least memory each one needs.

``advise(trace)`` replays a trace under candidate settings (the recorded
one, expandable segments, several max_split_size_mb, garbage collection,
roundup_power2_divisions, pairs of those that help, and torchmem's own
``policy:stitch``) and finds for each the smallest capacity at which the
trace completes, by bisection over replays on a 2 MiB grid. Each
``min_capacity`` holds: the trace completes at it and fails 2 MiB below it.
``min_capacity(trace, conf)`` is that search for one config.

    from torchmem.replay import advise, min_capacity
    for row in advise("snapshot.pickle"):
        print(row.summary())
    print(min_capacity("snapshot.pickle", "policy:stitch"))
"""
from __future__ import annotations

import concurrent.futures
import itertools
import os
import threading
from dataclasses import dataclass
from typing import Callable, Iterable

from torchmem import _core
from torchmem.pytorch_env import conf_items
from torchmem.replay.capacity import recorded_capacity
from torchmem.replay.runner import as_trace, normalize_conf, parse_capacity, replay
from torchmem.sizes import fmt_size
from torchmem.formats.trace_types import Trace

GRID = _core.rules.ROUND_LARGE  # capacities are searched on a 2 MiB grid, the granularity of device allocations
MAX_GROWTH = 64  # give up when a setting does not complete at 64 times the reference capacity
MAX_THREADS = 8  # settings searched at once (at most one per core)

SINGLE_SETTINGS = (
    "expandable_segments:True",
    "max_split_size_mb:64",
    "max_split_size_mb:128",
    "max_split_size_mb:256",
    "max_split_size_mb:512",
    "garbage_collection_threshold:0.8,per_process_memory_fraction:0.99",
    "roundup_power2_divisions:4",
)

# torchmem's least-memory policy (docs/stitch.md): not a PyTorch setting, it
# needs torchmem's allocator installed (TORCHMEM_ALLOC_CONF=policy:stitch).
STITCH = "policy:stitch"
# The keys of a recorded config that still apply under policy:stitch.
STITCH_KEEPS = ("per_process_memory_fraction", "garbage_collection_threshold")



def as_pytorch_setting(conf: str) -> str:
    """A replayed setting as PYTORCH_CUDA_ALLOC_CONF takes it: without reuse_order, the replay's own key for
    the tie rule a snapshot's release implies (torch 2.13+ break ties by segment age by themselves)."""
    return ",".join(item for item in conf_items(conf) if not item.startswith("reuse_order:"))

SEGMENT_AGE_RULE = "reuse_order:segment"  # torch 2.13+'s tie rule, implied by the release (snapshot_trace.py)


def shown_setting(conf: str) -> str:
    """A row's setting as a user types it: without the tie rule the snapshot's release implies."""
    return ",".join(item for item in conf_items(conf) if item != SEGMENT_AGE_RULE)


@dataclass
class Advice:
    """One setting's outcome."""

    conf: str
    min_capacity: int | None   # smallest capacity (2 MiB grid) at which the trace completes; None: not within reach
    peak_reserved: int         # at the reference capacity when it completes there, else at min_capacity
    completes: bool            # at the reference capacity
    capacity: int              # the reference capacity: the snapshot's, the given one, or 80 GiB
    recorded: bool = False     # the run's own setting (a snapshot's recorded one, or PyTorch's defaults if it does not say)
    replays: int = 0
    # The first trace entry where its figures rest on a choice the snapshot cannot settle: one of its replays
    # chose between two segments of the start state whose ages the snapshot lacks (Note [Start segments'
    # ages]), or the recording's own guess (RecordedRun.guess); None: they rest on no such guess.
    guessed_at: int | None = None
    guess: str = ""  # what that choice was between

    @property
    def policy(self) -> str:
        """"stitch" for torchmem's policy:stitch, else "native" (a PyTorch setting)."""
        return "stitch" if is_stitch(self.conf) else "native"

    def to_json(self) -> dict:
        return {"conf": self.conf, "min_capacity": self.min_capacity, "peak_reserved": self.peak_reserved,
                "completes": self.completes, "capacity": self.capacity, "recorded": self.recorded,
                "replays": self.replays, "policy": self.policy, "guessed_at": self.guessed_at,
                "guess": self.guess}

    @property
    def label(self) -> str:
        """The row's name: its setting, and marks for the run's own, torchmem's policy and a guess."""
        return (shown_setting(self.conf) or "(defaults)") + (" [the run's]" if self.recorded else "") + (
            " [torchmem]" if self.policy == "stitch" else "") + (" [guess]" if self.guessed_at is not None else "")

    def summary(self, width: int = 66) -> str:
        """One row of advise's table, its label padded to `width` (advise_words.table)."""
        need = fmt_size(self.min_capacity) if self.min_capacity is not None else "not within reach"
        outcome = "completes" if self.completes else "OOM"
        return (f"{self.label:<{width}} needs {need:>11}, peak reserved {fmt_size(self.peak_reserved):>11}; "
                f"at {fmt_size(self.capacity)}: {outcome}")


def is_stitch(conf: str) -> bool:
    """Whether a config chooses torchmem's policy:stitch."""
    return "policy:stitch" in normalize_conf(conf)


def stitch_candidate(recorded_conf: str) -> str:
    """policy:stitch with the recorded config's keys that still apply to it."""
    keep = [item.strip() for item in conf_items(recorded_conf) if item.partition(":")[0].strip() in STITCH_KEEPS]
    return ",".join([STITCH, *keep])


def candidates(recorded_conf: str, extra: Iterable[str] = (), stitch: bool = True) -> list[str]:
    """The recorded setting first, then the single settings (each added to the recorded one), then extras,
    then (with `stitch`) torchmem's policy:stitch. An extra that chooses a policy is taken as it is."""
    base = recorded_conf.strip()
    out = [base]
    for setting in (*SINGLE_SETTINGS, *extra):
        out.append(setting if is_stitch(setting) else _combine(base, setting))
    if stitch:
        out.append(stitch_candidate(base))
    seen: set[str] = set()
    unique = []
    for conf in out:
        key = normalize_conf(conf)
        if key not in seen:
            seen.add(key)
            unique.append(conf)
    return unique


def _combine(a: str, b: str) -> str:
    """Settings b on top of a (b's value wins for a key both give)."""
    items: dict[str, str] = {}
    for part in (a, b):
        for item in filter(None, (s.strip() for s in conf_items(part))):
            key, _, value = item.partition(":")
            items[key.strip()] = value.strip()
    return ",".join(f"{k}:{v}" for k, v in items.items())


def _added_keys(base: str, conf: str) -> str:
    """The keys `conf` sets beyond `base`, as one string."""
    def keys(c: str) -> set[str]:
        return {item.partition(":")[0].strip() for item in conf_items(c) if item.strip()}
    return ",".join(sorted(keys(conf) - keys(base))) or conf


def advise(
    trace: Trace | str | Iterable[dict],
    capacity: int | str | None = None,
    *,
    device: int | None = None,
    extra: Iterable[str] = (),
    combine: int = 3,
    skip_bad_events: bool = False,
    progress: Callable[[int], None] | None = None,
    in_use_by_others: int | str = 0,
    stitch: bool = True,
) -> list[Advice]:
    """Each candidate setting's least memory, best first.

    Args:
        trace: anything replay() reads.
        capacity: the reference capacity (default: the snapshot's card as
            replay() infers it: capacity.recorded_capacity()).
        device: which device of a snapshot.
        extra: more settings to try, each on top of the recorded one.
        combine: also try pairs of the `combine` best settings that need less
            memory than the recorded one (0: no pairs).
        progress: called with the number of settings done.
        stitch: also try torchmem's policy:stitch (never paired with others).
    """
    trace = as_trace(trace, device, skip_bad_events)
    recorded = trace.recorded
    if capacity is None:
        capacity = recorded_capacity(recorded)[0]
    reference = parse_capacity(capacity)
    base = recorded.conf if recorded is not None and recorded.conf is not None else ""
    done = 0
    results: list[Advice] = []

    def search_one(conf: str) -> Advice:
        nonlocal done
        own = recorded is not None and normalize_conf(conf) == normalize_conf(base)
        advice = _search(trace, conf, reference, in_use_by_others, skip_bad_events, own)
        with lock:
            done += 1
            if progress:
                progress(done)
        return advice

    # The settings are searched side by side, one thread per core: a replay runs in C++ without the GIL.
    lock = threading.Lock()
    workers = max(1, min(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1,
                         MAX_THREADS))
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="torchmem-advise")

    def run_all(confs: list[str]) -> None:
        results.extend(pool.map(search_one, confs))  # in the order given, whichever finishes first

    try:
        _advise_rounds(run_all, results, base, extra, stitch, combine)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    results.sort(key=lambda r: (r.min_capacity is None, r.min_capacity or 0, not r.completes, r.peak_reserved))
    return results


def _advise_rounds(run_all: Callable[[list[str]], None], results: list[Advice], base: str, extra: Iterable[str],
                   stitch: bool, combine: int) -> None:
    """The candidates, then pairs of the `combine` best settings that help (each round searched by run_all)."""
    run_all(list(candidates(base, extra, stitch)))
    if combine:
        baseline = results[0].min_capacity
        helpful = [r for r in results[1:] if r.min_capacity is not None and r.policy == "native"
                   and (baseline is None or r.min_capacity < baseline)]
        helpful.sort(key=lambda r: r.min_capacity)
        best_per_key: dict[str, Advice] = {}  # pair different settings, not two values of one key
        for r in helpful:
            best_per_key.setdefault(_added_keys(base, r.conf), r)
        tried = {normalize_conf(r.conf) for r in results}
        pairs = []
        for a, b in itertools.combinations(list(best_per_key.values())[:combine], 2):
            conf = _combine(a.conf, b.conf)
            try:
                key = normalize_conf(conf)
            except ValueError:
                continue
            if key not in tried:
                tried.add(key)
                pairs.append(conf)
        run_all(pairs)


def min_capacity(
    trace: Trace | str | Iterable[dict],
    conf: str = "",
    *,
    capacity: int | str | None = None,
    device: int | None = None,
    skip_bad_events: bool = False,
    in_use_by_others: int | str = 0,
) -> int | None:
    """The smallest capacity on the 2 MiB grid at which `trace` completes under `conf`
    (it fails 2 MiB below), by the bisection advise() runs; None when it does not complete
    within 64 times the reference capacity (`capacity`: default the snapshot's card as replay()
    infers it, capacity.recorded_capacity()).

        from torchmem.replay import min_capacity
        need = min_capacity("snapshot.pickle", "policy:stitch")
    """
    return search(trace, conf, capacity=capacity, device=device, skip_bad_events=skip_bad_events,
                  in_use_by_others=in_use_by_others).min_capacity


def search(
    trace: Trace | str | Iterable[dict],
    conf: str = "",
    *,
    capacity: int | str | None = None,
    device: int | None = None,
    skip_bad_events: bool = False,
    in_use_by_others: int | str = 0,
) -> Advice:
    """min_capacity() with what the search saw: an Advice for `conf`."""
    trace = as_trace(trace, device, skip_bad_events)
    recorded = trace.recorded
    if capacity is None:
        capacity = recorded_capacity(recorded)[0]
    base = recorded.conf if recorded is not None and recorded.conf is not None else ""
    own = recorded is not None and normalize_conf(conf) == normalize_conf(base)
    return _search(trace, conf, parse_capacity(capacity), in_use_by_others, skip_bad_events, own)


# What a start-age guess chose between (Note [Start segments' ages]).
START_AGE_GUESS = "equal free blocks in two segments made before recording began, whose ages it does not hold"


def _search(trace: Trace, conf: str, reference: int, others: int | str, skip: bool, recorded: bool) -> Advice:
    """Bisection for the least capacity on the grid at which the trace completes under `conf`."""
    replays = 0
    # (entry, what it chose between): the recording's own guess, then each replay's first start-age guess
    guesses: list[tuple[int, str]] = [trace.recorded.guess] if trace.recorded and trace.recorded.guess else []

    def advice(need: int | None, peak: int) -> Advice:
        first = min(guesses, default=(None, ""))
        return Advice(conf, need, peak, completes, reference, recorded, replays, first[0], first[1])

    def attempt(capacity: int):
        nonlocal replays
        replays += 1
        try:
            result = replay(trace, capacity, conf, skip_bad_events=skip, in_use_by_others=others)
        except ValueError as exc:
            if "smaller than the memory held" in str(exc) or "must be less than the capacity" in str(exc):
                return None  # the start state or the memory of others does not even fit
            raise
        if result.start_age_guess_entry is not None:
            guesses.append((result.start_age_guess_entry, START_AGE_GUESS))
        return result

    at_reference = attempt(reference)
    completes = bool(at_reference and at_reference.completed)
    # hi: a grid capacity at which the trace completes.
    hi = _up(reference)
    best = at_reference if hi == reference else attempt(hi)
    while best is None or not best.completed:
        if hi > reference * MAX_GROWTH:
            peak = at_reference.peak_reserved if at_reference else 0
            return advice(None, peak)
        hi *= 2
        best = attempt(hi)
    # lo: a grid capacity at which it fails. Nothing completes below its peak of allocated bytes.
    lo = min(hi - GRID, max(0, _down(best.peak_allocated) - GRID))
    while lo > 0:
        r = attempt(lo)
        if r is None or not r.completed:
            break
        hi, best = lo, r
        lo = _down(lo // 2)
    while hi - lo > GRID:
        mid = _down((lo + hi) // 2)
        r = attempt(mid)
        if r is not None and r.completed:
            hi, best = mid, r
        else:
            lo = mid
    peak = at_reference.peak_reserved if completes else best.peak_reserved
    return advice(hi, peak)


def _up(n: int) -> int:
    return -(-n // GRID) * GRID


def _down(n: int) -> int:
    return n // GRID * GRID
