"""torchmem as PyTorch's CUDA allocator: PyTorch's own APIs keep working.

Every test swaps the allocator in its own interpreter; all skip without a GPU
(a real one or the fake GPU of `make test-fakegpu`). Values go to the GPU by
copies and are read back on the host, which the fake GPU does for real; only
checks of what kernels compute need a real GPU.
"""
import pickle

import pytest

from tests.cuda.cuda_helpers import FAKE_GPU, TWO_GPUS, MiB, requires_gpu, requires_kernels, requires_two_gpus, run_child, run_json

pytestmark = requires_gpu


def test_allocations_go_through_torchmem_and_torch_stats_report_them():
    r = run_json(
        """
        x = torch.empty(1000, 1000, device="cuda")
        r = {
            "installed": cuda_installed(),
            "backend": torch.cuda.get_allocator_backend(),
            "allocated": torch.cuda.memory_allocated(),
            "reserved": torch.cuda.memory_reserved(),
            "ours": tmcuda.caching_allocator(0).owns(x.data_ptr()),
            "stats_keys": sorted(torch.cuda.memory_stats())[:3],
            "num_alloc": torch.cuda.memory_stats()["allocation.all.current"],
        }
        y = torch.empty(3 * 1024 * 1024, dtype=torch.uint8, device="cuda")
        r["peak_before_reset"] = torch.cuda.max_memory_allocated()
        del y
        torch.cuda.reset_peak_memory_stats()
        r["peak_after_reset"] = torch.cuda.max_memory_allocated()
        del x
        r["allocated_after_free"] = torch.cuda.memory_allocated()
        r["reserved_before_empty"] = torch.cuda.memory_reserved()
        torch.cuda.empty_cache()
        r["reserved_after_empty"] = torch.cuda.memory_reserved()
        print(json.dumps(r))
        """
    )
    assert r["installed"] is True
    assert r["backend"] == "torchmem"
    assert r["ours"] is True
    assert r["allocated"] == 4_000_256  # 4,000,000 bytes rounded up to 512
    assert r["reserved"] == 20 * MiB  # a 1-10 MiB request takes a 20 MiB segment
    assert r["num_alloc"] == 1
    assert r["stats_keys"] and r["stats_keys"][0].startswith("active")
    assert r["peak_before_reset"] == 4_000_256 + 3 * MiB
    assert r["peak_after_reset"] == 4_000_256
    assert r["allocated_after_free"] == 0
    assert r["reserved_before_empty"] == 20 * MiB
    assert r["reserved_after_empty"] == 0


def test_install_through_torchmem_install():
    r = run_json(
        """
        torchmem.install()
        x = filled(10, 1.0)
        print(json.dumps({"installed": cuda_installed(), "sum": host_sum(x),
                          "ours": tmcuda.caching_allocator(0).owns(x.data_ptr())}))
        """,
        install=False,
    )
    assert r == {"installed": True, "sum": 10.0, "ours": True}


def test_install_after_cuda_initialised_says_what_to_do():
    r = run_json(
        """
        torch.cuda.init()
        try:
            tmcuda.install_cuda()
            print(json.dumps({"raised": False}))
        except tmcuda.CUDAAlreadyInitializedError as e:
            print(json.dumps({"raised": True, "message": str(e), "is_runtime_error": isinstance(e, RuntimeError)}))
        """,
        install=False,
    )
    assert r["raised"] and r["is_runtime_error"]
    assert "before CUDA initialises" in r["message"]
    assert "first thing in the program" in r["message"]


def test_out_of_memory_raises_torch_cuda_oom_and_recovers():
    r = run_json(
        """
        total = torch.cuda.get_device_properties(0).total_memory
        keep = torch.empty(64 * 1024 * 1024, dtype=torch.uint8, device="cuda")
        try:
            torch.empty(2 * total, dtype=torch.uint8, device="cuda")
            r = {"raised": False}
        except torch.cuda.OutOfMemoryError as e:
            r = {"raised": True, "message": str(e)}
        r["num_ooms"] = torch.cuda.memory_stats()["num_ooms"]
        after = filled(1024, 1.0)
        r["works_after"] = host_sum(after)
        print(json.dumps(r))
        """
    )
    assert r["raised"], r
    assert r["message"].startswith("CUDA out of memory. Tried to allocate")
    assert "reserved by PyTorch but unallocated" in r["message"]
    assert r["num_ooms"] == 1
    assert r["works_after"] == 1024.0


def test_memory_snapshot_and_recorded_history(tmp_path):
    path = tmp_path / "snap.pickle"
    r = run_json(
        f"""
        torch.cuda.memory._record_memory_history(max_entries=10000)
        def make():
            return torch.empty(256, 1024, device="cuda")  # 1 MiB: small pool
        a = make()
        b = torch.empty(8 * 1024 * 1024, dtype=torch.uint8, device="cuda")
        del b
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._dump_snapshot({str(path)!r})
        segs = snap["segments"]
        traces = snap["device_traces"][0]
        r = {{
            "n_segments": len(segs),
            "total": sum(s["total_size"] for s in segs),
            "allocated": sum(s["allocated_size"] for s in segs),
            "actions": sorted({{t["action"] for t in traces}}),
            "alloc_has_frames": any(t["action"] == "alloc" and t.get("frames") for t in traces),
            "a_in_blocks": any(
                s["address"] <= a.data_ptr() < s["address"] + s["total_size"] for s in segs
            ),
            "frames_name_make": any(
                f.get("name") == "make" for t in traces for f in t.get("frames", [])
            ),
        }}
        torch.cuda.memory._record_memory_history(enabled=None)
        print(json.dumps(r))
        """
    )
    assert r["n_segments"] == 2
    assert r["total"] == 2 * MiB + 20 * MiB
    assert r["allocated"] == 1 * MiB
    assert {"alloc", "free_requested", "segment_alloc"} <= set(r["actions"])
    assert r["a_in_blocks"] and r["alloc_has_frames"] and r["frames_name_make"]
    with open(path, "rb") as f:
        dumped = pickle.load(f)
    assert "segments" in dumped and "device_traces" in dumped


def test_record_stream_defers_reuse_until_the_other_stream_is_done():
    r = run_json(
        """
        side = torch.cuda.Stream()
        x = torch.empty(1024 * 1024, dtype=torch.uint8, device="cuda")
        ptr = x.data_ptr()
        hold(side)  # the side stream stays busy
        with torch.cuda.stream(side):
            x.record_stream(side)
        del x
        # As PyTorch: allocated bytes drop at the free, active bytes when the stream is done.
        r = {"pending": tmcuda.pending_frees(0), "allocated_while_pending": torch.cuda.memory_allocated(),
             "active_while_pending": torch.cuda.memory_stats()["active_bytes.all.current"]}
        y = torch.empty(1024 * 1024, dtype=torch.uint8, device="cuda")
        r["reused_while_busy"] = y.data_ptr() == ptr
        torch.cuda.synchronize()
        z = torch.empty(16, device="cuda")  # an allocation processes completed events
        r["pending_after_sync"] = tmcuda.pending_frees(0)
        del y, z
        torch.cuda.empty_cache()
        r["reserved_after_empty"] = torch.cuda.memory_reserved()
        print(json.dumps(r))
        """
    )
    assert r["pending"] == 1
    assert r["allocated_while_pending"] == 0 and r["active_while_pending"] == 1024 * 1024
    assert r["reused_while_busy"] is False
    assert r["pending_after_sync"] == 0
    assert r["reserved_after_empty"] == 0


def test_expandable_segments_map_pages_and_unmap_on_empty_cache():
    r = run_json(
        """
        xs = [torch.empty(n * 1024 * 1024, dtype=torch.uint8, device="cuda") for n in (30, 50, 70)]
        snap = torch.cuda.memory._snapshot()
        r = {
            "reserved": torch.cuda.memory_reserved(),
            "expandable": [s["is_expandable"] for s in snap["segments"]],
            "sum": int(sum(host_sum(put(x, 1)) for x in xs)),
        }
        del xs
        torch.cuda.empty_cache()
        r["reserved_after_empty"] = torch.cuda.memory_reserved()
        print(json.dumps(r))
        """,
        conf="expandable_segments:True",
    )
    assert r["reserved"] % (2 * MiB) == 0 and r["reserved"] >= 150 * MiB
    assert r["expandable"] and all(r["expandable"])
    assert r["sum"] == 150 * MiB
    assert r["reserved_after_empty"] == 0


def test_set_per_process_memory_fraction_limits_reserved_memory():
    r = run_json(
        """
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(0.05)
        ok = torch.empty(int(total * 0.02), dtype=torch.uint8, device="cuda")
        try:
            torch.empty(int(total * 0.06), dtype=torch.uint8, device="cuda")
            raised = False
        except torch.cuda.OutOfMemoryError:
            raised = True
        print(json.dumps({"raised": raised}))
        """
    )
    assert r["raised"]


def test_a_memory_fraction_counts_a_private_pool_with_the_default_pool():
    """As PyTorch's total_allocated_memory (checked natively on the fake GPU: PyTorch refuses the same request):
    a MemPool's new segment is refused when the device's reserved bytes, the default pool's included, would
    pass the fraction's limit, though the pool's own would not (core/base/device_reserved.h)."""
    r = run_json(
        """
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(0.05)
        outside = torch.empty(int(total * 0.03), dtype=torch.uint8, device="cuda")
        pool = torch.cuda.MemPool()
        refused = False
        with torch.cuda.use_mem_pool(pool):
            small = torch.empty(int(total * 0.01), dtype=torch.uint8, device="cuda")
            try:
                torch.empty(int(total * 0.03), dtype=torch.uint8, device="cuda")
            except torch.cuda.OutOfMemoryError:
                refused = True
        del outside
        torch.cuda.empty_cache()
        with torch.cuda.use_mem_pool(pool):  # the default pool's memory given back: now it fits
            later = torch.empty(int(total * 0.03), dtype=torch.uint8, device="cuda")
        print(json.dumps({"refused": refused}))
        """
    )
    assert r["refused"]


def test_cuda_graph_capture_and_replay_with_a_private_pool():
    r = run_json(
        """
        x = filled(1024, 1.0)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                y = x * 2 + 1
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = x * 2 + 1
        r = {"pools_after_capture": tmcuda.pool_count(0),
             "y_in_pool": not tmcuda.caching_allocator(0).owns(y.data_ptr())}
        if FAKE_GPU:  # no release, unmap, event query or synchronize while capturing
            from torchmem.fakegpu import Control
            r["capture_violations"] = Control().counter("capture_violations")
            r["captures_ended"] = Control().counter("captures_ended")
        put(x, 3)
        g.replay()
        torch.cuda.synchronize()
        r["replayed"] = float(y[0])
        del g
        r["pools_after_graph_deleted"] = tmcuda.pool_count(0)  # y still lives in the pool
        del y
        r["pools_after_output_freed"] = tmcuda.pool_count(0)
        print(json.dumps(r))
        """
    )
    assert r["pools_after_capture"] == 1 and r["y_in_pool"]
    if FAKE_GPU:
        assert r["capture_violations"] == 0 and r["captures_ended"] == 1
    else:  # the replay's kernels computed y
        assert r["replayed"] == 7.0
    assert r["pools_after_graph_deleted"] == 1
    assert r["pools_after_output_freed"] == 0


def test_mem_pool_use_mem_pool_graph_inside_and_destructor():
    r = run_json(
        """
        pool = torch.cuda.MemPool()
        with torch.cuda.use_mem_pool(pool):
            a = torch.empty(1024 * 1024, dtype=torch.uint8, device="cuda")
            torch.cuda.empty_cache()  # allowed inside use_mem_pool, as native
            g = torch.cuda.CUDAGraph()
            x = filled(1024, 1.0)
            with torch.cuda.graph(g):
                y = x * 2
        r = {"pools": tmcuda.pool_count(0), "use_count": pool.use_count(),
             "in_pool": any(s["segment_pool_id"] == pool.id for s in torch.cuda.memory._snapshot()["segments"])}
        g.replay()
        torch.cuda.synchronize()
        r["replayed"] = float(y[0])
        del g, y, x, a
        del pool  # ~MemPool: setUseOnOOM, releasePool, emptyCache(id); none may throw
        torch.cuda.empty_cache()
        r["pools_after"] = tmcuda.pool_count(0)
        r["reserved_after"] = torch.cuda.memory_reserved()
        print(json.dumps(r))
        """
    )
    assert r["in_pool"] and r["pools"] == 2  # the MemPool and the graph's own pool
    if not FAKE_GPU:  # the replay's kernels computed y
        assert r["replayed"] == 2.0
    assert r["pools_after"] == 0 and r["reserved_after"] == 0


def test_accelerator_memory_functions_reach_torchmem():
    r = run_json(
        """
        x = torch.empty(1024 * 1024, dtype=torch.uint8, device="cuda")
        acc = getattr(torch.accelerator, "memory_allocated", None)
        print(json.dumps({"has": acc is not None, "allocated": acc() if acc else None,
                          "ours": torch.cuda.memory_allocated()}))
        """
    )
    if r["has"]:
        assert r["allocated"] == r["ours"] == 1024 * 1024


@requires_kernels
def test_cudnn_benchmark_asks_cache_info():
    r = run_json(
        """
        torch.backends.cudnn.benchmark = True
        conv = torch.nn.Conv2d(16, 32, 3).cuda()
        out = conv(torch.randn(8, 16, 64, 64, device="cuda"))
        out.sum().backward()
        print(json.dumps({"shape": list(out.shape)}))
        """
    )
    assert r["shape"] == [8, 32, 62, 62]


@requires_kernels
def test_training_loop_matches_native_allocator_results():
    code = """
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 8)).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for step in range(20):
            x = torch.randn(32 + step, 64, device="cuda")
            loss = model(x).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        print(json.dumps({"loss": float(loss)}))
        """
    ours = run_json(code)
    native = run_json(code, install=False)
    assert ours["loss"] == pytest.approx(native["loss"], rel=1e-5)


@requires_two_gpus
def test_each_gpu_has_its_own_state():
    r = run_json(
        """
        a = torch.empty(1024 * 1024, dtype=torch.uint8, device="cuda:1")
        snap = torch.cuda.memory._snapshot()
        r = {
            "alloc0": torch.cuda.memory_allocated(0),
            "alloc1": torch.cuda.memory_allocated(1),
            "device_of_segments": sorted({s["device"] for s in snap["segments"]}),
            "owner1": tmcuda.caching_allocator(1).owns(a.data_ptr()),
            "owner0": tmcuda.caching_allocator(0).owns(a.data_ptr()),
        }
        with torch.cuda.device(1):
            b = filled(10, 1.0)
        r["b_device"] = b.device.index
        print(json.dumps(r))
        """,
        env=TWO_GPUS,
    )
    assert r["alloc0"] == 0 and r["alloc1"] == 1024 * 1024
    assert r["device_of_segments"] == [1]
    assert r["owner1"] and not r["owner0"]
    assert r["b_device"] == 1


@requires_two_gpus
def test_record_stream_with_another_gpus_stream_leaves_no_sticky_error():
    r = run_json(
        """
        other = torch.cuda.Stream(device=1)
        x = torch.empty(1024 * 1024, dtype=torch.uint8, device="cuda:0")
        x.record_stream(other)
        del x
        ys = [torch.empty(1024, device="cuda:0") for _ in range(3)]  # would raise with a sticky error
        torch.cuda.synchronize(1)
        torch.cuda.empty_cache()
        print(json.dumps({"pending": tmcuda.pending_frees(0), "n": len(ys)}))
        """,
        env=TWO_GPUS,
    )
    assert r["pending"] == 0 and r["n"] == 3


def test_a_device_left_out_is_the_current_gpu_once_torchmem_is_installed_on_cuda():
    """torchmem/runtime/devices.py's one rule on CUDA: torchmem.memory_stats() and the other functions that take a
    device mean the current GPU when given none, as torch.cuda's do, and an Arena takes its region there."""
    r = run_json(
        """
        from torchmem.runtime import devices
        x = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
        arena = torchmem.Arena(2 << 20)
        print(json.dumps({"name": devices.device_name(None), "index": devices.device_name(0),
                          "same": torchmem.memory_stats() == torchmem.memory_stats("cuda:0"),
                          "allocated": torchmem.memory_allocated(), "torch": torch.cuda.memory_allocated(),
                          "arena": arena.device, "cpu": torchmem.memory_stats("cpu")}))
        """
    )
    assert r["name"] == r["index"] == "cuda:0" and r["same"]
    assert r["allocated"] == r["torch"] >= (1 << 20) + (2 << 20), r  # the tensor and the arena's region
    assert r["arena"] != "cpu" and r["cpu"] == {}, r
