"""The replayer's events that carry what the replay infers from a recording (csrc/core/replay/replayer.h).

RANGE_OFFER: a base a failed request may reserve its expandable range at,
a guess, so one left untaken is no recorded segment missed. RECORDED_RETRY:
the recording's allocator retried there, which a replay that follows the
recording counts in num_alloc_retries (torchmem/replay/retries.py).
"""
from __future__ import annotations

import numpy as np

from torchmem import _core
from torchmem.formats.trace_types import ALLOC, FREE, RANGE_OFFER, RECORDED_RETRY, SEGMENT_ADDRESS

MiB = 1 << 20
GiB = 1 << 30
BASE = 64 * GiB  # above any address the simulated device hands out by itself


def run(conf: str, ops: list[int], sizes: list[int], addrs: list[int], follow: bool = True) -> _core.Replayer:
    """A replay of these events on a 1 GiB card (id = the event's position; a FREE frees id 0)."""
    replayer = _core.Replayer(GiB, 0, conf, 1, False, follow)
    n = len(ops)
    ids = [0 if op == FREE else k for k, op in enumerate(ops)]
    replayer.run(np.array(ops, dtype=np.uint8), np.array(ids, dtype=np.uint64), np.array(sizes, dtype=np.uint64),
                 np.zeros(n, dtype=np.uint64), np.array(addrs, dtype=np.uint64))
    return replayer


def placed(replayer: _core.Replayer) -> list[int]:
    return [b["address"] for s in replayer.segments() for b in s["blocks"] if b["allocated"]]


def test_a_range_offer_left_untaken_is_not_a_recorded_segment_missed():
    """Fixed segments take neither kind of offer of a range: a recorded one left is a miss, a guess is not."""
    guess = run("", [RANGE_OFFER, ALLOC], [0, MiB], [BASE, 0]).fidelity
    recorded = run("", [SEGMENT_ADDRESS, ALLOC], [0, MiB], [BASE, 0]).fidelity
    assert guess["segments_missed"] == 0 and guess["segments_followed"] == 0
    assert recorded["segments_missed"] == 1


def test_a_range_offer_taken_puts_the_range_there_and_counts_as_followed():
    replayer = run("expandable_segments:True", [RANGE_OFFER, ALLOC], [0, MiB], [BASE, 0])
    assert placed(replayer) == [BASE]
    assert replayer.fidelity["segments_followed"] == 1 and replayer.fidelity["segments_missed"] == 0


def test_a_recorded_retry_counts_when_the_replay_follows_the_recording_only():
    events = [ALLOC, FREE, RECORDED_RETRY, ALLOC, RECORDED_RETRY, ALLOC]
    sizes, addrs = [30 * MiB, 0, 0, 30 * MiB, 0, 30 * MiB], [0] * 6
    assert run("", events, sizes, addrs).stats()["num_alloc_retries"] == 2
    assert run("", events, sizes, addrs, follow=False).stats()["num_alloc_retries"] == 0


def test_a_replay_stopped_by_an_oom_counts_no_retry_after_it():
    """The second request is more than the card: the allocator's own retry counts, the one after does not."""
    stopped = run("", [ALLOC, ALLOC, RECORDED_RETRY, ALLOC], [MiB, 2 * GiB, 0, MiB], [0] * 4)
    alone = run("", [ALLOC, ALLOC], [MiB, 2 * GiB], [0] * 2)
    assert stopped.stopped and alone.stopped
    assert stopped.stats()["num_alloc_retries"] == alone.stats()["num_alloc_retries"]
