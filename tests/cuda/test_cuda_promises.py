"""What docs/cuda.md promises on CUDA and no other file tests: memory_summary,
a dumped history read back by `torchmem replay` and by torch.cuda._memory_viz,
the out-of-memory message's figures, expandable segments on torchmem's own
CUDA device (the driver's cuMem calls), policy:stitch installed on CUDA, the
capture rules seen from the runtime, and a child forked after a CUDA parent.

Each test runs in its own interpreter; all skip without a GPU (real or fake).
Where a check reads the fake GPU's counters (torchmem.fakegpu.Control: the
runtime calls torchmem made), it runs only on the fake GPU.
"""
import json
import os
import pickle
import textwrap

import torch

from tests.cuda.cuda_helpers import FAKE_GPU, MiB, requires_gpu, run_json
from tests.support.subprocess_runner import ok, run_torchmem

pytestmark = requires_gpu

COUNTERS = """
def counters():
    if not FAKE_GPU:
        return {}
    from torchmem.fakegpu import Control
    return Control().counters()
"""


def test_memory_summary_reports_torchmems_figures():
    r = run_json("""
        x = torch.empty(3 * 1024 * 1024, dtype=torch.uint8, device="cuda")
        summary = torch.cuda.memory_summary()
        print(json.dumps({"summary": summary, "allocated": torch.cuda.memory_allocated()}))
        """)
    assert r["allocated"] == 3 * MiB
    summary = r["summary"]
    assert "PyTorch CUDA memory summary" in summary
    # The "Allocated memory" row, current column: 3 MiB; reserved: the 20 MiB segment.
    rows = {line.split("|")[1].strip(): line for line in summary.splitlines() if line.count("|") >= 3}
    assert "3072 KiB" in rows["Allocated memory"] or "3 MiB" in rows["Allocated memory"], rows["Allocated memory"]
    assert "20480 KiB" in rows["GPU reserved memory"] or "20 MiB" in rows["GPU reserved memory"]


def test_dumped_history_reads_back_in_torchmem_replay_and_memory_viz(tmp_path):
    path = tmp_path / "torchmem.pickle"
    r = run_json(f"""
        torch.cuda.memory._record_memory_history(max_entries=100_000)
        keep = [torch.empty(n, dtype=torch.uint8, device="cuda") for n in (512, 300_000, 5 << 20, 30 << 20)]
        del keep[1]
        gone = torch.empty(25 << 20, dtype=torch.uint8, device="cuda")   # fits no free block: a segment of its own
        del gone
        torch.cuda.empty_cache()
        stats = torch.cuda.memory_stats()
        torch.cuda.memory._dump_snapshot({str(path)!r})
        torch.cuda.memory._record_memory_history(enabled=None)
        print(json.dumps({{"peaks": [stats["allocated_bytes.all.peak"], stats["reserved_bytes.all.peak"]],
                           "total": torch.cuda.get_device_properties(0).total_memory}}))
        """)
    with open(path, "rb") as f:
        snapshot = pickle.load(f)
    actions = [e["action"] for e in snapshot["device_traces"][0]]
    assert {"segment_alloc", "alloc", "free_requested", "free_completed", "segment_free"} <= set(actions)

    proc = ok(run_torchmem("replay", str(path), "--capacity", f"{r['total']}B", "--json", "--no-progress", timeout=120))
    replay = json.loads(proc.stdout)
    assert replay["exact"] and replay["completed"], replay["fidelity"]
    assert [replay["peak_allocated"], replay["peak_reserved"]] == r["peaks"]

    from torch.cuda import _memory_viz  # PyTorch's own readers of the file

    summary = _memory_viz.segsum(snapshot)
    assert f"segments: {len(snapshot['segments'])}\n" in summary
    assert f"total_reserved: {_memory_viz._format_size(sum(s['total_size'] for s in snapshot['segments']))}" in summary
    trace = _memory_viz.trace(snapshot)
    assert trace.count("= cudaMalloc(") == actions.count("segment_alloc")
    assert "<html" in _memory_viz.trace_plot(snapshot).lower()


def test_out_of_memory_message_gives_the_figures():
    r = run_json("""
        total = torch.cuda.get_device_properties(0).total_memory
        keep = torch.empty(100 * 1024 * 1024, dtype=torch.uint8, device="cuda")
        try:
            torch.empty(2 * total, dtype=torch.uint8, device="cuda")
            message = None
        except torch.cuda.OutOfMemoryError as e:
            message = str(e)
        torch.cuda.empty_cache()
        print(json.dumps({"message": message, "total": total, "reserved_after": torch.cuda.memory_reserved()}))
        """)
    gib = r["total"] / 2**30
    message = r["message"]
    assert message.startswith(f"CUDA out of memory. Tried to allocate {2 * gib:.2f} GiB."), message
    assert f"total capacity of {gib:.2f} GiB" in message
    assert "100.00 MiB is allocated by PyTorch" in message
    assert "0 bytes is reserved by PyTorch but unallocated" in message
    assert r["reserved_after"] == 100 * MiB  # keep's segment stays; nothing cached is left


def test_expandable_segments_map_through_the_drivers_cumem_calls():
    r = run_json(COUNTERS + textwrap.dedent("""
        before = counters()
        xs = [torch.empty(n << 20, dtype=torch.uint8, device="cuda") for n in (30, 50, 1)]
        mapped = counters()
        reserved = torch.cuda.memory_reserved()
        del xs
        torch.cuda.empty_cache()
        after = counters()
        print(json.dumps({"before": before, "mapped": mapped, "after": after, "reserved": reserved,
                          "reserved_after": torch.cuda.memory_reserved()}))
        """), conf="expandable_segments:True")
    # Large pool: 20 MiB pages for 80 MiB (4 pages); small pool: one 2 MiB page.
    assert r["reserved"] == 4 * 20 * MiB + 2 * MiB
    assert r["reserved_after"] == 0
    if FAKE_GPU:
        assert r["mapped"]["vmm_maps"] - r["before"]["vmm_maps"] >= 2  # at least one map call per pool
        assert r["mapped"]["malloc_calls"] == r["before"]["malloc_calls"]  # no cudaMalloc for these
        assert r["after"]["vmm_unmaps"] > r["mapped"]["vmm_unmaps"]
        assert r["after"]["vmm_releases"] - r["mapped"]["vmm_releases"] == \
            r["mapped"]["vmm_creates"] - r["before"]["vmm_creates"]  # every page handle given back


def test_policy_stitch_installed_on_cuda():
    limit = (40 * MiB) / torch.cuda.get_device_properties(0).total_memory  # 40 MiB: big must reuse freed pages
    r = run_json("""
        a = [torch.empty(4 << 20, dtype=torch.uint8, device="cuda") for _ in range(8)]
        for t in a:
            put(t[:1 << 16], 7)
        del a[::2]
        big = torch.empty(14 << 20, dtype=torch.uint8, device="cuda")   # from the freed pages
        put(big[-(1 << 16):], 9)
        ok = all(bool((t[:1 << 16].cpu() == 7).all()) for t in a) and bool((big[-(1 << 16):].cpu() == 9).all())
        print(json.dumps({"ok": ok, "reserved": torch.cuda.memory_reserved(),
                          "allocated": torch.cuda.memory_allocated(),
                          "backend": torch.cuda.get_allocator_backend()}))
        """, conf=f"policy:stitch,per_process_memory_fraction:{limit:.12f}")
    assert r["ok"] and r["backend"] == "torchmem"
    assert r["allocated"] == 4 * 4 * MiB + 14 * MiB
    assert r["reserved"] <= 40 * MiB < 8 * 4 * MiB + 14 * MiB  # the freed pages were used again for big


def test_capture_makes_no_call_cuda_refuses_while_capturing():
    """Inside a capture: allocations, frees, empty_cache() and a record_stream
    free; CUDA refuses cudaMalloc/cudaFree, event queries and synchronisation
    there, and the fake GPU counts each such call (capture_violations)."""
    r = run_json(COUNTERS + textwrap.dedent("""
        x = filled(1 << 20, 1.0)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            y = x * 2
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        cached = torch.empty(8 << 20, dtype=torch.uint8, device="cuda")
        del cached                                     # a cached segment, which empty_cache() may not release
        reserved_before = torch.cuda.memory_reserved()
        before = counters()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            a = torch.empty(3 << 20, dtype=torch.uint8, device="cuda")
            b = torch.empty(1000, device="cuda")
            b.record_stream(side)
            del a, b
            torch.cuda.empty_cache()
            y = x * 3
        after = counters()
        r = {"reserved_during": torch.cuda.memory_reserved() - reserved_before,
             "violations": after.get("capture_violations", 0) - before.get("capture_violations", 0),
             "captures": after.get("captures_ended", 0) - before.get("captures_ended", 0),
             "pools": tmcuda.pool_count(0)}
        g.replay()
        del g, y
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        r["reserved_after"] = torch.cuda.memory_reserved()
        print(json.dumps(r))
        """))
    assert r["pools"] == 1
    assert r["reserved_during"] >= 20 * MiB  # the graph's pool got segments of its own; the cached one stayed
    assert r["reserved_after"] < r["reserved_during"] + 30 * MiB
    if FAKE_GPU:
        assert r["captures"] == 1 and r["violations"] == 0


def test_a_child_forked_after_cuda_use_is_refused_cuda_and_frees_nothing():
    r = run_json("""
        import multiprocessing
        x = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
        put(x, 5)
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:                                   # the child
            out = {}
            try:
                torch.empty(16, device="cuda")
                out["allocated"] = True
            except RuntimeError as e:
                out["error"] = str(e)[:300]
            del x                                      # the parent's tensor: its free must do nothing
            out["cpu_works"] = float(torch.ones(4).sum())
            os.write(write, json.dumps(out).encode())
            os._exit(0)
        os.close(write)
        _, status = os.waitpid(pid, 0)
        child = json.loads(os.read(read, 65536).decode())
        print(json.dumps({"child": child, "status": status, "parent_intact": bool((x.cpu() == 5).all()),
                          "parent_allocated": torch.cuda.memory_allocated(),
                          "parent_works": host_sum(filled(10, 1.0))}))
        """)
    child = r["child"]
    assert r["status"] == 0
    # Refused with PyTorch's own error (its lazy init checks first) or torchmem's: both name spawn.
    assert "allocated" not in child and "spawn" in child["error"], child
    assert child["cpu_works"] == 4.0
    assert r["parent_intact"] and r["parent_allocated"] == MiB and r["parent_works"] == 10.0
