"""The fake NVML (fakegpu/nvml/nvml.c) answers as a card of the fake compute capability would.

torch 2.14.1's CUDA allocator asks NVML for the card's fabric info (nvmlDeviceGetGpuFabricInfoV) when it
picks how expandable segments are shared (so only with expandable_segments:True), and warns once when the call fails: "nvmlDeviceGetGpuFabricInfoV
failed. This function is only supported on sm90+". From sm90 a card outside any NVLink fabric answers with
the state "not supported"; before sm90 the call itself is not supported, and the warning is PyTorch's due.
"""
from __future__ import annotations

import pytest

from tests.cuda.cuda_helpers import FAKE_GPU, requires_gpu
from tests.support.subprocess_runner import run_python

pytestmark = [requires_gpu, pytest.mark.skipif(not FAKE_GPU, reason="checks the fake GPU's NVML")]

WARNING = "nvmlDeviceGetGpuFabricInfoV failed"

ALLOCATIONS = """
import torch
MiB = 1 << 20
kept = [torch.empty(n * MiB, dtype=torch.uint8, device="cuda") for n in (3, 5, 30)]
del kept[1]
kept.append(torch.empty(100, device="cuda"))
torch.cuda.synchronize()
print("allocated", torch.cuda.memory_allocated())
"""


def run(env: dict[str, str]):
    proc = run_python(ALLOCATIONS, env, 240)
    assert proc.returncode == 0 and "allocated" in proc.stdout, proc.stderr[-3000:]
    return proc


def test_an_allocation_run_prints_no_fabric_warning():
    """With expandable segments (the path that asks NVML; without them torch 2.14.1 does not ask)."""
    proc = run({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "TORCHMEM_FAKEGPU_CC": "9.0"})
    assert WARNING not in proc.stderr, proc.stderr[-3000:]


def test_below_sm90_the_fabric_query_is_unsupported():
    """The control: on an sm80 card NVML does not answer, and a torch that asks says so."""
    proc = run({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "TORCHMEM_FAKEGPU_CC": "8.0"})
    if WARNING not in proc.stderr:
        pytest.skip("this torch does not ask NVML for fabric info on this path")
    assert "only supported on sm90+" in proc.stderr
