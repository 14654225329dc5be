"""Faithfulness to PyTorch: replays of real GPU snapshots make the native allocator's decisions.

The fixtures (tests/data/native, README there) keep the figures of snapshots
written on real GPUs by PyTorch's own caching allocator. Each replay must:
ask the device for the same segment sizes in the same order, put every
allocation at the address the GPU gave it, end with the recorded final
segments block by block, and reproduce a recorded OOM at the same request
with the same reserved bytes. Nothing here was produced by torchmem.
"""
import gzip
import json
from pathlib import Path

import pytest

from tests.support.replay_recording import segment_layout
from torchmem import replay as sim
from torchmem.replay import snapshot_trace
from torchmem.formats.snapshot_format import snapshot_from_replay

FIXTURES = sorted((Path(__file__).parents[1] / "data" / "native").glob("*.json.gz"))


def load(path: Path) -> dict:
    with gzip.open(path, "rt") as f:
        return json.load(f)


def test_fixtures_are_present():
    assert len(FIXTURES) >= 4


@pytest.fixture(params=FIXTURES, ids=lambda p: p.name.split(".")[0])
def native(request):
    snapshot = load(request.param)
    trace = snapshot_trace(snapshot, request.param.name)
    result = sim.replay(trace, history=1 << 20)
    return snapshot, trace, result


def test_segment_sizes_in_order(native):
    snapshot, trace, result = native
    device = trace.recorded.device
    entries = snapshot["device_traces"][device]
    if result.oom:  # the replay stops at the recorded OOM
        entries = entries[: trace.recorded.oom["entry"]]
    native_sizes = [e["size"] for e in entries if e["action"] == "segment_alloc"]
    replayed = snapshot_from_replay(result)["device_traces"][0]
    assert [e["size"] for e in replayed if e["action"] == "segment_alloc"] == native_sizes


def test_every_allocation_at_its_native_address(native):
    snapshot, trace, result = native
    device = trace.recorded.device
    entries = snapshot["device_traces"][device]
    if result.oom:
        entries = entries[: trace.recorded.oom["entry"]]
    native_addrs = [e["addr"] for e in entries if e["action"] == "alloc"]
    replayed = [e["addr"] for e in snapshot_from_replay(result)["device_traces"][0] if e["action"] == "alloc"]
    assert replayed == native_addrs
    assert result.exact and result.fidelity["placements_matched"] == len(native_addrs)


def test_final_segments_block_by_block(native):
    snapshot, trace, result = native
    if not result.completed:
        pytest.skip("ends in an OOM: the replay stops there, the snapshot was taken later")
    final = [s for s in snapshot["segments"] if s.get("device", 0) == trace.recorded.device]
    assert segment_layout(result.segments) == segment_layout(final)


def test_recorded_oom_reproduced_with_native_reserved_bytes(native):
    snapshot, trace, result = native
    if trace.recorded.oom is None:
        assert result.completed
        return
    assert result.capacity_source == "oom"
    oom = result.recorded_oom
    assert oom["reproduced"] and oom["replay_reserved"] == oom["reserved"]
    assert result.oom["size"] == oom["size"]


@pytest.mark.parametrize("fraction", [0.25, 0.5, 0.75])
@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name.split(".")[0])
def test_native_runs_cut_mid_way_replay_exactly(path, fraction):
    """The native traces cut at a quarter, half and three quarters: as if recording had begun there.
    The start state is rebuilt from what the GPU did, and every later allocation must land where it did."""
    snapshot = load(path)
    device = max(range(len(snapshot["device_traces"])), key=lambda d: len(snapshot["device_traces"][d]))
    entries = snapshot["device_traces"][device]
    snapshot["device_traces"][device] = entries[int(len(entries) * fraction):]
    trace = snapshot_trace(snapshot, f"{path.name} from {fraction:.0%}")
    result = sim.replay(trace)
    assert result.exact, result.fidelity
    if result.completed:
        final = [s for s in snapshot["segments"] if s.get("device", 0) == device]
        assert segment_layout(result.segments) == segment_layout(final)
    else:
        assert result.recorded_oom["reproduced"]
