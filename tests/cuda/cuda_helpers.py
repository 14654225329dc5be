"""Helpers for the CUDA tests: each test that swaps PyTorch's CUDA allocator
runs in a fresh interpreter (PyTorch allows one swap per process)."""
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MiB = 1024 * 1024

requires_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
requires_two_gpus = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two CUDA GPUs"
)

# Prepended to every child: install before anything touches CUDA.
PRELUDE = """
import json, os, torch, torchmem
from torchmem import cuda as tmcuda
tmcuda.install_cuda("caching", os.environ.get("TORCHMEM_TEST_CONF", ""))
"""


def run_child(code: str, conf: str = "", install: bool = True, timeout: int = 240) -> subprocess.CompletedProcess:
    env = dict(os.environ, TORCHMEM_TEST_CONF=conf)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    body = (PRELUDE if install else "import json, os, torch, torchmem\nfrom torchmem import cuda as tmcuda\n")
    return subprocess.run(
        [sys.executable, "-c", body + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        cwd=ROOT,
    )


def run_json(code: str, **kwargs) -> dict:
    """Run `code`, which prints one JSON object on its last line; return it."""
    proc = run_child(code, **kwargs)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])
