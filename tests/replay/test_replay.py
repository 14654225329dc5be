"""Replaying traces on the simulated device: formats, results, bad input, the command line.

Faithfulness, a replay making the decisions of the run it replays, is tested
where those replays are: tests/replay/test_replay_exact.py (torchmem's own
recordings, begun mid-run, address by address), tests/replay/test_native_fixtures.py
(PyTorch's decisions on real GPUs) and, on the fake GPU,
tests/fakegpu/test_replay_native_scenarios.py (PyTorch's own allocator).
"""
import json
import pickle

import numpy as np
import pytest

from torchmem import _C

from torchmem.replay import workloads
from torchmem import replay as sim
from torchmem.formats.traces import from_events, write_jsonl
from torchmem.formats.trace_types import Chunk, Trace, TraceError
from torchmem.replay.trace_files import load_trace

from tests.support.sim import GiB, MiB, sim_allocator
from tests.support.subprocess_runner import ok, torchmem_here


def events_of(*ops):
    out = []
    for op in ops:
        if op[0] == "a":
            out.append({"op": "alloc", "id": op[1], "size": op[2], "stream": 0})
        else:
            out.append({"op": "free", "id": op[1]})
    return out


def test_replay_reports_peaks_and_completion():
    evs = events_of(("a", 1, 30 * MiB), ("a", 2, 5 * MiB), ("f", 1), ("a", 3, 12 * MiB), ("f", 2), ("f", 3))
    r = sim.replay(evs, capacity="1GiB")
    assert r.completed and r.oom is None
    assert r.events == 6
    assert r.peak_allocated == 35 * MiB
    assert r.peak_reserved == 30 * MiB + 20 * MiB  # the 12 MiB request reuses the cached 30 MiB block
    assert r.timeline[:, 1].max() == r.peak_allocated
    assert r.timeline[:, 2].max() == r.peak_reserved


def test_replay_reports_the_first_oom_with_figures():
    evs = events_of(("a", 1, 600 * MiB), ("a", 2, 600 * MiB), ("a", 3, 10 * MiB))
    r = sim.replay(evs, capacity="1GiB")
    assert not r.completed
    assert r.events == 1  # stopped at event 1
    o = r.oom
    assert o["index"] == 1 and o["size"] == 600 * MiB
    assert o["allocated"] == 600 * MiB and o["reserved"] == 600 * MiB
    assert "Tried to allocate 600.00 MiB" in o["message"]
    assert "Not fragmentation" in r.explain()


def test_demo_workload_is_a_fragmentation_oom_fixed_by_expandable_segments():
    trace = workloads.fragmenting_training()
    default, expandable = sim.compare(trace, ["", "expandable_segments:True"], capacity="80GiB")
    o = default.oom
    assert o is not None and abs(o["size"] - 4 * GiB) < 2 * MiB  # the fp32 logits of 8 x 2,667 tokens
    assert o["reserved_but_free"] > o["size"] > o["largest_free"]
    assert "Fragmentation" in default.explain()
    assert expandable.completed
    assert expandable.peak_reserved < default.peak_reserved


def test_jsonl_round_trip(tmp_path):
    trace = workloads.transformer_training(workloads.TransformerShape(hidden=512, layers=2, batch=2), [64, 128])
    path = tmp_path / "t.jsonl"
    n = write_jsonl(trace, str(path))
    loaded = load_trace(str(path))
    a = sim.replay(trace, "8GiB")
    b = sim.replay(loaded, "8GiB")
    assert a.events == b.events == n
    assert (a.peak_allocated, a.peak_reserved) == (b.peak_allocated, b.peak_reserved)


@pytest.mark.parametrize(
    "content, fragment",
    [
        ('{"op": "alloc", "id": 1, "size": 512}\n{"op": "alloc", "id": 2, "si', "line 2: not JSON"),
        ('{"op": "malloc", "id": 1, "size": 512}\n', "line 1: unknown op 'malloc'"),
        ('{"op": "alloc", "id": 1, "size": -5}\n', "line 1: id, size and stream must be non-negative"),
        ('{"op": "alloc", "size": 5}\n', "line 1: bad or missing field"),
        ('{"op": "alloc", "id": 1, "size": 0}\n', "line 1: alloc of 0 bytes"),
        ('[1, 2]\n', "unknown format"),
        ("", "empty file"),
    ],
)
def test_bad_jsonl_names_the_line(tmp_path, content, fragment):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(TraceError, match=fragment.replace("(", r"\(").replace("[", r"\[")):
        sim.replay(str(path), "1GiB")


def test_free_of_unknown_id_names_the_event_or_is_skipped(tmp_path):
    evs = events_of(("a", 1, MiB), ("f", 7), ("f", 1), ("f", 1))
    with pytest.raises(TraceError, match="event 1: free of id 7"):
        sim.replay(evs, "1GiB")
    r = sim.replay(evs, "1GiB", skip_bad_events=True)
    assert r.completed and r.skipped == 2


def test_alloc_of_a_live_id_is_an_error():
    with pytest.raises(TraceError, match="event 1: alloc of id 1, which is already live"):
        sim.replay(events_of(("a", 1, MiB), ("a", 1, MiB)), "1GiB")


def test_bad_arguments():
    evs = events_of(("a", 1, MiB))
    with pytest.raises(ValueError, match="capacity must be positive"):
        sim.replay(evs, 0)
    with pytest.raises(ValueError):
        sim.replay(evs, "lots")
    with pytest.raises(ValueError, match="unknown key"):
        sim.replay(evs, "1GiB", "expandable:1")
    with pytest.raises(ValueError, match="less than the capacity"):
        sim.replay(evs, "1GiB", in_use_by_others="2GiB")
    with pytest.raises(FileNotFoundError):
        sim.replay("/nonexistent/trace.jsonl")
    with pytest.raises(ValueError, match="at least one config"):
        sim.compare(evs, [])


def native_snapshot(entries, segments=()):
    """A dict shaped like torch.cuda.memory._snapshot() with one device trace."""
    return {"segments": list(segments), "device_traces": [entries]}


def test_pytorch_snapshot_pickle(tmp_path):
    entries = [
        {"action": "free_requested", "addr": 1 << 29, "size": 512, "stream": 0, "time_us": 0, "frames": []},
        {"action": "free_completed", "addr": 1 << 29, "size": 512, "stream": 0, "time_us": 0, "frames": []},
        {"action": "segment_alloc", "addr": 1 << 30, "size": 20 * MiB, "stream": 0, "time_us": 1, "frames": []},
        {"action": "alloc", "addr": 1 << 30, "size": 3 * MiB, "stream": 0, "time_us": 1, "frames": []},
        {"action": "alloc", "addr": (1 << 30) + 3 * MiB, "size": 3 * MiB, "stream": 0, "time_us": 2, "frames": []},
        {"action": "free_requested", "addr": 1 << 30, "size": 3 * MiB, "stream": 0, "time_us": 3, "frames": []},
        {"action": "free_completed", "addr": 1 << 30, "size": 3 * MiB, "stream": 0, "time_us": 3, "frames": []},
        {"action": "alloc", "addr": 1 << 30, "size": 2 * MiB, "stream": 0, "time_us": 4, "frames": []},  # address reused
        {"action": "snapshot", "addr": 0, "size": 0, "stream": 0, "time_us": 5, "frames": []},
    ]
    # The final segments: the small segment that held the block freed first, and the large one.
    segments = [
        {"address": 1 << 29, "total_size": 2 * MiB, "stream": 0, "segment_type": "small",
         "blocks": [{"address": 1 << 29, "size": 2 * MiB, "state": "inactive"}]},
        {"address": 1 << 30, "total_size": 20 * MiB, "stream": 0, "segment_type": "large",
         "blocks": [{"address": 1 << 30, "size": 2 * MiB, "state": "active_allocated"},
                    {"address": (1 << 30) + 2 * MiB, "size": MiB, "state": "inactive"},
                    {"address": (1 << 30) + 3 * MiB, "size": 3 * MiB, "state": "active_allocated"},
                    {"address": (1 << 30) + 6 * MiB, "size": 14 * MiB, "state": "inactive"}]},
    ]
    path = tmp_path / "snap.pickle"
    path.write_bytes(pickle.dumps(native_snapshot(entries, segments)))
    trace = load_trace(str(path))
    assert trace.start.live_blocks == 1 and trace.start.reserved == 2 * MiB  # the block freed before any alloc
    r = sim.replay(trace, "1GiB")
    assert r.completed and r.exact and r.fidelity["placements_matched"] == 3
    assert r.peak_allocated == 6 * MiB  # the start block was freed before the others were allocated



def test_a_free_requested_long_before_its_completion_ends_the_allocation(tmp_path):
    """As PyTorch's free() of a block used on another stream (record_stream): allocated at the free_requested,
    active until the free_completed, and reusable only then. Native counterpart, recorded by PyTorch's own
    allocator with record_stream: tests/fakegpu/test_replay_record_stream.py."""
    a, b = 1 << 30, (1 << 30) + 64 * MiB
    size = 12 * MiB  # its own segment

    def e(action, addr, stream=0):
        return {"action": action, "addr": addr, "size": size, "stream": stream, "time_us": 0, "frames": []}

    entries = [e("segment_alloc", a), e("alloc", a), e("free_requested", a),  # its stream's work is not done
               e("segment_alloc", b), e("alloc", b),                           # so this cannot take its block
               e("free_completed", a), e("free_requested", b), e("free_completed", b),
               e("alloc", a)]
    segments = [{"address": addr, "total_size": size, "stream": 0, "segment_type": "large",
                 "blocks": [{"address": addr, "size": size, "state": state}]}
                for addr, state in ((a, "active_allocated"), (b, "inactive"))]
    path = tmp_path / "snap.pickle"
    path.write_bytes(pickle.dumps(native_snapshot(entries, segments)))
    ops = np.concatenate([c.ops for c in load_trace(str(path)).chunks()]).tolist()
    # segment, alloc, the request alone, segment, alloc, its completion, a request completed at once, alloc
    assert ops == [3, 0, 8, 3, 0, 1, 1, 0]
    r = sim.replay(str(path))
    assert r.completed and r.exact
    assert r.peak_allocated == size and r.stats["active_bytes"]["all"]["peak"] == 2 * size
    # A release that writes no free_completed frees at the request.
    old = native_snapshot([x for x in entries if x["action"] != "free_completed"], segments)
    path.write_bytes(pickle.dumps(old))
    assert 8 not in np.concatenate([c.ops for c in load_trace(str(path)).chunks()]).tolist()

@pytest.mark.parametrize(
    "payload, fragment",
    [
        (b"\x80\x04\x95", "not a readable snapshot pickle"),
        (pickle.dumps([1, 2, 3]), "not a memory snapshot"),
        (pickle.dumps({"segments": []}), "no device_traces"),
        (pickle.dumps(native_snapshot([{"action": "teleport", "addr": 1, "size": 1}])), "entry 0: unknown action 'teleport'"),
    ],
)
def test_bad_snapshots_name_the_file_and_problem(tmp_path, payload, fragment):
    path = tmp_path / "snap.pickle"
    path.write_bytes(payload)
    with pytest.raises(TraceError) as info:
        sim.replay(str(path), "1GiB")
    assert str(path) in str(info.value) and fragment in str(info.value)


def test_streamed_chunks_keep_memory_bounded_by_live_blocks():
    """A long trace arrives in chunks; the replayer only keeps live ids."""
    n_chunks, per = 20, 50_000

    def chunks():
        for c in range(n_chunks):
            ids = np.arange(c * per, (c + 1) * per, dtype=np.uint64)
            ops = np.zeros(2 * per, dtype=np.uint8)
            ops[1::2] = 1
            yield Chunk(ops, np.repeat(ids, 2), np.full(2 * per, 4096, dtype=np.uint64), np.zeros(2 * per, dtype=np.uint64))

    r = sim.replay(Trace("stream", chunks, total=2 * per * n_chunks), "1GiB")
    assert r.completed and r.events == 2 * per * n_chunks
    assert r.peak_allocated == 4096
    assert len(r.timeline) <= sim.MAX_TIMELINE_POINTS


def test_cli_replay_json_and_plot(tmp_path):
    trace = workloads.transformer_training(workloads.TransformerShape(hidden=1024, layers=2, batch=4), [256, 512])
    path = tmp_path / "t.jsonl"
    write_jsonl(trace, str(path))
    png = tmp_path / "r.png"
    proc = ok(torchmem_here("replay", path, "--capacity", "2GiB", "--json", "--compare", "expandable_segments:True",
                             "--plot", png))
    rows = json.loads(proc.stdout)
    assert [row["conf"] for row in rows] == ["", "expandable_segments:True"]
    for row in rows:
        assert set(row) >= {"completed", "oom", "peak_allocated", "peak_reserved", "events", "seconds"}
    assert png.stat().st_size > 10_000


def test_cli_replay_bad_file_is_a_clear_error(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"op": "free", "id": 3}\n')
    proc = torchmem_here("replay", path)
    assert proc.returncode == 1
    assert "event 0: free of id 3" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_earlier_name_is_gone():
    """torchmem.replay is the one name: torchmem.sim was removed (docs/changes.md)."""
    import importlib

    with pytest.raises(ModuleNotFoundError, match="torchmem.sim"):
        importlib.import_module("torchmem.sim")
