"""dump_on_oom on CUDA: with torchmem as PyTorch's CUDA allocator, and with PyTorch's own.

Each test runs in its own interpreter; all skip without a GPU. (Written
without a GPU to run them on: see docs/oom.md, "Not tested on a GPU".)
"""
import os
import pickle

from tests.cuda.cuda_helpers import requires_gpu, run_child, run_json

pytestmark = requires_gpu

OOM = """
total = torch.cuda.get_device_properties(0).total_memory
keep = torch.empty(64 * 1024 * 1024, dtype=torch.uint8, device="cuda")
try:
    torch.empty(2 * total, dtype=torch.uint8, device="cuda")
    r = {"raised": False}
except torch.cuda.OutOfMemoryError as e:
    r = {"raised": True, "message": str(e)}
r["written"] = torchmem.runtime.oom.written_snapshots()
r["backend"] = torchmem.runtime.oom.dumping()["backend"]
r["request"] = 2 * total
print(json.dumps(r))
"""


def _check_snapshot(path: str, request: int) -> None:
    with open(path, "rb") as f:
        snap = pickle.load(f)
    oom = [e for t in snap["device_traces"] for e in t if e["action"] == "oom"]
    # PyTorch's native allocator records the rounded size (to 2 MiB here), torchmem the request.
    assert oom and 0 <= oom[-1]["size"] - request < 2 * 1024 * 1024 and "device_free" in oom[-1]
    assert snap["torchmem_oom"]["rank"] == 0

    from torchmem import replay as sim

    result = sim.replay(path)
    assert result.recorded_oom is not None and result.recorded_oom["reproduced"], result.recorded_oom


def test_torchmem_cuda_names_the_snapshot_in_the_error(tmp_path):
    r = run_json(f"torchmem.dump_on_oom({str(tmp_path / 'oom_rank{rank}.pickle')!r})\n" + OOM)
    assert r["raised"] and r["backend"] == "torchmem-cuda"
    path = str(tmp_path / "oom_rank0.pickle")
    assert r["written"] == [path]
    assert r["message"].startswith("CUDA out of memory.")
    assert f"wrote a snapshot of this out-of-memory error to {path}" in r["message"]
    _check_snapshot(path, r["request"])


def test_native_cuda_prints_the_note(tmp_path):
    proc = run_child(f"torchmem.dump_on_oom({str(tmp_path / 'oom_rank{rank}.pickle')!r})\n" + OOM, install=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    import json

    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["raised"] and r["backend"] == "native-cuda"
    path = str(tmp_path / "oom_rank0.pickle")
    assert r["written"] == [path] and os.path.exists(path)
    assert f"wrote a snapshot of this out-of-memory error to {path}" in proc.stderr
    _check_snapshot(path, r["request"])
