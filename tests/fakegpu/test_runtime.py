"""The fake GPU itself: what PyTorch's CUDA build sees on it (docs/fakegpu.md).

Each check runs PyTorch's own allocator (no torchmem install) in a fresh
interpreter on a fake card and asserts what a GPU would show.
"""
import ctypes
import sys

import pytest
import torch

from torchmem import fakegpu
from tests.fakegpu.helpers import GiB, MiB, run_code, run_json
from tests.support.subprocess_runner import run_args


# The exports of the real runtime and cuBLAS, per CUDA major: test_cuda_majors.py.


def test_card_size_and_device_count_are_settings():
    got = run_json("""
        import json, torch
        props = [torch.cuda.get_device_properties(d) for d in range(torch.cuda.device_count())]
        torch.cuda.set_device(1)
        x = torch.empty(3 << 20, dtype=torch.uint8, device="cuda:1")
        print(json.dumps({"count": torch.cuda.device_count(), "totals": [p.total_memory for p in props],
                          "cc": [props[0].major, props[0].minor], "free1": torch.cuda.mem_get_info(1)[0],
                          "free0": torch.cuda.mem_get_info(0)[0], "name": props[0].name}))
    """, card="24GiB", devices=2)
    assert got["count"] == 2
    assert got["totals"] == [24 * GiB, 24 * GiB]
    assert got["free1"] == 24 * GiB - 20 * MiB  # one 20 MiB segment for a 3 MiB tensor, as on a GPU
    assert got["free0"] == 24 * GiB
    assert got["cc"] == [9, 0]


def test_named_card_sets_capability_and_memory():
    got = run_json("""
        import json, torch
        p = torch.cuda.get_device_properties(0)
        print(json.dumps([p.total_memory, p.major, p.minor, p.multi_processor_count, p.name]))
    """, card="a100")
    # An A100-SXM4-80GB's total_memory as deviceQuery printed it (driver 12.5; cited in cards.py).
    assert got[:4] == [85_100_068_864, 8, 0, 108]
    assert "A100" in got[4]


def test_out_of_memory_at_the_cards_size():
    got = run_json("""
        import json, torch
        a = torch.empty(6 << 30, dtype=torch.uint8, device="cuda")
        try:
            torch.empty(3 << 30, dtype=torch.uint8, device="cuda")
            raised = None
        except torch.OutOfMemoryError as e:
            raised = str(e)
        print(json.dumps({"raised": raised, "ooms": torch.cuda.memory_stats()["num_ooms"],
                          "reserved": torch.cuda.memory_reserved()}))
    """, card="8GiB")
    assert got["raised"] and "Tried to allocate 3.00 GiB" in got["raised"]
    assert got["ooms"] == 1
    assert got["reserved"] == 6 * GiB


def test_memory_held_outside_pytorch_is_in_use_but_not_the_cards_size():
    """As a CUDA context on a GPU: free memory drops, the total does not, and PyTorch's OOM comes that much sooner."""
    got = run_json("""
        import json, torch
        from torchmem.fakegpu import Control
        c = Control()
        c.set_held(0, "512MiB")
        free, total = torch.cuda.mem_get_info()
        a = torch.empty(7 << 30, dtype=torch.uint8, device="cuda")
        try:
            torch.empty(600 << 20, dtype=torch.uint8, device="cuda")
            raised = False
        except torch.OutOfMemoryError:
            raised = True
        c.set_held(0, 0)
        b = torch.empty(600 << 20, dtype=torch.uint8, device="cuda")
        try:
            c.set_held(0, "1GiB")
            refused = False
        except Exception:
            refused = True
        print(json.dumps({"free": free, "total": total, "raised": raised, "refused": refused,
                          "props": torch.cuda.get_device_properties(0).total_memory}))
    """, card="8GiB")
    assert got["free"] == 8 * GiB - 512 * MiB and got["total"] == got["props"] == 8 * GiB
    assert got["raised"]  # 7 GiB + 600 MiB fit the card, not beside 512 MiB held
    assert got["refused"]  # 7 GiB + 600 MiB in use leave less than 1 GiB to hold


def test_record_stream_free_waits_for_the_held_stream():
    """PyTorch's native deferred free: the block comes back only once the side stream's work completes."""
    got = run_json("""
        import json, torch
        from torchmem.fakegpu import Control
        c = Control()
        side = torch.cuda.Stream()
        x = torch.empty(4 << 20, dtype=torch.uint8, device="cuda")
        c.hold(side)
        x.record_stream(side)
        address = x.data_ptr()
        del x
        y = torch.empty(4 << 20, dtype=torch.uint8, device="cuda")
        while_held = y.data_ptr() == address
        pending = c.pending_events()
        c.complete(side)
        z = torch.empty(4 << 20, dtype=torch.uint8, device="cuda")
        print(json.dumps({"while_held": while_held, "pending": pending, "after": z.data_ptr() == address,
                          "queries": c.counter("event_queries")}))
    """)
    assert got == {"while_held": False, "pending": 1, "after": True, "queries": got["queries"]}
    assert got["queries"] >= 2


def test_synchronize_completes_held_work():
    got = run_json("""
        import json, torch
        from torchmem.fakegpu import Control
        c = Control()
        c.hold_all()
        e = torch.cuda.Event()
        e.record()
        before = e.query()
        torch.cuda.synchronize()
        print(json.dumps([before, e.query(), c.counter("syncs")]))
    """)
    assert got == [False, True, 1]


def test_graph_capture_uses_a_private_pool_and_keeps_the_rules():
    got = run_json("""
        import json, torch
        from torchmem.fakegpu import Control
        c = Control()
        static = torch.empty(1 << 20, device="cuda")
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = static * 2 + 1
        pool_segments = [s for s in torch.cuda.memory._snapshot()["segments"] if s["segment_pool_id"] != [0, 0]]
        g.replay(); g.replay()
        try:
            torch.cuda.synchronize()
            sync_outside = "ok"
        except RuntimeError as e:
            sync_outside = str(e)
        g2 = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(g2):
                y = static + 1
                torch.cuda.synchronize()
            sync_inside = "ok"
        except RuntimeError as e:
            sync_inside = "refused"
        print(json.dumps({"pool_segments": len(pool_segments), "launches": c.counter("graph_launches"),
                          "begun": c.counter("captures_begun"), "violations": c.counter("capture_violations"),
                          "sync_outside": sync_outside, "sync_inside": sync_inside}))
    """)
    assert got["pool_segments"] >= 1
    assert got["launches"] == 2
    assert got["begun"] == 2
    assert got["sync_outside"] == "ok"
    assert got["sync_inside"] == "refused"
    assert got["violations"] == 1


def test_expandable_segments_map_through_the_fake_driver():
    got = run_json("""
        import json, torch
        from torchmem.fakegpu import Control
        c = Control()
        torch.cuda.memory._record_memory_history()
        x = torch.empty(50 << 20, dtype=torch.uint8, device="cuda")
        x.fill_(1)  # skipped: the kernel does not run
        x[:10].copy_(torch.arange(10, dtype=torch.uint8))  # a copy does: device memory is host memory
        back = x[:10].cpu().tolist()
        del x
        torch.cuda.empty_cache()
        actions = [e["action"] for e in torch.cuda.memory._snapshot()["device_traces"][0]]
        print(json.dumps({"maps": c.counter("vmm_maps"), "unmaps": c.counter("vmm_unmaps"), "back": back,
                          "map": actions.count("segment_map"), "unmap": actions.count("segment_unmap"),
                          "used": c.used(0)}))
    """, env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    assert got["back"] == list(range(10))
    assert got["maps"] >= 1 and got["unmaps"] >= 1
    assert got["map"] >= 1 and got["unmap"] >= 1
    assert got["used"] == 0


def test_unimplemented_entry_point_logs_and_fails(tmp_path):
    log = tmp_path / "unimplemented.log"
    proc = run_code("""
        import ctypes
        lib = ctypes.CDLL(None)
        print(lib.cudaMallocManaged(ctypes.byref(ctypes.c_void_p()), ctypes.c_size_t(4096), 1))
    """, env={"TORCHMEM_FAKEGPU_LOG": str(log)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "801"  # cudaErrorNotSupported
    assert "unimplemented cudaMallocManaged" in log.read_text()
    assert "unimplemented cudaMallocManaged" in proc.stderr


def test_failed_calls_log_their_name_arguments_and_error(tmp_path):
    """A hand-written entry point that returns an error logs one line to the log file only: the call, its
    arguments and the error's name. A call that succeeds, and an event query answering "not ready", log nothing."""
    log = tmp_path / "fakegpu.log"
    got = run_json(f"""
        import ctypes, json, os
        from torchmem.fakegpu import Control
        c = Control()
        c.reset_counters()
        lib, driver = ctypes.CDLL(None), ctypes.CDLL("libcuda.so.1")
        start = os.path.getsize({str(log)!r}) if os.path.exists({str(log)!r}) else 0
        ptr, device, event = ctypes.c_void_p(), ctypes.c_int(), ctypes.c_void_p()
        results = {{"set_device": lib.cudaSetDevice(3),
                    "too_big": lib.cudaMalloc(ctypes.byref(ptr), ctypes.c_size_t(16 << 30))}}
        fn, status = ctypes.c_void_p(), ctypes.c_int()
        lib.cudaGetDriverEntryPoint(b"cuMemMap", ctypes.byref(fn), ctypes.c_ulonglong(0), ctypes.byref(status))
        mem_map = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_ulonglong, ctypes.c_size_t, ctypes.c_size_t,
                                   ctypes.c_ulonglong, ctypes.c_ulonglong)(fn.value)
        results["map_no_handle"] = mem_map(0x200000, 2 << 20, 0, 0, 0)
        results["device_get"] = driver.cuDeviceGet(ctypes.byref(device), 7)
        results["clear"] = lib.cudaGetLastError()
        # Calls that succeed, and a query that answers "not yet".
        results["ok_set_device"] = lib.cudaSetDevice(0)
        results["ok_malloc"] = lib.cudaMalloc(ctypes.byref(ptr), ctypes.c_size_t(4096))
        results["ok_free"] = lib.cudaFree(ptr)
        c.hold_all()
        lib.cudaEventCreateWithFlags(ctypes.byref(event), 0)
        lib.cudaEventRecord(event, None)
        results["query"] = lib.cudaEventQuery(event)
        results["after_query"] = lib.cudaGetLastError()
        c.complete_all()
        print(json.dumps({{"results": results, "pid": os.getpid(), "start": start,
                          "device_arg": hex(ctypes.addressof(device)), "failed": c.counter("failed_calls")}}))
    """, card="8GiB", env={"TORCHMEM_FAKEGPU_LOG": str(log)})
    assert got["results"] == {"set_device": 101, "too_big": 2, "map_no_handle": 1, "device_get": 101,
                              "clear": 2,  # cudaMalloc's: the runtime's latest failure (driver calls leave it)
                              "ok_set_device": 0, "ok_malloc": 0, "ok_free": 0,
                              "query": 600, "after_query": 0}  # cudaErrorNotReady is an answer, not a last error
    pid = got["pid"]
    lines = log.read_text()[got["start"]:].splitlines()
    # One device on the card: ordinal 3 is past it. 16 GiB is twice the 8 GiB card. cuMemMap without a handle
    # (0 is a null pointer, written NULL) is an invalid value. The fake libcuda has one device too.
    assert lines == [
        f"torchmem fake GPU: failed cudaSetDevice(device=3) = cudaErrorInvalidDevice (pid {pid})",
        f"torchmem fake GPU: failed cudaMalloc(size={16 * GiB}) = cudaErrorMemoryAllocation (pid {pid})",
        f"torchmem fake GPU: failed cuMemMap(ptr=0x200000, size={2 * MiB}, offset=0, handle=NULL, flags=0x0)"
        f" = CUDA_ERROR_INVALID_VALUE (pid {pid})",
        f"torchmem fake GPU: failed cuDeviceGet(device={got['device_arg']}, ordinal=7) = CUDA_ERROR_INVALID_DEVICE"
        f" (pid {pid})",
    ]
    assert got["failed"] == 3  # the runtime's counters: libcuda.so.1 is a library of its own, which only logs


def test_launcher_runs_a_command_and_passes_its_exit_status():
    code = "import torch, sys; sys.exit(40 + torch.cuda.device_count())"
    proc = run_args(["-m", "torchmem.fakegpu", "--card", "16GiB", "--devices", "3", "--", sys.executable, "-c", code],
                    timeout=120)
    assert proc.returncode == 43, proc.stderr


@pytest.mark.parametrize("args, message", [
    (["--card", "80", "--", "true"], "no unit: write 80GiB"),
    (["--card", "eighty", "--", "true"], "give a number with a unit"),
    (["--devices", "0", "--", "true"], "devices must be 1 to 64"),
    ([], "give the command to run"),
])
def test_launcher_bad_arguments_exit_2(args, message):
    proc = run_args(["-m", "torchmem.fakegpu", *args], timeout=120)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_launcher_says_when_the_fake_gpu_is_not_built(tmp_path):
    proc = run_args(["-m", "torchmem.fakegpu", "--", "true"], {"TORCHMEM_FAKEGPU_LIBS": str(tmp_path)}, 120)
    assert proc.returncode == 1
    assert "make fakegpu" in proc.stderr and "Traceback" not in proc.stderr
