"""Running code in a fresh interpreter on the fake GPU, for the fake-GPU tier's tests."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from typing import Any

from torchmem import fakegpu

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MiB = 1 << 20
GiB = 1 << 30


def run_code(code: str, card: str | int = "80GiB", devices: int = 1, timeout: int = 300,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter on a fake card (its settings, not this process's)."""
    full = fakegpu.environment(card, devices, base=dict(os.environ, **(env or {})))
    full["PYTHONPATH"] = ROOT + os.pathsep + full.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=full, timeout=timeout, cwd=ROOT)


def run_json(code: str, **kwargs: Any) -> Any:
    """run_code, which must succeed and print one JSON value on its last line."""
    proc = run_code(code, **kwargs)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])
