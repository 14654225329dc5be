"""Compile a benchmark's C++ driver against torchmem's core (no torch)."""
from __future__ import annotations

import glob
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Every source of the core, its subfolders included (csrc/core/<concept>/...).
CORE = sorted(glob.glob(os.path.join(ROOT, "csrc/core/**/*.cpp"), recursive=True))
HEADERS = sorted(glob.glob(os.path.join(ROOT, "csrc/core/**/*.h"), recursive=True))


def build(source: str, name: str, extra: list[str] | None = None) -> str:
    """g++ -O2 the driver with the core's sources; returns the binary path (rebuilt when stale)."""
    out_dir = os.path.join(ROOT, "build", "bench")
    os.makedirs(out_dir, exist_ok=True)
    binary = os.path.join(out_dir, name)
    inputs = [source] + CORE
    if os.path.exists(binary) and all(os.path.getmtime(binary) >= os.path.getmtime(p) for p in inputs + HEADERS):
        return binary
    cmd = ["g++", "-O2", "-std=c++17", "-pthread", f"-I{ROOT}/csrc", "-o", binary, *inputs, *(extra or [])]
    subprocess.run(cmd, check=True)
    return binary
