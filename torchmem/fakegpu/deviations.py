"""Open deviations of torchmem's replay from PyTorch's native allocator, found
by the differential oracle (torchmem.fakegpu.oracle) and not yet fixed.

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

from torchmem.fakegpu.oracle import Workload


def _stat_keys(problem: str) -> set[str]:
    return set(re.findall(r"([a-z_.]+) -?\d+ vs", problem))


def _only_stats(problems: list[str], keys: set[str]) -> bool:
    return all(p.startswith("statistics") and _stat_keys(p) <= keys for p in problems)


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
        "after a failed device allocation. The replay makes the recording's releases itself and infers those "
        "retries (torchmem/replay/retries.py) only where a recorded OOM gives the card's size and no garbage "
        "collection runs; a program's empty_cache() just before a new segment on a full card counts as one.",
        lambda w, p: _only_stats(p, {"num_alloc_retries"}),
    ),
    Deviation(
        "fraction-limit",
        "a memory fraction (set_per_process_memory_fraction or per_process_memory_fraction), with or without "
        "garbage_collection_threshold: the replay does not know the fraction's limit unless an out-of-memory "
        "error shows it, so it runs out of memory, collects garbage or releases its cache at other moments.",
        lambda w, p: bool(w.fraction) or _conf_has(w, "per_process_memory_fraction", "garbage_collection"),
    ),
    Deviation(
        "mid-way-segment-age",
        "a run recorded mid-way on torch 2.13+: the age of the segments made before recording began is not in "
        "the snapshot (the replay takes their address order), so a tie between equal free blocks in them, "
        "which PyTorch breaks by segment age, can go the other way.",
        lambda w, p: bool(w.record_at) and all(x.startswith(("trace differs", "final segments")) for x in p),
    ),
    Deviation(
        "expandable-range-placement",
        "expandable_segments:True: the replay reserves a pool's address range at another address than PyTorch "
        "did on the fake GPU (the card's size, which sets each range's size, is inferred from the spacing of "
        "the recorded ranges, and ranges recorded next to each other defeat that), so pages map elsewhere.",
        lambda w, p: _conf_has(w, "expandable_segments:True"),
    ),
)


def classify(workload: Workload, problems: list[str]) -> Deviation | None:
    """The open deviation these problems belong to, or None (a new divergence).

    A replay that raised, or a native run that failed, is never a deviation.
    """
    if any(not p.startswith(("trace differs", "final segments", "statistics differ")) for p in problems):
        return None
    for deviation in DEVIATIONS:
        if deviation.matches(workload, problems):
            return deviation
    return None
