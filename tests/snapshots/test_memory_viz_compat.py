"""torch.cuda._memory_viz (PyTorch's own snapshot tools; no GPU needed) reads torchmem's dumps.

Each of its functions runs on our snapshots: segsum (the `stats` command),
trace, trace_plot, segment_plot, and segments / memory with a plain
formatter instead of flamegraph.pl; the totals it prints agree with our
allocator's statistics (free internal + free external + allocated = reserved).
"""
import base64
import pickle
import re

import pytest
from torch.cuda import _memory_viz as mv

from torchmem import _core
from torchmem import replay as sim
from torchmem.runtime.snapshot import dump_snapshot
from torchmem.formats.snapshot_format import build_snapshot, snapshot_from_replay

from tests.support.sim import MiB, sim_allocator
from tests.support.subprocess_runner import ok, run_args, run_python


def allocate_weights(a):
    return [a.allocate(s) for s in (3 * MiB, 25 * MiB, 700 * 1024, 1000, 40 * MiB)]


def snapshot_of_sim(conf=""):
    a = sim_allocator(conf=conf)
    table = _core.StackTable()
    _core.enable_history(a, 10_000, table)
    keep = allocate_weights(a)
    for p in [a.allocate(s) for s in (5 * MiB, 2000, 30 * MiB)]:
        a.deallocate(p)
    a.deallocate(keep.pop(1))
    return a, build_snapshot(a.segments(), _core.history_entries(a), frames_of=table.frames)


def oom_snapshot():
    ev = [{"op": "alloc", "id": i, "size": 6 * MiB} for i in range(20)]
    ev += [{"op": "free", "id": i} for i in range(0, 20, 2)]
    ev += [{"op": "alloc", "id": 100, "size": 200 * MiB}]
    r = sim.replay(ev, "160MiB", history=10_000)
    assert not r.completed
    return r, snapshot_from_replay(r)


def expected(stats):
    requested = stats["requested_bytes"]["all"]["current"]
    allocated = stats["allocated_bytes"]["all"]["current"]
    reserved = stats["reserved_bytes"]["all"]["current"]
    return requested, allocated - requested, reserved - allocated, reserved


def check_segsum(text, stats, nsegments):
    allocated, internal, external, reserved = expected(stats)
    assert f"segments: {nsegments}\n" in text
    assert f"total_reserved: {mv.Bytes(reserved)}\n" in text
    assert f"total_allocated: {mv.Bytes(allocated)}\n" in text
    assert f"total_free: {mv._report_free(external, internal)}\n" in text


@pytest.mark.parametrize("conf", ["", "expandable_segments:True"])
def test_segsum_totals_agree_with_stats(conf):
    a, snap = snapshot_of_sim(conf)
    text = mv.segsum(snap)  # raises AssertionError itself if the parts do not add up
    check_segsum(text, a.stats(), len(snap["segments"]))


def test_segsum_on_replay_with_oom():
    r, snap = oom_snapshot()
    check_segsum(mv.segsum(snap), r.stats, len(snap["segments"]))


def test_trace():
    r, snap = oom_snapshot()
    text = mv.trace(snap)
    n = len(snap["device_traces"][0])
    assert f"Device 0 ----------------\n{n} entries\n" in text
    assert "cudaMalloc(" in text and "raise OutOfMemoryError # 200.0MiB requested" in text
    assert "free completed for" in text
    # Every entry is understood: none is printed raw as a dict.
    assert "{'action'" not in text


def test_trace_plot_and_segment_plot_embed_our_snapshot():
    _, snap = oom_snapshot()
    for page in (mv.trace_plot(snap), mv.trace_plot(snap, plot_segments=True), mv.segment_plot(snap)):
        blob = re.search(r'"base64": "([^"]+)"', page).group(1)
        assert pickle.loads(base64.b64decode(blob)) == snap
    filtered = mv.trace_plot(pickle.loads(pickle.dumps(snap)), filter_freed=True)
    assert "Active Memory Timeline" in filtered


def plain(lines):
    return lines


@pytest.mark.parametrize("fn", [mv.segments, mv.memory])
def test_segments_and_memory_with_plain_formatter(fn):
    a, snap = snapshot_of_sim()
    lines = fn(snap, format_flamegraph=plain).strip().splitlines()
    total = sum(int(line.rsplit(" ", 1)[1]) for line in lines)
    assert total == a.stats()["reserved_bytes"]["all"]["current"]
    live = [line for line in lines if ";active_allocated;" in line]
    assert live and all("test_memory_viz_compat.py" in line and "allocate_weights" in line
                        for line in live if "<gaps>" not in line)
    assert any(";inactive;" in line for line in lines)


def test_compare_two_snapshots(capsys):
    a, before = snapshot_of_sim()
    a.allocate(60 * MiB)
    after = build_snapshot(a.segments(), [])
    lines = mv.compare(before["segments"], after["segments"], format_flamegraph=plain)
    assert lines.startswith("only_after;")


def test_memory_viz_command_line(tmp_path):
    r, snap = oom_snapshot()
    path = tmp_path / "snap.pickle"
    dump_snapshot(path, snap)
    # `python -m torch.cuda._memory_viz stats FILE` (its other commands call the functions tested above).
    out = ok(run_args(["-m", "torch.cuda._memory_viz", "stats", str(path)], timeout=120, cwd=str(tmp_path)))
    check_segsum(out.stdout, r.stats, len(snap["segments"]))


def test_installed_cpu_dump_reads_in_memory_viz(tmp_path):
    path = tmp_path / "cpu.pickle"
    out = run_python(f"""
        import torch, torchmem
        from torch.cuda import _memory_viz as mv
        from torchmem.runtime.snapshot import record_memory_history, dump_snapshot
        from torchmem.formats.snapshot_format import load
        torchmem.install()
        record_memory_history(max_entries=10_000)
        def layer(x):
            return torch.relu(x @ torch.randn(512, 512))
        x = torch.randn(64, 512)
        for _ in range(3):
            x = layer(x)
        dump_snapshot({str(path)!r})
        snap = load({str(path)!r})
        st = torchmem.memory_stats()
        req, alloc, resv = st["requested_bytes.all.current"], st["allocated_bytes.all.current"], st["reserved_bytes.all.current"]
        text = mv.segsum(snap)
        print("reserved", f"total_reserved: {{mv.Bytes(resv)}}" in text)
        print("allocated", f"total_allocated: {{mv.Bytes(req)}}" in text)
        print("free", f"total_free: {{mv._report_free(resv - alloc, alloc - req)}}" in text)
        print("trace", "entries" in mv.trace(snap))
        lines = mv.memory(snap, format_flamegraph=lambda s: s)
        print("stacks", any("layer" in l for l in lines.splitlines() if "active_allocated" in l))
    """, timeout=120)
    assert out.returncode == 0, out.stderr
    for key in ("reserved", "allocated", "free", "trace", "stacks"):
        assert f"{key} True" in out.stdout, out.stdout
