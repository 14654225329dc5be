import json
import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from torchmem import _C

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sim_allocator(capacity: int = 80 * GiB, conf: str = "") -> "_C.CachingAllocator":
    """A caching allocator on a simulated device of `capacity` bytes."""
    return _C.CachingAllocator(_C.SimDevice(capacity), conf)


def block_of(allocator, addr: int) -> dict:
    """The block at `addr`, with its segment under key "segment"."""
    for seg in allocator.segments():
        for block in seg["blocks"]:
            if block["address"] == addr:
                return dict(block, segment=seg)
    raise KeyError(hex(addr))


def run_python(code: str, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter (for tests that swap PyTorch's allocator)."""
    full_env = dict(os.environ, **(env or {}))
    full_env["PYTHONPATH"] = ROOT + os.pathsep + full_env.get("PYTHONPATH", "")
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        cwd=ROOT,
    )


def run_python_json(code: str) -> Any:
    """Run `code` in a fresh interpreter; it must succeed and print JSON on its last line."""
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture
def sim():
    return sim_allocator


@pytest.fixture(autouse=True)
def no_unimplemented_fake_gpu_calls():
    """On the fake GPU (the fake-GPU tier sets TORCHMEM_FAKEGPU_LOG): a test fails
    when it, or any process it started, called a CUDA entry point that the fake
    GPU does not implement (a torch release that calls something new)."""
    log = os.environ.get("TORCHMEM_FAKEGPU_LOG")
    if not log:
        yield
        return
    before = os.path.getsize(log) if os.path.exists(log) else 0
    yield
    if os.path.exists(log) and os.path.getsize(log) > before:
        with open(log) as f:
            f.seek(before)
            calls = sorted(set(line.split(" (pid")[0] for line in f.read().splitlines()))
        pytest.fail("the fake GPU was asked for what it does not implement:\n  " + "\n  ".join(calls))
