"""Running code in a fresh interpreter on the fake GPU, for the fake-GPU tier's tests."""
from __future__ import annotations

import os
import subprocess
from typing import Any

# The one subprocess runner; ROOT for the tests.
from tests.support.subprocess_runner import ROOT, last_json, run_python  # noqa: F401
from torchmem import fakegpu

MiB = 1 << 20
GiB = 1 << 30


def run_code(code: str, card: str | int = "80GiB", devices: int = 1, timeout: int = 300,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter on a fake card (its settings, not this process's)."""
    on_card = fakegpu.environment(card, devices, base=dict(os.environ, **(env or {})))
    return run_python(code, timeout=timeout, base_env=on_card)


def run_json(code: str, **kwargs: Any) -> Any:
    """run_code, which must succeed and print one JSON value on its last line."""
    return last_json(run_code(code, **kwargs))
