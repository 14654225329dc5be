"""policy:stitch, the least-memory policy (csrc/core/policy/stitch/stitch_allocator.h, docs/stitch.md).

Random sequences with the invariants checked after every operation, the
stitching itself, the replay and advise surfaces, the CPU install, and that
the native policy is unchanged by the policy key.
"""
import json
import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.sim import GiB, MiB
from tests.support.subprocess_runner import run_python
from torchmem import _core
from torchmem.replay import workloads
from torchmem import replay as sim
from torchmem.cli import main
from torchmem.replay import advise
from torchmem.formats.snapshot_format import snapshot_from_replay, validate_snapshot

PAGE = 2 * MiB


def stitch(capacity=1 * GiB, conf="policy:stitch"):
    return _core.device_allocator(_core.SimDevice(capacity), conf)


def pages_touched(live):
    """Pages (of 2 MiB) that the live blocks touch: all the memory the policy should need."""
    pages = set()
    for p, size in live.items():
        pages.update(range(p // PAGE, (p + size - 1) // PAGE + 1))
    return len(pages)


# ---------------------------------------------------------------------------
# Random sequences

sizes = st.one_of(st.integers(1, 4096), st.integers(1, 2 * MiB), st.integers(MiB, 40 * MiB))
ops = st.lists(
    st.one_of(
        st.tuples(st.just("malloc"), sizes, st.integers(0, 2)),
        st.tuples(st.just("free"), st.integers(0, 10**6), st.just(0)),
        st.tuples(st.just("empty_cache"), st.just(0), st.just(0)),
        st.tuples(st.just("fraction"), st.sampled_from([0.5, 0.9, 1.0]), st.just(0)),
    ),
    max_size=80,
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops, capacity_mb=st.sampled_from([16, 64, 256, 4096]), host=st.booleans())
def test_random_sequences_keep_invariants(ops, capacity_mb, host):
    device = _core.HostDevice(capacity_mb * MiB) if host else _core.SimDevice(capacity_mb * MiB)
    a = _core.device_allocator(device, "policy:stitch")
    live = {}  # address -> requested size: the reference model
    rounded = {}
    fraction = 1.0
    for op, value, stream in ops:
        if op == "malloc":
            try:
                p = a.allocate(value, stream)
            except torch.OutOfMemoryError:
                a.check_invariants()
                # Out of memory only when the request's pages cannot fit beside the live blocks' pages:
                # the free tail of a range always takes it with at most ceil(size / page) new pages.
                need = -(-value // PAGE)
                limit = min(capacity_mb * MiB, int(fraction * capacity_mb * MiB))
                assert (pages_touched(rounded) + need) * PAGE > limit, (value, pages_touched(rounded), limit)
                continue
            assert p % 512 == 0 and p not in live
            for q, size in live.items():  # no live block overlaps another
                assert p + value <= q or q + size <= p
            live[p] = value
            rounded[p] = -(-value // 512) * 512
            if host:
                ctypes_fill(p, min(value, 4096), len(live) & 0xFF)
        elif op == "free" and live:
            p = sorted(live)[value % len(live)]
            a.deallocate(p)
            del live[p], rounded[p]
        elif op == "empty_cache":
            a.empty_cache()
            # Nothing cached after empty_cache: reserved is exactly the pages the live blocks touch.
            assert a.stats()["reserved_bytes"]["all"]["current"] == pages_touched(rounded) * PAGE
        elif op == "fraction":
            fraction = value
            a.set_memory_fraction(value)
        a.check_invariants()
        stats = a.stats()
        assert stats["allocation"]["all"]["current"] == len(live)
        assert stats["requested_bytes"]["all"]["current"] == sum(live.values())
        assert stats["allocated_bytes"]["all"]["current"] == sum(rounded.values())
        assert stats["reserved_bytes"]["all"]["current"] >= pages_touched(rounded) * PAGE
        assert stats["reserved_bytes"]["all"]["current"] <= capacity_mb * MiB
        assert sum(s["total_size"] for s in a.segments()) == stats["reserved_bytes"]["all"]["current"]
    for p in list(live):
        a.deallocate(p)
    a.empty_cache()
    a.check_invariants()
    assert a.stats()["reserved_bytes"]["all"]["current"] == 0
    assert a.segments() == []
    assert device.free_bytes == device.total_bytes


def ctypes_fill(addr, size, value):
    import ctypes

    ctypes.memset(addr, value, size)


# ---------------------------------------------------------------------------
# The policy's promises


def test_scattered_free_pages_serve_one_large_request():
    a = stitch(64 * MiB)
    blocks = [a.allocate(4 * MiB) for _ in range(16)]  # the whole device
    for p in blocks[::2]:
        a.deallocate(p)  # 32 MiB free in 4 MiB gaps
    big = a.allocate(30 * MiB)  # no gap holds it: cached pages are unmapped and mapped again
    a.check_invariants()
    assert a.counters()["reclaims"] == 1 and a.counters()["page_unmaps"] == 15
    assert a.stats()["num_alloc_retries"] == 1
    native = _core.CachingAllocator(_core.SimDevice(64 * MiB), "expandable_segments:True")
    kept = [native.allocate(4 * MiB) for _ in range(12)]
    for p in kept[::2]:
        native.deallocate(p)
    with pytest.raises(torch.OutOfMemoryError):
        native.allocate(30 * MiB)  # PyTorch's best setting cannot use the gaps
    a.deallocate(big)


def test_reuse_maps_nothing_and_empty_cache_gives_everything_back():
    a = stitch()
    for step in range(4):
        live = [a.allocate(s) for s in (700, 3 * MiB + 1, 64 * 1024, 17 * MiB, 5)]
        if step == 0:
            first = a.counters()["page_maps"]
        for p in live:
            a.deallocate(p)
        a.check_invariants()
    assert a.counters()["page_maps"] == first and a.counters()["page_unmaps"] == 0
    assert a.stats()["reserved_bytes"]["all"]["current"] == first * PAGE
    a.empty_cache()
    assert a.stats()["reserved_bytes"]["all"]["current"] == 0 and a.ranges == 0
    assert a.counters()["page_unmaps"] == first


def test_streams_get_their_own_ranges():
    a = stitch()
    p = a.allocate(MiB, 0)
    a.deallocate(p)
    q = a.allocate(MiB, 7)
    assert q != p
    segs = a.segments()
    assert {s["stream"] for s in segs} == {0, 7}
    assert all(s["is_expandable"] for s in segs)
    a.deallocate(q)


def test_stats_and_segments_agree():
    a = stitch()
    live = [a.allocate(s) for s in (100, 2 * MiB, 2 * MiB + 512, 513, 9 * MiB)]
    stats = a.stats()
    segs = a.segments()
    blocks = [b for s in segs for b in s["blocks"]]
    assert sum(b["size"] for b in blocks if b["allocated"]) == stats["allocated_bytes"]["all"]["current"]
    assert sum(s["total_size"] for s in segs) == stats["reserved_bytes"]["all"]["current"]
    assert stats["reserved_bytes"]["small_pool"]["current"] == PAGE  # 100 and 513 B share one page
    for s in segs:
        assert sum(b["size"] for b in s["blocks"]) == s["total_size"]
    assert stats["num_device_alloc"] == a.counters()["page_maps"]
    for p in live:
        a.deallocate(p)


def test_history_records_maps_and_unmaps():
    a = stitch()
    a.enable_history(100)
    p = a.allocate(5 * MiB)
    a.deallocate(p)
    a.empty_cache()
    actions = [e["action"] for e in a.history()]
    assert actions == ["segment_map", "alloc", "free_requested", "free_completed", "segment_unmap"]
    assert [e["size"] for e in a.history() if e["action"].startswith("segment")] == [6 * MiB, 6 * MiB]


def test_config_key():
    assert _core.parse_config("policy:stitch") == "policy:stitch"
    assert _core.parse_config("policy:native") == ""
    with pytest.raises(ValueError, match="policy"):
        _core.parse_config("policy:compact")
    assert isinstance(_core.device_allocator(_core.SimDevice(GiB), ""), _core.CachingAllocator)
    assert isinstance(_core.device_allocator(_core.SimDevice(GiB), "policy:native"), _core.CachingAllocator)
    a = _core.device_allocator(_core.SimDevice(GiB), "policy:stitch,per_process_memory_fraction:0.5")
    assert isinstance(a, _core.StitchAllocator) and a.policy == "stitch"
    assert a.allocator_settings["policy"] == "stitch"
    with pytest.raises(torch.OutOfMemoryError):
        a.allocate(600 * MiB)  # over the fraction's limit


# ---------------------------------------------------------------------------
# Replay, min_capacity, advise, compare


def test_demo_trace_completes_where_the_default_runs_out():
    trace = workloads.fragmenting_training()
    default = sim.replay(trace, "80GiB", "")
    stitched = sim.replay(trace, "80GiB", "policy:stitch")
    assert not default.completed and stitched.completed
    assert stitched.policy == "stitch" and stitched.counters["page_maps"] > 0
    assert stitched.to_json()["counters"] == stitched.counters
    stitched.replayer.check_invariants()
    snap = snapshot_from_replay(sim.replay(trace, "80GiB", "policy:stitch", history=100000))
    validate_snapshot(snap)


def test_min_capacity_within_two_percent_of_the_peak_on_the_demo_trace():
    trace = workloads.fragmenting_training()
    floor = sim.replay(trace, "1TiB", "").stats["requested_bytes"]["all"]["peak"]
    need = sim.min_capacity(trace, "policy:stitch")
    assert need <= 1.02 * floor
    assert need < sim.min_capacity(trace, "expandable_segments:True")
    assert sim.replay(trace, need, "policy:stitch").completed
    assert not sim.replay(trace, need - 2 * MiB, "policy:stitch").completed


def test_snapshot_start_state_is_allocated_first(tmp_path):
    from tests.support.replay_recording import begin_mid_run, random_workload, record

    snap = begin_mid_run(record(random_workload(5, 3000, large=0.4), "", capacity=4 * GiB), 600)
    path = tmp_path / "s.pickle"
    import pickle

    path.write_bytes(pickle.dumps(snap))
    trace = sim.load_trace(str(path))
    r = sim.replay(trace, "8GiB", "policy:stitch", history=100000)
    assert r.completed and r.fidelity is None
    # Self-recorded on purpose: policy:stitch is torchmem's own, PyTorch has nothing to record it with.
    # The start state's live blocks are the policy's first allocations, in order and at their requested
    # sizes, before the trace's first event (a free: of a block live at the start).
    start_sizes = [b[2] for seg in trace.start.segments for b in seg.blocks]
    assert len(start_sizes) == trace.start.live_blocks > 0
    events = snap["device_traces"][0]
    assert events[0]["action"].startswith("free")
    history = r.replayer.history()
    first_free = next(i for i, e in enumerate(history) if e["action"].startswith("free"))
    assert [e["size"] for e in history[:first_free] if e["action"] == "alloc"] == start_sizes
    # Then every request of the trace, the recorded OOM's included (8 GiB holds what 4 GiB refused).
    requests = sum(e["action"] in ("alloc", "oom") for e in events)
    assert events[-1]["action"] == "oom"
    assert r.stats["allocation"]["all"]["allocated"] == len(start_sizes) + requests
    need = sim.min_capacity(trace, "policy:stitch")
    with pytest.raises(ValueError, match="smaller than the memory held"):
        sim.replay(trace, 4 * MiB, "policy:stitch")
    assert need is not None


def test_advise_offers_the_policy_next_to_pytorch_settings():
    trace = workloads.fragmenting_training()
    rows = advise(trace, "80GiB", combine=0)
    stitch_rows = [r for r in rows if r.policy == "stitch"]
    assert len(stitch_rows) == 1 and stitch_rows[0].conf == "policy:stitch"
    assert rows[0] is stitch_rows[0]  # the least memory of all
    assert "[torchmem]" in stitch_rows[0].summary()
    assert all(r.policy == "native" for r in advise(trace, "80GiB", combine=0, stitch=False))


def test_cli_advise_and_compare(tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    from torchmem.formats.traces import write_jsonl

    write_jsonl(workloads.fragmenting_training(), str(path))
    assert main(["advise", str(path), "--capacity", "80GiB", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "policy:stitch [torchmem]" in out and "TORCHMEM_ALLOC_CONF=policy:stitch" in out
    assert main(["replay", str(path), "--capacity", "80GiB", "--conf", "", "--compare", "policy:stitch", "--json",
                 "--no-progress"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["completed"] for r in rows] == [False, True]
    assert rows[1]["policy"] == "stitch" and rows[1]["counters"]["page_maps"] > 0


# ---------------------------------------------------------------------------
# The native policy is unchanged


def test_native_policy_key_changes_nothing():
    trace = workloads.fragmenting_training()
    for conf in ("", "expandable_segments:True"):
        plain = sim.replay(trace, "80GiB", conf, history=100000)
        named = sim.replay(trace, "80GiB", ",".join(filter(None, [conf, "policy:native"])), history=100000)
        assert plain.policy == named.policy == "native" and named.counters is None
        assert plain.stats == named.stats and plain.segments == named.segments
        strip = lambda h: [(e["action"], e["addr"], e["size"]) for e in h]  # noqa: E731
        assert strip(plain.replayer.history()) == strip(named.replayer.history())
    # The demo's figures in BENCHMARKS.md: the default runs out at event 2,386; expandable segments complete.
    assert sim.replay(trace, "80GiB", "").events == 2386
    assert sim.replay(trace, "80GiB", "expandable_segments:True").events == 2513


# ---------------------------------------------------------------------------
# CPU install


def test_cpu_install_with_the_policy():
    proc = run_python(
        """
        import json, torch, torchmem
        torchmem.install(conf="policy:stitch")
        a = torchmem.caching_allocator()
        model = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(64, 4, 128, batch_first=True), 2)
        opt = torch.optim.AdamW(model.parameters())
        for seq in (16, 48, 32):
            model(torch.randn(4, seq, 64)).sum().backward()
            opt.step(); opt.zero_grad(set_to_none=True)
            a.check_invariants()
        stats = torchmem.memory_stats()
        snap = torchmem.memory_snapshot()
        torchmem.empty_cache()
        out = {"policy": a.policy, "kind": type(a).__name__, "allocated": stats["allocated_bytes.all.current"],
               "reserved": stats["reserved_bytes.all.current"], "segments": len(snap["segments"]),
               "maps": a.counters()["page_maps"]}
        torchmem.uninstall()
        print(json.dumps(out))
        """
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["policy"] == "stitch" and r["kind"] == "StitchAllocator"
    assert 0 < r["allocated"] <= r["reserved"] and r["segments"] > 0 and r["maps"] > 0


def test_the_native_class_refuses_another_policy():
    """CachingAllocator is the native policy: asked for policy:stitch it says how to make one, not silently native."""
    with pytest.raises(ValueError, match="make_device_allocator"):
        _core.CachingAllocator(_core.SimDevice(1 << 30), "policy:stitch")
    native = _core.CachingAllocator(_core.SimDevice(1 << 30), "policy:native")
    native.deallocate(native.allocate(4096))
    assert native.stats()["allocation"]["all"]["allocated"] == 1
