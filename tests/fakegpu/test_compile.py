"""torch.compile with inductor on the fake GPU: Triton's kernels load, launches are skipped, memory is inductor's.

Each check runs in a fresh interpreter on the fake card with its own, empty
inductor and Triton caches, so every kernel is compiled (ptxas included) and
loaded through the fake libcuda.so.1. Expected figures come from what the
code does: the buffers inductor's generated wrapper creates, and the
intermediates a fused kernel does not need.
"""
from __future__ import annotations

import os
import sys

import torch
from tests.fakegpu.helpers import MiB, run_json

from torchmem import preflight
from torchmem.preflight.hook import history_context


def compile_env(tmp_path) -> dict[str, str]:
    return {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"), "TRITON_CACHE_DIR": str(tmp_path / "triton")}


WRAPPER_BUFFERS = r"""
import json, re, torch
from torch._inductor.utils import run_and_get_code

def f(x, w):
    return (torch.nn.functional.gelu(x @ w) * 2).sum(dim=1) + x.mean(dim=1)

x = torch.randn(256, 512, device="cuda")
w = torch.randn(512, 1024, device="cuda")
g = torch.compile(f)
_, codes = run_and_get_code(g, x, w)
buffers = []
for code in codes:
    for sizes, strides, dtype in re.findall(r"empty_strided_cuda\(\(([^()]*)\), \(([^()]*)\), torch\.(\w+)\)", code):
        sizes = [int(s) for s in sizes.split(",") if s.strip()]
        strides = [int(s) for s in strides.split(",") if s.strip()]
        elements = 1 + sum((n - 1) * s for n, s in zip(sizes, strides)) if all(sizes) else 0
        buffers.append(elements * torch.empty(0, dtype=getattr(torch, dtype)).element_size())
torch.cuda.synchronize()
torch.cuda.memory._record_memory_history(max_entries=10000)
out = g(x, w)
torch.cuda.synchronize()
snap = torch.cuda.memory._snapshot()
torch.cuda.memory._record_memory_history(enabled=None)
allocs = [e["size"] for e in snap["device_traces"][0] if e["action"] == "alloc"]
print(json.dumps({"buffers": buffers, "allocs": allocs, "triton": "triton_" in "".join(codes),
                  "launched": bool(out.shape == (256,))}))
"""


def test_a_compiled_function_allocates_the_buffers_inductors_wrapper_creates(tmp_path):
    got = run_json(WRAPPER_BUFFERS, env=compile_env(tmp_path), timeout=600)
    assert got["triton"] and got["launched"]
    assert got["buffers"], "the wrapper creates no buffer: the test would hold nothing"
    rounded = sorted(max(512, -(-b // 512) * 512) for b in got["buffers"])  # PyTorch's 512-byte unit
    assert sorted(got["allocs"]) == rounded


FUSION = r"""
import json, sys, torch

def f(x):
    return ((x * 2).sin() + 1).cos()

peaks = {}
for backend in ("aot_eager", "inductor"):
    g = torch.compile(f, backend=backend)
    x = torch.empty(4 << 20, device="cuda")  # 16 MiB of float32
    with torch.no_grad():
        del_me = g(x)  # compiles
        del del_me
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        out = g(x)
        torch.cuda.synchronize()
    peaks[backend] = torch.cuda.max_memory_allocated()
    del x, out
print(json.dumps(peaks))
"""


def test_fusion_drops_the_intermediates_that_aot_eager_keeps(tmp_path):
    """Four pointwise ops on 16 MiB: aot_eager runs them one by one, so two intermediates live at once beside the
    input (48 MiB); inductor fuses them into one kernel that writes only the output (32 MiB)."""
    peaks = run_json(FUSION, env=compile_env(tmp_path), timeout=600)
    assert peaks == {"aot_eager": 48 * MiB, "inductor": 32 * MiB}


MODES = r"""
import json, torch
import torch._inductor.config as config
from torchmem.fakegpu import Control

def f(x):
    return (x * 2).sin() + 1

config.max_autotune_pointwise = True  # several Triton configs, each timed on the fake GPU's events
tuned = torch.compile(f)
x = torch.empty(1 << 20, device="cuda")
control = Control()
before = control.counter("event_records")
tuned(x)
timed = control.counter("event_records") - before  # what the benchmarks recorded; plain ops record none
config.max_autotune_pointwise = False

torch._dynamo.reset()
graphed = torch.compile(f, mode="reduce-overhead")
for _ in range(3):  # warm-up, record, replay
    out = graphed(x)
torch.cuda.synchronize()
pools = sorted({tuple(s["segment_pool_id"]) for s in torch.cuda.memory._snapshot()["segments"]})
print(json.dumps({"timed": timed, "pools": pools}))
"""


def test_autotuning_and_cuda_graphs_complete(tmp_path):
    got = run_json(MODES, env=compile_env(tmp_path), timeout=600)
    assert got["timed"] > 0  # autotuning timed its candidates (Note [Elapsed time on the fake GPU])
    assert any(pool != [0, 0] for pool in got["pools"]), got["pools"]  # the CUDA graph tree's private pool


RECOMPUTED_UNDER_CHECKPOINT = r"""
import torch
from torch.utils.checkpoint import checkpoint

lin = torch.nn.Linear(64, 64, device="cuda")

@torch.compile(fullgraph=True)
def scatter_back(h, order):
    out = torch.empty_like(h)
    out[order] = h
    return out * 2

def block(x):
    h = lin(x)
    return x + scatter_back(h, torch.arange(h.shape[0], device=h.device).flip(0))

x = torch.randn(8, 64, device="cuda", requires_grad=True)
checkpoint(block, x, use_reentrant=False).sum().backward()
torch.cuda.synchronize()
"""


def test_a_compiled_function_recomputed_under_checkpointing_runs_under_preflight(tmp_path):
    """torch 2.11.0 fails this recompute while the history records stacks at frees (Note [Frees recorded without
    stacks]); preflight records so that it runs, on every torch of the tiers."""
    report = preflight.run_command([sys.executable, "-c", RECOMPUTED_UNDER_CHECKPOINT], "h100", out=tmp_path / "out",
                                   advise=False, capture_output=True,
                                   env=dict(os.environ, **compile_env(tmp_path)))
    assert report.fits, report.to_json()
    without_stacks = [n for p in report.processes for n in p.get("notes", []) if "without their stacks" in n]
    assert bool(without_stacks) == (history_context(torch.__version__) == "alloc")
    assert [history_context(v) for v in ("2.10.0+cu128", "2.11.0+cu130", "2.13.0", "2.14.1+cu130")] == \
        ["all", "alloc", "alloc", "all"]
