"""Pairs of native workloads that prove what a snapshot cannot tell.

Each pair's two runs leave snapshots that are equal in every field, but for
the entries' timestamps, yet PyTorch continued them differently: one
counted a retry the other did not, or one placed the next allocation in
another segment. No replay of that snapshot can be exact on both, so a
case of such a deviation is not a fault of the replay's rules but a fact
the file does not hold. tests/fakegpu/test_indistinguishable_pairs.py runs
the pairs under PyTorch's allocator on the fake GPU and holds each to this.

A pair is either:
- `same_snapshot`: both runs' whole snapshots are equal and what PyTorch
  reported (`differs_in`, a statistic) is not;
- a continuation (`same_snapshot` False): the runs without their last op
  leave equal snapshots, and the last op (an allocation) lands at another
  address in each.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from typing import Any

from tests.support.oracle import GiB, MiB, Workload


@dataclass(frozen=True)
class Pair:
    deviation: str      # the name in tests.support.deviations
    what: str           # what the two runs did differently, which the snapshot does not hold
    first: Workload
    second: Workload
    same_snapshot: bool = True
    differs_in: str = ""  # for same_snapshot: the statistic PyTorch reported differently
    since: tuple[int, int] = (0, 0)  # the first torch release whose allocator behaves so

    def prefixes(self) -> tuple[Workload, Workload]:
        """The runs without their last op (a continuation pair's snapshot before it diverges)."""
        return (replace(self.first, ops=self.first.ops[:-1]), replace(self.second, ops=self.second.ops[:-1]))


def _workload(ops: list, conf: str = "", stacks: bool = False, fraction: float | None = None,
              record_at: int = 0) -> Workload:
    return Workload(seed=0, conf=conf, card=GiB, ops=ops, fraction=fraction, record_at=record_at, stacks=stacks)


PAIRS: tuple[Pair, ...] = (
    Pair(
        "retry-count",
        "without Python stacks: the program's empty_cache() before a request that fits, against a request that "
        "fails, releases the same cache and retries",
        _workload([["a", 0, 600 * MiB, 0], ["f", 0], ["e"], ["a", 1, 700 * MiB, 0]]),
        _workload([["a", 0, 600 * MiB, 0], ["f", 0], ["a", 1, 700 * MiB, 0]]),
        differs_in="num_alloc_retries",
    ),
    Pair(
        "retry-count",
        "with Python stacks, under garbage_collection_threshold and a fraction the program set (not in the "
        "snapshot): the collector releases a cached segment before a request, against a request over the "
        "fraction's limit that releases it and retries; both releases are under the request's stack",
        _workload([["a", 0, 300 * MiB, 0], ["f", 0], ["a", 1, 400 * MiB, 0]],
                  conf="garbage_collection_threshold:0.6", stacks=True, fraction=0.45),
        _workload([["a", 0, 300 * MiB, 0], ["f", 0], ["a", 1, 400 * MiB, 0]],
                  conf="garbage_collection_threshold:0.6", stacks=True, fraction=0.6),
        differs_in="num_alloc_retries",
    ),
    Pair(
        "mid-way-segment-age",
        "recorded mid-way: two equal segments made before recording began, the lower one first or last; "
        "PyTorch (torch 2.14+) serves a tie between their free blocks from the older",
        _workload([["a", 0, 40 * MiB, 0], ["a", 1, 40 * MiB, 0], ["f", 0], ["f", 1], ["a", 2, 30 * MiB, 0]],
                  record_at=2),
        _workload([["a", 9, 40 * MiB, 0], ["a", 1, 40 * MiB, 0], ["f", 9], ["e"], ["a", 0, 40 * MiB, 0],
                   ["f", 0], ["f", 1], ["a", 2, 30 * MiB, 0]], record_at=5),
        same_snapshot=False,
        since=(2, 13),  # torch 2.11 and earlier break the tie by address, which the snapshot holds
    ),
)


def snapshot_view(snapshot: dict[str, Any]) -> dict[str, Any]:
    """The snapshot less what differs between any two runs: each trace entry's time_us."""
    view = copy.deepcopy(snapshot)
    for trace in view.get("device_traces", []):
        for entry in trace:
            entry.pop("time_us", None)
    return view


def first_difference(a: Any, b: Any, where: str = "snapshot") -> str | None:
    """Where two snapshot views first differ, in words; None when equal."""
    if type(a) is not type(b):
        return f"{where}: {type(a).__name__} against {type(b).__name__}"
    if isinstance(a, dict):
        for key in sorted(set(a) | set(b), key=str):
            if key not in a or key not in b:
                return f"{where}[{key!r}] is in one only"
            found = first_difference(a[key], b[key], f"{where}[{key!r}]")
            if found:
                return found
        return None
    if isinstance(a, (list, tuple)):
        if len(a) != len(b):
            return f"{where}: {len(a)} items against {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            found = first_difference(x, y, f"{where}[{i}]")
            if found:
                return found
        return None
    return None if a == b else f"{where}: {a!r} against {b!r}"
