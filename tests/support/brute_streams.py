"""Brute-force liveness under streams, for tests: written from the definition,
independent of the core's vector clocks and sweeps.

Step u on stream s happens before step t on stream x when s == x and u < t,
or when a chain of syncs leads from s (recorded at or after u) to x (waited at
or before t). Two buffers can be live at once unless every use of one happens
before the other's producer. A placement is valid when no two buffers that
can be live at once share a byte.
"""
from __future__ import annotations

import itertools
import random
from typing import Sequence

from torchmem.plan import Buffer, Sync

FAR = 1 << 40


def brute_before(syncs: Sequence[Sync], s: int, u: int, x: int, t: int) -> bool:
    if s == x:
        return u < t
    reach = {s: u}  # stream -> first step from which it knows
    changed = True
    while changed:
        changed = False
        for y in syncs:
            if y.src in reach and y.after >= reach[y.src] and (y.dst not in reach or y.before < reach[y.dst]):
                reach[y.dst] = y.before
                changed = True
    return x in reach and reach[x] <= t


def all_syncs(buffers: Sequence[Buffer]) -> list[Sync]:
    return sorted({s for b in buffers for s in b.syncs})


def uses(b: Buffer) -> list[tuple[int, int]]:
    return [(b.stream, b.lower), (b.stream, b.upper - 1)] + [(r.stream, r.step) for r in b.reads]


def ordered(syncs: Sequence[Sync], a: Buffer, b: Buffer) -> bool:
    """Every use of a happens before b's producer."""
    return all(brute_before(syncs, s, u, b.stream, b.lower) for s, u in uses(a))


def live_at_once(syncs: Sequence[Sync], a: Buffer, b: Buffer) -> bool:
    return a.size > 0 and b.size > 0 and not ordered(syncs, a, b) and not ordered(syncs, b, a)


def brute_valid(buffers: Sequence[Buffer], offsets: Sequence[int], sizes: Sequence[int] | None = None) -> bool:
    syncs = all_syncs(buffers)
    sizes = [b.size for b in buffers] if sizes is None else sizes
    for i, j in itertools.combinations(range(len(buffers)), 2):
        if offsets[i] < 0 or offsets[j] < 0:
            return False
        if offsets[i] < offsets[j] + sizes[j] and offsets[j] < offsets[i] + sizes[i]:
            if sizes[i] and sizes[j] and live_at_once(syncs, buffers[i], buffers[j]):
                return False
    return True


def brute_optimal_height(buffers: Sequence[Buffer]) -> int:
    """The least height of any valid placement: every order of a bottom-up
    placement over the true conflicts (canonical placements reach the
    optimum). Tiny inputs only."""
    syncs = all_syncs(buffers)
    n = len(buffers)
    conflict = [[i != j and live_at_once(syncs, buffers[i], buffers[j]) for j in range(n)] for i in range(n)]
    best = None
    for perm in itertools.permutations(range(n)):
        offsets = [0] * n
        for k, i in enumerate(perm):
            offsets[i] = max([offsets[j] + buffers[j].size for j in perm[:k] if conflict[i][j]], default=0)
        h = max((o + b.size for o, b in zip(offsets, buffers)), default=0)
        best = h if best is None else min(best, h)
    return best or 0


def random_stream_buffers(rng: random.Random, n: int, streams: int, horizon: int = 24) -> list[Buffer]:
    """Random buffers on random streams with random syncs; every read gets a
    sync from its producer when none orders it, and a sync back to the home
    stream when none leads there."""
    syncs: list[Sync] = []
    for _ in range(rng.randint(0, 8) if streams > 1 else 0):
        a = rng.randrange(streams)
        b = (a + rng.randint(1, streams - 1)) % streams
        after = rng.randrange(horizon)
        syncs.append(Sync(a, after, b, after + rng.randint(1, 6)))
    rows = []
    for i in range(n):
        lo = rng.randrange(horizon)
        size = 0 if rng.random() < 0.1 else rng.choice([1, 2, 3, 8, 16, 40])
        home = rng.randrange(streams)
        reads = []
        for _ in range(rng.randint(0, 2) if streams > 1 else 0):
            s = (home + rng.randint(1, streams - 1)) % streams
            step = lo + rng.randint(1, 6)
            if not brute_before(syncs, home, lo, s, step):
                syncs.append(Sync(home, lo, s, step))
            reads.append((s, step))
        rows.append((i, lo, lo + rng.randint(1, 5), size, home, reads))
    for _, _, _, _, home, reads in rows:
        last: dict[int, int] = {}
        for s, step in reads:
            last[s] = max(last.get(s, step), step)
        for s, step in last.items():
            if not brute_before(syncs, s, step, home, FAR):
                syncs.append(Sync(s, step + rng.randint(0, 2), home, step + rng.randint(3, 8)))
    out = [Buffer(i, lo, up, size, home, reads) for i, lo, up, size, home, reads in rows]
    if out:
        out[0] = Buffer(out[0].id, out[0].lower, out[0].upper, out[0].size, out[0].stream, out[0].reads,
                        tuple(syncs))
    return out
