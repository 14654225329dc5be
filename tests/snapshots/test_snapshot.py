"""Snapshots in torch.cuda.memory._snapshot()'s format, their totals, and bad input."""
import json
import pickle
import subprocess

import pytest

from torchmem import _core
from torchmem import replay as sim
from torchmem.runtime.snapshot import dump_snapshot
from torchmem.formats.snapshot_format import build_snapshot, load, snapshot_from_replay, validate_snapshot
from torchmem.formats.trace_types import TraceError
from torchmem.viz.timeline import timeline
from torchmem.viz.totals import totals

from tests.support.sim import MiB, sim_allocator
from tests.support.subprocess_runner import run_ok, run_python, torchmem_here

SEGMENT_KEYS = {"device", "address", "total_size", "stream", "segment_type", "segment_pool_id", "allocated_size",
                "active_size", "requested_size", "is_expandable", "frames", "blocks"}
BLOCK_KEYS = {"address", "size", "requested_size", "state", "frames"}
TRACE_KEYS = {"action", "addr", "size", "stream", "time_us", "frames"}


def make_here(a, size):
    return a.allocate(size)


def sim_snapshot(conf=""):
    a = sim_allocator(conf=conf)
    table = _core.StackTable()
    _core.enable_history(a, 10_000, table)
    keep = [make_here(a, s) for s in (1000, 3 * MiB, 700 * 1024, 25 * MiB, 3 * MiB)]
    drop = [make_here(a, s) for s in (2000, 5 * MiB, 512)]
    for p in drop:
        a.deallocate(p)
    snap = build_snapshot(a.segments(), _core.history_entries(a), frames_of=table.frames)
    return a, keep, snap


def test_format_matches_pytorch():
    a, keep, snap = sim_snapshot()
    assert set(snap) >= {"segments", "device_traces"}
    validate_snapshot(snap)
    for seg in snap["segments"]:
        assert set(seg) == SEGMENT_KEYS
        assert seg["segment_type"] in ("small", "large")
        assert sum(b["size"] for b in seg["blocks"]) == seg["total_size"]
        assert seg["allocated_size"] == sum(b["size"] for b in seg["blocks"] if b["state"] == "active_allocated")
        for b in seg["blocks"]:
            assert set(b) == BLOCK_KEYS
            assert b["state"] in ("active_allocated", "inactive")
    live = {b["address"]: b for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated"}
    assert set(live) == set(keep)
    assert all(live[p]["frames"][0]["name"] == "make_here" for p in keep)
    trace = snap["device_traces"][0]
    assert all(set(e) == TRACE_KEYS for e in trace)
    assert [e["action"] for e in trace].count("alloc") == 8
    assert all(e["frames"] for e in trace if e["action"] == "alloc")


def test_pending_free_and_oom_entries():
    entries = [
        {"action": "segment_alloc", "addr": 0, "size": 2 * MiB, "stream": 0, "time_us": 1, "context": 0},
        {"action": "alloc", "addr": 0, "size": 512, "stream": 0, "time_us": 2, "context": 0},
        {"action": "free_requested", "addr": 0, "size": 512, "stream": 0, "time_us": 3, "context": 0},
        {"action": "oom", "addr": 123, "size": 10**12, "stream": 0, "time_us": 4, "context": 0},
    ]
    segments = [{"address": 0, "total_size": 2 * MiB, "stream": 0, "segment_type": "small", "allocated_size": 512,
                 "requested_size": 512, "is_expandable": False,
                 "blocks": [{"address": 0, "size": 512, "requested_size": 512, "allocated": True, "mapped": True},
                            {"address": 512, "size": 2 * MiB - 512, "requested_size": 0, "allocated": False, "mapped": True}]}]
    snap = build_snapshot(segments, entries)
    assert snap["segments"][0]["blocks"][0]["state"] == "active_pending_free"
    assert snap["segments"][0]["active_size"] == 512
    oom = snap["device_traces"][0][-1]
    assert oom["action"] == "oom" and oom["device_free"] == 123 and "addr" not in oom
    validate_snapshot(snap)


def stats_totals(stats):
    """Our allocator stats in segsum's terms."""
    requested = stats["requested_bytes"]["all"]["current"]
    allocated = stats["allocated_bytes"]["all"]["current"]
    reserved = stats["reserved_bytes"]["all"]["current"]
    return {"allocated": requested, "free_internal": allocated - requested, "free_external": reserved - allocated,
            "reserved": reserved}


@pytest.mark.parametrize("conf", ["", "expandable_segments:True"])
def test_totals_agree_with_stats(conf):
    a, _, snap = sim_snapshot(conf)
    t = totals(snap)
    assert {k: t[k] for k in ("allocated", "free_internal", "free_external", "reserved")} == stats_totals(a.stats())
    assert t["allocated"] + t["free_internal"] + t["free_external"] == t["reserved"]
    assert t["largest_free_block"] == a.largest_free_block()


def fragmenting_events():
    # Interleaved lifetimes: freeing every other block leaves holes no large request fits.
    ev = [{"op": "alloc", "id": i, "size": 6 * MiB} for i in range(20)]
    ev += [{"op": "free", "id": i} for i in range(0, 20, 2)]
    ev += [{"op": "alloc", "id": 100 + i, "size": 30 * MiB} for i in range(3)]
    ev += [{"op": "alloc", "id": 200, "size": 200 * MiB}]
    return ev


def test_replay_snapshot_and_timeline():
    r = sim.replay(fragmenting_events(), "256MiB", history=10_000)
    assert not r.completed
    snap = snapshot_from_replay(r)
    validate_snapshot(snap)
    t = totals(snap)
    assert {k: t[k] for k in ("allocated", "free_internal", "free_external", "reserved")} == stats_totals(r.stats)
    tl = timeline(snap)
    assert tl.events == len(snap["device_traces"][0])
    assert tl.allocated[0] == 0 and tl.reserved[0] == 0  # the history covers the whole replay
    assert tl.allocated[-1] == t["allocated"] and tl.reserved[-1] == t["reserved"]
    assert tl.reserved.max() == r.peak_reserved
    assert len(tl.ooms) == 1 and tl.ooms[0]["size"] == 200 * MiB
    assert tl.largest_free[-1] == t["largest_free_block"]
    assert (tl.largest_free <= tl.reserved[tl.free_index]).all()


def test_replay_without_history_has_segments_only():
    r = sim.replay(fragmenting_events()[:20], "1GiB")
    snap = snapshot_from_replay(r)
    assert snap["device_traces"] == [[]] and snap["segments"]


def test_dump_and_load_roundtrip(tmp_path):
    _, _, snap = sim_snapshot()
    path = tmp_path / "s.pickle"
    dump_snapshot(path, snap)
    assert load(path) == snap


def bad_files(tmp_path):
    _, _, snap = sim_snapshot()
    good = pickle.dumps(snap)
    files = {}

    def put(name, data):
        p = tmp_path / name
        p.write_bytes(data)
        files[name] = p

    put("truncated.pickle", good[: len(good) // 2])
    put("empty.pickle", b"")
    put("text.pickle", b"hello, not a pickle\n")
    put("list.pickle", pickle.dumps([1, 2, 3]))
    put("foreign.pickle", pickle.dumps({"model": "weights"}))
    s = pickle.loads(good)
    s["segments"][0]["blocks"][0]["state"] = "haunted"
    put("state.pickle", pickle.dumps(s))
    s = pickle.loads(good)
    s["device_traces"][0][0]["action"] = "teleport"
    put("action.pickle", pickle.dumps(s))
    s = pickle.loads(good)
    del s["segments"][0]["total_size"]
    put("missing.pickle", pickle.dumps(s))
    s = pickle.loads(good)
    s["segments"][0]["total_size"] = "big"
    put("type.pickle", pickle.dumps(s))
    return files


EXPECT = {
    "truncated.pickle": "truncated", "empty.pickle": "empty file", "text.pickle": "not a pickle",
    "list.pickle": "not a memory snapshot", "foreign.pickle": "not a memory snapshot",
    "state.pickle": "unknown state 'haunted'", "action.pickle": "unknown action 'teleport'",
    "missing.pickle": "missing field 'total_size'", "type.pickle": "field 'total_size' should be int",
}


def test_bad_input_names_file_and_problem(tmp_path):
    for name, path in bad_files(tmp_path).items():
        with pytest.raises(TraceError) as info:
            load(path)
        msg = str(info.value)
        assert str(path) in msg and EXPECT[name] in msg, (name, msg)
    with pytest.raises(FileNotFoundError, match="nope.pickle"):
        load(tmp_path / "nope.pickle")


def test_both_readers_name_a_bad_entry_alike(tmp_path):
    """The stats' reader (snapshot_format.load) and the replay's (load_trace) say "FILE: device D entry I" for a bad entry."""
    _, _, snap = sim_snapshot()
    snap["device_traces"][0][1]["action"] = "teleport"
    path = tmp_path / "bad.pickle"
    path.write_bytes(pickle.dumps(snap))
    with pytest.raises(TraceError) as by_stats:
        load(path)
    with pytest.raises(TraceError) as by_replay:
        sim.load_trace(str(path))
    assert f"{path}: device 0 entry 1: " in str(by_stats.value), str(by_stats.value)
    assert f"{path}: device 0 entry 1: " in str(by_replay.value), str(by_replay.value)


def test_unknown_keys_are_accepted(tmp_path):
    # PyTorch adds keys between releases; readers must not break on them.
    _, _, snap = sim_snapshot()
    snap["segments"][0]["future_field"] = 1
    snap["segments"][0]["blocks"][0]["another"] = {"x": 1}
    snap["external_annotations"] = []
    validate_snapshot(snap)


def test_cli_stats_plot_viz(tmp_path):
    r = sim.replay(fragmenting_events(), "256MiB", history=10_000)
    snap = snapshot_from_replay(r)
    path = tmp_path / "replay.pickle"
    dump_snapshot(path, snap)
    out = torchmem_here("stats", path, "--json")
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert {k: got[k] for k in ("allocated", "free_internal", "free_external", "reserved")} == stats_totals(r.stats)
    text = torchmem_here("stats", path).stdout
    assert "allocated + free internal + free external = reserved" in text
    png = tmp_path / "t.png"
    out = torchmem_here("plot", path, "-o", png, "--json")
    assert out.returncode == 0, out.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and json.loads(out.stdout)["ooms"]
    seg_png = tmp_path / "s.png"
    assert torchmem_here("plot", path, "--segments", "-o", seg_png).returncode == 0
    assert seg_png.stat().st_size > 1000
    page = tmp_path / "p.html"
    assert torchmem_here("viz", path, "-o", page).returncode == 0
    html = page.read_text()
    assert "<svg" in html and "OOM" in html
    assert "http://" not in html and "https://" not in html and "<script" not in html


def test_cli_errors_and_help(tmp_path):
    files = bad_files(tmp_path)
    for cmd in (["stats"], ["plot", "-o", tmp_path / "x.png"], ["viz", "-o", tmp_path / "x.html"]):
        out = torchmem_here(cmd[0], files["truncated.pickle"], *cmd[1:])
        assert out.returncode == 1 and "truncated.pickle" in out.stderr and "Traceback" not in out.stderr
        out = torchmem_here(cmd[0], tmp_path / "missing.pickle", *cmd[1:])
        assert out.returncode == 1 and "missing.pickle" in out.stderr
        assert torchmem_here(cmd[0], "--help").returncode == 0
    no_history = tmp_path / "nohist.pickle"
    dump_snapshot(no_history, snapshot_from_replay(sim.replay(fragmenting_events()[:20], "1GiB")))
    out = torchmem_here("plot", no_history, "-o", tmp_path / "y.png")
    assert out.returncode == 1 and "has no trace (no history)" in out.stderr and out.stderr.count("\n") == 1
    # Without history the segment map and the page still work; the page says how to record.
    assert torchmem_here("plot", no_history, "--segments", "-o", tmp_path / "z.png").returncode == 0
    assert torchmem_here("viz", no_history, "-o", tmp_path / "z.html").returncode == 0
    assert "record_memory_history()" in (tmp_path / "z.html").read_text()


def test_plot_against_time(tmp_path):
    path = tmp_path / "r.pickle"
    dump_snapshot(path, snapshot_from_replay(sim.replay(fragmenting_events(), "256MiB", history=10_000)))
    out = torchmem_here("plot", path, "--time", "-o", tmp_path / "t.png", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["events"] > 0


def test_installed_cpu_allocator_end_to_end(tmp_path):
    path = tmp_path / "cpu.pickle"
    code = f"""
        import torch, torchmem
        from torchmem.runtime.snapshot import memory_snapshot, record_memory_history, dump_snapshot
        from torchmem.formats.snapshot_format import load
        from torchmem.viz.totals import totals
        torchmem.install()
        try:
            record_memory_history(enabled="bogus")
        except ValueError as e:
            print("bad enabled ok")

        def make_activations():
            return [torch.randn(256, 1024) for _ in range(4)]

        record_memory_history(max_entries=10_000)
        keep = make_activations()
        tmp = torch.randn(4096, 512); del tmp
        dump_snapshot({str(path)!r})
        snap = load({str(path)!r})
        names = {{f["name"] for s in snap["segments"] for b in s["blocks"]
                  if b["state"] == "active_allocated" for f in b["frames"][:2]}}
        print("frames", "make_activations" in names)
        acts = {{e["action"] for e in snap["device_traces"][0]}}
        print("actions", sorted(acts & {{"alloc", "free_requested", "free_completed"}}))
        t = totals(snap)
        st = torchmem.memory_stats()
        print("agree", t["allocated"] == st["requested_bytes.all.current"], t["reserved"] == st["reserved_bytes.all.current"])
        record_memory_history("state", stacks=None)
        x = torch.randn(1000)
        print("state traces", memory_snapshot()["device_traces"])
        record_memory_history(None)
        y = torch.randn(1000)
        print("off traces", memory_snapshot()["device_traces"])
    """
    out = run_python(code, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "bad enabled ok" in out.stdout
    assert "frames True" in out.stdout
    assert "actions ['alloc', 'free_completed', 'free_requested']" in out.stdout
    assert "agree True True" in out.stdout
    assert "state traces [[]]" in out.stdout and "off traces [[]]" in out.stdout


def test_record_before_install_says_so():
    """In a fresh interpreter: a test that installs torchmem in this one leaves its CPU allocator behind."""
    out = run_ok("""
        import pytest
        from torchmem.runtime.snapshot import memory_snapshot, record_memory_history

        with pytest.raises(RuntimeError, match=r"torchmem.install\\(\\)"):
            record_memory_history()
        record_memory_history(None)  # stopping what never started is fine
        assert memory_snapshot()["segments"] == []
        with pytest.raises(ValueError, match="max_entries"):
            record_memory_history(max_entries=0)
        with pytest.raises(ValueError, match="stacks"):
            record_memory_history(stacks="cpp")
        print("checked")
    """, timeout=120)
    assert out.strip().endswith("checked")


def pytorch_style_snapshot():
    """A snapshot as torch.cuda.memory._snapshot() writes one on a GPU (keys of torch 2.x)."""
    frames = [{"filename": "/src/model.py", "line": 12, "name": "forward"},
              {"filename": "??", "line": 0, "name": "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc"}]
    base = 0x7F0000000000
    seg = {"device": 0, "address": base, "total_size": 20 * MiB, "allocated_size": 8 * MiB, "active_size": 10 * MiB,
           "requested_size": 8 * MiB - 100, "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0),
           "is_expandable": False, "frames": frames,
           "blocks": [{"address": base, "size": 8 * MiB, "requested_size": 8 * MiB - 100, "state": "active_allocated", "frames": frames},
                      {"address": base + 8 * MiB, "size": 2 * MiB, "requested_size": 2 * MiB, "state": "active_pending_free", "frames": frames},
                      {"address": base + 10 * MiB, "size": 10 * MiB, "requested_size": 0, "state": "inactive", "frames": []}]}
    t = [{"action": "segment_alloc", "addr": base, "size": 20 * MiB, "stream": 0, "time_us": 1, "frames": frames},
         {"action": "alloc", "addr": base, "size": 8 * MiB - 100, "stream": 0, "time_us": 2, "frames": frames,
          "compile_context": "N/A", "user_metadata": ""},
         {"action": "alloc", "addr": base + 8 * MiB, "size": 2 * MiB, "stream": 0, "time_us": 3, "frames": frames},
         {"action": "free_requested", "addr": base + 8 * MiB, "size": 2 * MiB, "stream": 0, "time_us": 4, "frames": frames},
         {"action": "oom", "size": 100 * 2**30, "device_free": 5 * MiB, "stream": 0, "time_us": 5, "frames": frames},
         {"action": "snapshot", "addr": 0, "size": 0, "stream": 0, "time_us": 6, "frames": []}]
    return {"segments": [seg], "device_traces": [t], "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": ""},
            "external_annotations": []}


def test_reads_pytorch_snapshots(tmp_path):
    path = tmp_path / "cuda.pickle"
    dump_snapshot(path, pytorch_style_snapshot())
    snap = load(path)
    t = totals(snap)
    assert (t["allocated"], t["free_internal"], t["free_external"], t["reserved"]) == (8 * MiB - 100, 100, 12 * MiB, 20 * MiB)
    assert t["active_pending_free"] == 2 * MiB and t["largest_free_block"] == 10 * MiB
    tl = timeline(snap)
    assert tl.allocated[-1] == 10 * MiB - 100  # a pending free still holds its bytes
    assert tl.reserved[0] == 0 and tl.reserved[-1] == 20 * MiB
    assert tl.ooms[0]["device_free"] == 5 * MiB and tl.largest_free[-1] == 10 * MiB
    for args in (["plot", path, "-o", tmp_path / "a.png"], ["plot", path, "--segments", "-o", tmp_path / "b.png"],
                 ["viz", path, "-o", tmp_path / "c.html"], ["stats", path]):
        out = torchmem_here(*args)
        assert out.returncode == 0, out.stderr
    assert "model.py:12 forward" in (tmp_path / "c.html").read_text()


def test_device_index_places_traces():
    a, _, _ = sim_snapshot()
    snap = build_snapshot(a.segments(), _core.history_entries(a), device=2)
    assert [len(t) > 0 for t in snap["device_traces"]] == [False, False, True]
    assert {s["device"] for s in snap["segments"]} == {2}
    assert timeline(snap).device == 2 and timeline(snap).reserved[-1] == totals(snap)["reserved"]


def test_a_replayed_pending_free_reads_as_the_snapshot_names_it(tmp_path):
    """A free still waiting for another stream's work when the snapshot was taken: PyTorch calls the block
    active_pending_free, the replay says active but not allocated; block_state names both alike."""
    from torchmem.formats.snapshot_format import block_state

    base = 0x7F0000000000  # an address a card hands out
    entries = [
        {"action": "segment_alloc", "addr": base, "size": 2 * MiB, "stream": 0, "time_us": 1, "context": 0},
        {"action": "alloc", "addr": base, "size": 512, "stream": 0, "time_us": 2, "context": 0},
        {"action": "alloc", "addr": base + 512, "size": 1024, "stream": 0, "time_us": 3, "context": 0},
        {"action": "free_requested", "addr": base, "size": 512, "stream": 0, "time_us": 4, "context": 0},
        {"action": "free_requested", "addr": base + 512, "size": 1024, "stream": 0, "time_us": 5, "context": 0},
        {"action": "free_completed", "addr": base + 512, "size": 1024, "stream": 0, "time_us": 6, "context": 0},
    ]
    segments = [{"address": base, "total_size": 2 * MiB, "stream": 0, "segment_type": "small", "allocated_size": 512,
                 "requested_size": 512, "is_expandable": False,
                 "blocks": [{"address": base, "size": 512, "requested_size": 512, "allocated": True, "mapped": True},
                            {"address": base + 512, "size": 2 * MiB - 512, "requested_size": 0, "allocated": False,
                             "mapped": True}]}]
    snap = build_snapshot(segments, entries)
    path = tmp_path / "pending.pickle"
    path.write_bytes(pickle.dumps(snap))
    replayed = sim.replay(str(path), capacity=64 * MiB)
    recorded = [[(b["address"], block_state(b)) for b in s["blocks"]] for s in snap["segments"]]
    assert [[(b["address"], block_state(b)) for b in s["blocks"]] for s in replayed.segments] == recorded
    assert recorded == [[(base, "active_pending_free"), (base + 512, "inactive")]]
