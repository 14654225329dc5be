"""Preflight against real-GPU recordings, on the figures of both sides (tests/data/preflight_vs_real/README.md).

The peaks the comparison rebuilds from a trace are held to PyTorch's own
memory_stats() of the same run; a case whose versions match the real run's
is held to agreeing event by event.
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from torchmem.preflight.compare import compare, events_and_peaks
from torchmem.replay import replay, snapshot_trace

DATA = Path(__file__).resolve().parents[1] / "data" / "preflight_vs_real"
META = json.loads((DATA / "meta.json").read_text())


def load(path: Path) -> dict:
    with gzip.open(path, "rt") as f:
        return json.load(f)


@pytest.mark.parametrize("name", sorted(META))
def test_rebuilt_peaks_are_pytorchs_memory_stats(name):
    meta = META[name]
    _, segments, peaks = events_and_peaks(load(DATA / name), start=meta["start_entry"])
    assert [peaks.allocated, peaks.reserved] == meta["memory_stats_peaks"]
    assert peaks.approximate == 0


def test_niu_on_the_recorded_torch_agrees_event_by_event():
    meta = META["niu_preflight_torch2_6_0.json.gz"]
    c = compare(load(DATA / meta["real"]), load(DATA / "niu_preflight_torch2_6_0.json.gz"))
    assert c.agrees, c.to_json()["first"]
    assert c.events_real == c.events_other == c.matching > 2000
    assert c.peak_difference("allocated") == 0.0 and c.peak_difference("reserved") == 0.0


def test_niu_on_a_later_torch_makes_other_requests_at_model_creation():
    # torch 2.14's nn.init.trunc_normal_ samples by rejection on the device; 2.6's used erfinv in place
    c = compare(load(DATA / "../native/niuhuangxiaozi.json.gz"), load(DATA / "niu_preflight_torch2_14_1.json.gz"))
    assert c.first_request is not None and c.events_other > c.events_real
    assert c.peaks_real.allocated == c.peaks_other.allocated


def test_xiaolin_window_has_the_real_runs_requests_and_peaks():
    meta = META["xiaolin128_preflight_torch2_6_0.json.gz"]
    real = load(DATA / meta["real"])
    c = compare(real, load(DATA / "xiaolin128_preflight_torch2_6_0.json.gz"), other_start=meta["start_entry"])
    assert c.first_request is None  # every request, in order; placements may differ
    assert c.segments_real == c.segments_other == []  # the window makes no segment: all were made in warm-up
    exact = replay(snapshot_trace(real, "xiaolin128_real"))
    assert (exact.fidelity or {}).get("placements_differed") == 0
    assert [exact.peak_allocated, exact.peak_reserved] == [c.peaks_other.allocated, c.peaks_other.reserved]
