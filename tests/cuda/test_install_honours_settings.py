"""torchmem.install() takes the allocator settings PyTorch's own allocator would take (Note [Settings on CUDA]
in torchmem/runtime/cuda.py): the argument, then TORCHMEM_ALLOC_CONF, then PYTORCH_CUDA_ALLOC_CONF, else
PYTORCH_ALLOC_CONF, with the installed torch's precedence.

Each case runs one small program twice, each in a fresh interpreter: under PyTorch's native allocator and
after a bare `torchmem.install()`, with the same environment. Both record their history; the test compares
every segment (segment_alloc or segment_map, by size, in order) and every allocation's place (segment
ordinal, offset) and free. The program begins with the 3, 5 and 30 MiB tensors of the issue, which share one
40 MiB expandable segment when expandable_segments is on, and two fixed segments when it is off.

Needs a GPU or the fake GPU (`make test-fakegpu`).
"""
from __future__ import annotations

import json

import pytest
import torch

from tests.cuda.cuda_helpers import FAKE_GPU, requires_gpu
from tests.support.subprocess_runner import run_python

pytestmark = [requires_gpu, pytest.mark.skipif(not FAKE_GPU, reason=(
    "compares a run of PyTorch's allocator with a run of torchmem's: needs the fake GPU, where both start "
    "from the same empty card"))]

MiB = 1 << 20
VARIABLES = ("TORCHMEM_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF")

CHILD = """
import json, os, sys, warnings
import torch
warnings.simplefilter("always")
caught = []
if os.environ.get("TM_INSTALL") == "1":
    import torchmem
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torchmem.install()
        torchmem.install()                              # again, same settings: nothing more is said
    caught = [str(w.message) for w in seen]
torch.cuda.memory._record_memory_history(max_entries=100_000)
MiB = 1 << 20
keep = [torch.empty(n * MiB, dtype=torch.uint8, device="cuda") for n in (3, 5, 30)]
more = []
for n in (4, 1, 12, 2, 25, 7):
    more.append(torch.empty(n * MiB, dtype=torch.uint8, device="cuda"))
del keep[1], more[2]
more += [torch.empty(n * MiB + 4096, dtype=torch.uint8, device="cuda") for n in (6, 11, 3)]
small = [torch.empty(n, dtype=torch.uint8, device="cuda") for n in (512, 70_000, 1_000_000)]
snapshot = torch.cuda.memory._snapshot()
total = torch.cuda.get_device_properties(0).total_memory
bases, events = [], []

def place(addr):
    best = None
    for k, (base, extent) in enumerate(bases):
        if base <= addr < base + extent and (best is None or base > bases[best][0]):
            best = k
    return [best, addr - bases[best][0]] if best is not None else [None, None]

for e in snapshot["device_traces"][0]:
    action, addr, n = e["action"], e["addr"], e["size"]
    if action == "segment_alloc":
        bases.append((addr, n))
        events.append([action, len(bases) - 1, n])
    elif action == "segment_map":
        k, offset = place(addr)
        if k is None:
            bases.append((addr, total))
            k, offset = len(bases) - 1, 0
        events.append([action, k, offset, n])
    elif action in ("alloc", "free_requested", "free_completed", "segment_free", "segment_unmap"):
        events.append([action, *place(addr), n])
settings = snapshot.get("allocator_settings", {})
print(json.dumps({"events": events, "caught": caught,
                  "expandable": settings.get("expandable_segments"), "max_split_size": settings.get("max_split_size"),
                  "segments": sorted(s["total_size"] for s in snapshot["segments"])}))
"""


def run(env: dict[str, str], install: bool) -> dict:
    proc = run_python(CHILD, {**env, "TM_INSTALL": "1" if install else "0"}, 300,
                      drop_env=[v for v in VARIABLES if v not in env])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def first_difference(ours: list, native: list) -> str:
    for k, (a, b) in enumerate(zip(ours, native)):
        if a != b:
            return f"event {k}: torchmem {a}, native {b}"
    return f"torchmem has {len(ours)} events, native {len(native)}"


def alike(ours: dict, native: dict) -> None:
    assert ours["events"] == native["events"], first_difference(ours["events"], native["events"])
    assert ours["segments"] == native["segments"]
    assert ours["expandable"] == native["expandable"]
    assert ours["max_split_size"] == native["max_split_size"]


def first_three_share_one_segment(result: dict) -> bool:
    """The 3, 5 and 30 MiB tensors land in one segment (ordinal 0), one after the other."""
    allocs = [e for e in result["events"] if e[0] == "alloc"][:3]
    return [e[1:] for e in allocs] == [[0, 0, 3 * MiB], [0, 3 * MiB, 5 * MiB], [0, 8 * MiB, 30 * MiB]]


def reserved_for_first_three(result: dict) -> dict[int, int]:
    """Bytes mapped (segment_map) or allocated (segment_alloc) per segment up to the third tensor's alloc."""
    out: dict[int, int] = {}
    allocs = 0
    for e in result["events"]:
        if e[0] == "alloc":
            allocs += 1
            if allocs == 3:
                break
        elif e[0] in ("segment_map", "segment_alloc"):
            out[e[1]] = out.get(e[1], 0) + e[-1]
    return out


def reads_alloc_conf() -> bool:
    """Whether the installed torch's CUDA allocator falls back to PYTORCH_ALLOC_CONF (torch 2.10 and later)."""
    return tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 10)


@pytest.mark.parametrize("name", ["PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"])
def test_pytorch_variable_alone(name):
    env = {name: "expandable_segments:True"}
    native, ours = run(env, install=False), run(env, install=True)
    alike(ours, native)
    honoured = name == "PYTORCH_CUDA_ALLOC_CONF" or reads_alloc_conf()
    assert native["expandable"] is honoured
    assert first_three_share_one_segment(native) is honoured
    if honoured:
        assert reserved_for_first_three(native) == {0: 40 * MiB}  # one 40 MiB expandable segment
        [said] = [m for m in ours["caught"] if "takes its settings from" in m]
        assert f"{name}=expandable_segments:True" in said
    assert not [m for m in ours["caught"] if "not honoured" in m]


def test_both_variables_differ():
    """PyTorch takes PYTORCH_CUDA_ALLOC_CONF whole and ignores PYTORCH_ALLOC_CONF; torchmem does the same."""
    env = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False,max_split_size_mb:40",
           "PYTORCH_ALLOC_CONF": "expandable_segments:True"}
    native, ours = run(env, install=False), run(env, install=True)
    alike(ours, native)
    assert native["expandable"] is False and native["max_split_size"] == 40 * MiB
    assert not first_three_share_one_segment(native)
    assert reserved_for_first_three(native) == {0: 20 * MiB, 1: 30 * MiB}  # two fixed segments
    [said] = [m for m in ours["caught"] if "takes its settings from" in m]
    assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False,max_split_size_mb:40" in said


def test_torchmem_variable_wins():
    """TORCHMEM_ALLOC_CONF comes before PyTorch's variable: torchmem under it places as native under the same
    settings in PyTorch's variable, and says PyTorch's variable is not applied."""
    setting = "expandable_segments:True"
    native = run({"PYTORCH_CUDA_ALLOC_CONF": setting}, install=False)
    ours = run({"TORCHMEM_ALLOC_CONF": setting, "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:40"}, install=True)
    alike(ours, native)
    assert first_three_share_one_segment(ours)
    [said] = [m for m in ours["caught"] if "is not applied" in m]
    assert "PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:40" in said and "TORCHMEM_ALLOC_CONF takes precedence" in said
    assert not [m for m in ours["caught"] if "takes its settings from" in m]


def test_a_key_torchmem_cannot_honour_is_named():
    env = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True,release_lock_on_cudamalloc:True"}
    native, ours = run(env, install=False), run(env, install=True)
    alike(ours, native)
    [named] = [m for m in ours["caught"] if "not honoured" in m]
    assert "release_lock_on_cudamalloc:True" in named and "PYTORCH_CUDA_ALLOC_CONF" in named
