"""Helpers for the CUDA tests: each test that swaps PyTorch's CUDA allocator
runs in a fresh interpreter (PyTorch allows one swap per process)."""
import json
import os
import subprocess
import textwrap
from typing import Any, Callable

import pytest
import torch

# The one subprocess runner; ROOT for the tests.
from tests.support.subprocess_runner import ROOT, last_json, run_python  # noqa: F401

MiB = 1024 * 1024

# The fake GPU (torchmem.fakegpu, `make test-fakegpu`): PyTorch's CUDA build on
# a fake runtime. Memory, streams, events, graphs' capture and copies are real
# there; kernels are accepted and skipped, so values computed on the device
# are not, and cuBLAS and cuDNN do not initialise.
FAKE_GPU = os.environ.get("TORCHMEM_FAKEGPU") == "1"

requires_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (or the fake GPU)")
# On the fake GPU a child given env=TWO_GPUS has two cards.
TWO_GPUS = {"TORCHMEM_FAKEGPU_DEVICES": "2"} if FAKE_GPU else {}
requires_two_gpus = pytest.mark.skipif(
    not FAKE_GPU and (not torch.cuda.is_available() or torch.cuda.device_count() < 2), reason="needs two CUDA GPUs"
)
NO_KERNELS = ("needs real arithmetic: the fake GPU accepts kernels and skips them, so values computed on the "
              "device are not real (cuBLAS and cuDNN, with runtimes of their own, do not initialise on it)")
requires_kernels = pytest.mark.skipif(FAKE_GPU, reason=NO_KERNELS)


def computed(checks: dict) -> dict:
    """Expected notes of values that kernels compute: checked where kernels run, not on the fake GPU."""
    return {} if FAKE_GPU else checks


# Prepended to every child, torchmem installed or not. Values reach the GPU by
# copies (real on the fake GPU too) and are read back on the host; hold()
# keeps a stream's work pending (the fake GPU holds it; a GPU sleeps on it).
COMMON = """
import json, os, torch, torchmem
from torchmem.runtime import cuda as tmcuda
from torchmem.runtime.devices import cuda_installed
FAKE_GPU = os.environ.get("TORCHMEM_FAKEGPU") == "1"

def filled(shape, value, dtype=torch.float32, device="cuda"):
    return torch.full(shape if isinstance(shape, (tuple, list)) else (shape,), value, dtype=dtype).to(device)

def put(t, value):
    t.copy_(torch.full(tuple(t.shape), value, dtype=t.dtype))
    return t

def host_sum(t):
    return float(t.cpu().double().sum())

def hold(stream):
    if FAKE_GPU:
        from torchmem.fakegpu import Control
        Control().hold(stream)
    else:
        with torch.cuda.stream(stream):
            torch.cuda._sleep(200_000_000)

def release(stream):
    if FAKE_GPU:
        from torchmem.fakegpu import Control
        control = Control()
        control.hold(stream, False)
        control.complete(stream)
"""

# Prepended to every child that installs torchmem: before anything touches CUDA.
PRELUDE = COMMON + """
tmcuda.install_cuda("caching", os.environ.get("TORCHMEM_TEST_CONF", ""))
"""


def run_child(code: str, conf: str = "", install: bool = True, timeout: int = 240,
              env: dict | None = None) -> subprocess.CompletedProcess:
    """Run `code` after PRELUDE (torchmem installed on CUDA with `conf`), or after COMMON when not `install`."""
    return run_python(code, {"TORCHMEM_TEST_CONF": conf, **(env or {})}, timeout, prelude=PRELUDE if install else COMMON)


def run_json(code: str, **kwargs) -> dict:
    """Run `code`, which prints one JSON object on its last line; return it."""
    return last_json(run_child(code, **kwargs))


# Prepended (after PRELUDE) to the children of run_noted: note() reports a
# value at once, so a child that dies later still tells what it saw; attempt()
# notes what a call returns, or what it raised, and goes on.
NOTES = """
import gc, sys, time
INSTALLED = cuda_installed()

def note(key, value):
    print("@note " + json.dumps({key: value}), flush=True)

def attempt(key, fn):
    try:
        value = fn()
    except Exception as e:
        note(key, f"raised {type(e).__name__}: {str(e)[:300]}")
        return None
    note(key, value)
    return value

def pool_count():
    return tmcuda.pool_count(0) if INSTALLED else None

def pending_frees():
    return tmcuda.pending_frees(0) if INSTALLED else None

def segments():
    return {s["address"]: s["total_size"] for s in torch.cuda.memory._snapshot()["segments"]}

def within(t, segs):
    p = t.data_ptr()
    return any(a <= p < a + n for a, n in segs.items())

def capture_violations():  # calls refused during a capture (the fake GPU counts them); None on a GPU
    if not FAKE_GPU:
        return None
    from torchmem.fakegpu import Control
    return Control().counter("capture_violations")
"""


def _text(output) -> str:
    return output.decode(errors="replace") if isinstance(output, bytes) else (output or "")


def that(text: str, predicate: Callable[[Any], bool]) -> Callable[[Any], bool]:
    """An expectation run_noted's checks test with `predicate`, reported as `text`."""
    predicate.__doc__ = text
    return predicate


class Noted(dict):
    """What a child noted, key by key, with its exit status and output."""

    returncode: int = 0
    stdout: str = ""
    stderr: str = ""
    label: str = ""


def run_noted(code: str, conf: str = "", install: bool = True, timeout: int = 120, env: dict | None = None) -> Noted:
    """Run `code` (it calls note(key, value) as it goes) in a fresh interpreter, with
    torchmem installed (conf in PYTORCH_CUDA_ALLOC_CONF's grammar) or, with
    install=False, under PyTorch's own allocator with PYTORCH_CUDA_ALLOC_CONF=conf."""
    env = dict(env or {}, **({} if install else {"PYTORCH_CUDA_ALLOC_CONF": conf}))
    try:
        proc = run_child(NOTES + textwrap.dedent(code), conf=conf, install=install, timeout=timeout, env=env)
        returncode, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as e:
        returncode, stdout, stderr = -1, _text(e.stdout), f"timed out after {timeout} s\n" + _text(e.stderr)
    noted = Noted()
    for line in stdout.splitlines():
        if line.startswith("@note "):
            noted.update(json.loads(line[len("@note "):]))
    noted.returncode, noted.stdout, noted.stderr = returncode, stdout, stderr
    noted.label = "torchmem" + (f" ({conf})" if conf else "") if install else "native" + (f" ({conf})" if conf else "")
    return noted


def differences(noted: Noted, expected: dict) -> list[str]:
    """Each expected key whose noted value differs: a value is compared with ==, a
    callable is a predicate on the noted value."""
    out = []
    for key, want in expected.items():
        if key not in noted:
            out.append(f"{key}: not noted")
            continue
        got = noted[key]
        try:
            ok = want(got) if callable(want) else got == want
        except Exception as e:  # a predicate that cannot take what was noted: a difference too
            ok = False
            got = f"{got!r} ({type(e).__name__} in the check: {e})"
        if not ok:
            out.append(f"{key}: got {got!r}, expected {want.__doc__ if callable(want) and want.__doc__ else repr(want)}")
    if noted.returncode != 0:
        out.append(f"exit status {noted.returncode}")
    return out


def check_noted(name: str, code: str, expected: dict, conf: str = "", timeout: int = 120,
                native_control: bool = True) -> Noted:
    """Run `code` under torchmem and compare its notes with `expected`. When they
    differ, run the same code under PyTorch's own allocator too and report both:
    a check that fails natively as well is a mistake of the test, not of torchmem.
    (Not after a timeout: the stage's time is better spent elsewhere.)"""
    ours = run_noted(code, conf=conf, timeout=timeout)
    diff = differences(ours, expected)
    if not diff:
        return ours
    lines = [f"{name}: {len(diff)} check(s) differ under torchmem: " + "; ".join(d.split(":")[0] for d in diff)]
    lines += [f"  {d}" for d in diff]
    if native_control and ours.returncode == -1:
        lines.append("native allocator on the same code: not run, torchmem's run timed out")
    elif native_control:
        native = run_noted(code, conf=conf, install=False, timeout=timeout)
        native_diff = differences(native, expected)
        lines.append(f"native allocator on the same code: {'all checks pass' if not native_diff else 'differs too:'}")
        lines += [f"  {d}" for d in native_diff]
        lines.append(f"native notes: {json.dumps(dict(native))[:3000]}")
        if native.returncode != 0:
            lines.append("native stderr: " + native.stderr[-1500:])
    lines.append(f"torchmem notes: {json.dumps(dict(ours))[:3000]}")
    lines.append("torchmem stderr: " + ours.stderr[-3000:])
    raise AssertionError("\n".join(lines))
