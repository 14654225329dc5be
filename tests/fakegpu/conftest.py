"""The fake-GPU tier: these tests run on the fake GPU (`make test-fakegpu`).

Where the tier is required (TORCHMEM_FAKEGPU_REQUIRED=1, set by the Makefile)
and the process is not on the fake GPU, or torch is not a CUDA build, the run
stops with an error instead of skipping.
"""
import os

import pytest
import torch

from torchmem import fakegpu


def pytest_collection_modifyitems(config, items):
    problem = None
    if torch.version.cuda is None:
        problem = f"torch {torch.__version__} is not a CUDA build"
    elif not fakegpu.on_fake_gpu():
        problem = "this process does not run on the fake GPU (start pytest under python -m torchmem.fakegpu)"
    if problem is None:
        return
    if os.environ.get("TORCHMEM_FAKEGPU_REQUIRED") == "1":
        raise pytest.UsageError(f"FAKE-GPU TIER CANNOT RUN: {problem}")
    skip = pytest.mark.skip(reason=f"fake-GPU tier: {problem}")
    for item in items:
        if "tests/fakegpu" in str(item.fspath):
            item.add_marker(skip)
