"""Open deviations of torchmem's replay from PyTorch's native allocator, found
by the differential oracle (tests.support.oracle) and not yet fixed.

Each names what differs, where it shows, and its shrunk reproducer in
tests/fakegpu/reproducers/. A diverging case of the suite must match one of
these, or the suite fails; a reproducer that stops diverging fails too (the
deviation is fixed: remove it here and keep the reproducer as a test of the
fix). tests/fakegpu/test_native_oracle.py holds the suite to this list;
benchmarks/bench_native_fidelity.py counts them; docs/fakegpu.md lists them.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

from tests.support.oracle import Workload


def _stat_keys(problem: str) -> set[str]:
    return set(re.findall(r"([a-z_.]+) -?\d+ vs", problem))


def _only_stats(problems: list[str], keys: set[str]) -> bool:
    return all(p.startswith("statistics") and _stat_keys(p) <= keys for p in _differences(problems))


def _differences(problems: list[str]) -> list[str]:
    """The problems less oracle.compare's lines on what the replay's notes said (a guess, a start range
    rebuilt as fixed segments)."""
    return [p for p in problems if not p.startswith(("guessed", "rebuilt"))]  # both kinds of "guessed ..." line


def _guessed_first(problems: list[str]) -> bool:
    """Whether the replay chose between start segments of unknown age at or before the first difference."""
    guessed = [int(m) for p in problems for m in re.findall(r"^guessed start segments' ages at entry (\d+)", p)]
    differs = [int(m) for p in problems for m in re.findall(r"^trace differs at entry (\d+)", p)]
    return bool(guessed) and (not differs or guessed[0] <= differs[0])


def _conf_has(w: Workload, *keys: str) -> bool:
    return any(k in w.conf for k in keys)


def _trace_records_pools() -> bool:
    """torch 2.13 and later write each trace entry's pool_id (the oracle's native runs use this torch)."""
    import torch

    major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    return (major, minor) >= (2, 13)


@dataclass(frozen=True)
class Deviation:
    name: str
    what: str
    matches: Callable[[Workload, list[str]], bool]


DEVIATIONS: tuple[Deviation, ...] = (
    Deviation(
        "unrecorded-pool",
        "torch 2.11 writes no pool_id into its trace entries, only the final segments' segment_pool_id: an "
        "allocation in a CUDA graph's or MemPool's pool whose segments are gone by the end is replayed in the "
        "default pool (or a later pool at its addresses), so it and what follows can land elsewhere. Snapshots of "
        "torch 2.13 and later replay their pools exactly.",
        lambda w, p: any(op[0] in ("g", "m") for op in w.ops) and not _trace_records_pools(),
    ),
    Deviation(
        "retry-count",
        "num_alloc_retries: PyTorch counts a retry each time it releases its whole cache and allocates again "
        "after a failed device allocation. A trace shows the releases, not the failure. The replay counts a run "
        "of releases before a new segment as a retry (torchmem/replay/retries.py) where the allocator could not "
        "have made the segment before it (over the card's memory, known from a recorded OOM, else at least the "
        "most the recording held, or over a memory fraction's limit) and the run is not what "
        "max_split_size_mb's first, uncounted release would free. Where the trace records Python stacks "
        "(PyTorch's default), they tell the allocator's releases from the program's empty_cache(), and the count "
        "is exact but under garbage_collection_threshold where the memory fraction is the program's "
        "(set_per_process_memory_fraction, not in the snapshot): the collector acts "
        "over its threshold, a share of the fraction's limit, and its release before a request leaves the same"
        " trace as a retry's after a refusal. Without stacks, a program's empty_cache() just before a request "
        "leaves the same releases as a retry. A case counts here only where the replay's notes name such a run.",
        lambda w, p: (not w.stacks or _conf_has(w, "garbage_collection_threshold"))
        and any(x.startswith("guessed retries") for x in p) and _only_stats(p, {"num_alloc_retries"}),
    ),
    Deviation(
        "mid-way-segment-age",
        "a run recorded mid-way (or whose history's ring wrapped) on torch 2.13+: the age of the segments made "
        "before recording began is not in "
        "the snapshot (the replay takes their address order), so a tie between equal free blocks in them, "
        "which PyTorch breaks by segment age, can go the other way. The replay says at which entry it first "
        "chose (Note [Start segments' ages]); a case counts here only where that choice came at or before the "
        "first difference.",
        lambda w, p: not w.from_start and _guessed_first(p)
        and all(x.startswith(("trace differs", "final segments")) for x in _differences(p)),
    ),
)


def proved() -> set[str]:
    """The deviations that a pair of native runs proves the snapshot cannot tell (tests.support.indistinguishable)."""
    from tests.support.indistinguishable import PAIRS

    return {pair.deviation for pair in PAIRS}


def classify(workload: Workload, problems: list[str]) -> Deviation | None:
    """The open deviation these problems belong to, or None (a new divergence).

    A replay that raised, or a native run that failed, is never a deviation.
    """
    if any(not p.startswith(("trace differs", "final segments", "statistics differ")) for p in _differences(problems)):
        return None
    for deviation in DEVIATIONS:
        if deviation.matches(workload, problems):
            return deviation
    return None
