"""The cuBLAS and cuBLASLt stand-ins (fakegpu/cublas/): matmuls get through, workspaces as on the card.

Runs in the fake-GPU tier; tests/conftest.py fails a test during which any
process called an entry point a stand-in does not implement.
"""
from __future__ import annotations

import pytest

from tests.fakegpu.helpers import MiB, run_json
from torchmem import fakegpu

MATMULS = """
import json, torch
torch.cuda.memory._record_memory_history()
m = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 8)).cuda()
opt = torch.optim.AdamW(m.parameters())
x = torch.randn(16, 64, device="cuda")
loss = m(x).pow(2).mean()
loss.backward()
with torch.autocast("cuda", dtype=torch.bfloat16):
    y = m(x) @ torch.ones(8, 4, device="cuda")
z = torch.bmm(torch.ones(3, 5, 7, device="cuda"), torch.ones(3, 7, 2, device="cuda"))
opt.step()
torch.cuda.synchronize()
trace = torch.cuda.memory._snapshot()["device_traces"][0]
print(json.dumps({"capability": list(torch.cuda.get_device_capability()), "shapes": [list(y.shape), list(z.shape)],
                  "large": sorted({e["size"] for e in trace if e["action"] == "alloc" and e["size"] > 1 << 20})}))
"""


# PyTorch's default cuBLAS workspace (aten/src/ATen/cuda/CublasHandlePool.cpp, parseChosenWorkspaceSize):
# sm90 ? 4096 * 8 * 1024 : 4096 * 1024 * 2 + 16 * 1024 * 8 bytes.
@pytest.mark.parametrize("card, capability, workspace", [("h100", [9, 0], 32 * MiB),
                                                          ("a100", [8, 0], 8 * MiB + 128 * 1024)])
def test_forward_backward_and_adamw_get_through_with_the_cards_workspace(card, capability, workspace):
    out = run_json(MATMULS, card=card)
    assert out["capability"] == capability
    assert out["shapes"] == [[16, 4], [3, 5, 2]]
    assert out["large"] == [workspace]


def test_the_stand_ins_come_first_and_report_the_wheels_version():
    # torch's own start-up also loads the wheel's libraries by path; symbols resolve to the preloaded stand-ins.
    out = run_json("""
        import ctypes, json, torch
        torch.ones(2, 2, device="cuda") @ torch.ones(2, 2, device="cuda")

        class DlInfo(ctypes.Structure):
            _fields_ = [("fname", ctypes.c_char_p), ("fbase", ctypes.c_void_p),
                        ("sname", ctypes.c_char_p), ("saddr", ctypes.c_void_p)]

        libc = ctypes.CDLL(None)
        where = {}
        for name in ("cublasCreate_v2", "cublasLtMatmul", "cublasLtGetVersion"):
            info = DlInfo()
            libc.dladdr(ctypes.cast(getattr(libc, name), ctypes.c_void_p), ctypes.byref(info))
            where[name] = info.fname.decode()
        version = libc.cublasLtGetVersion
        version.restype = ctypes.c_size_t
        print(json.dumps({"where": where, "lt_version": version()}))
    """)
    ours = {str(fakegpu.library_dir() / name) for name in fakegpu.blas(fakegpu.torch_build().major)}
    assert set(out["where"].values()) == ours, out["where"]
    wheel = fakegpu.torch_build().cublas  # the nvidia-cublas (CUDA 13) or nvidia-cublas-cu12 wheel's version
    major, minor, patch = (int(p) for p in wheel.split(".")[:3])
    assert out["lt_version"] == major * 10000 + minor * 100 + patch
