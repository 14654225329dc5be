"""The C++ reliability driver of the core (tests/cpp/core_driver.cpp): random
sequences, threads, injected device faults and bad input for the caching
allocator, arena, block pool, planner and replayer, with invariant checks.

- test_core_driver: a plain -O0 build in quick mode (cached under
  build/reliability/, keyed by a hash of the sources), always run.
- test_sanitizers_quick: scripts/sanitize.sh in quick mode (AddressSanitizer +
  UBSan + LeakSanitizer, then ThreadSanitizer). Two sanitizer builds of the
  whole core take minutes on two cores, so it runs only with
  TORCHMEM_SANITIZE=1 (or `make sanitize`, which runs the full script).
"""
import glob
import hashlib
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "sanitize.sh")


def _core_files(pattern: str) -> list[str]:
    return sorted(glob.glob(os.path.join(ROOT, "csrc", "core", "**", pattern), recursive=True))


def _compiler() -> str:
    cxx = shutil.which(os.environ.get("CXX", "g++"))
    if cxx is None:
        pytest.skip("no C++ compiler (g++) on PATH")
    return cxx


def build_driver() -> str:
    cxx = _compiler()
    sources = [os.path.join(ROOT, "tests", "cpp", "core_driver.cpp")] + _core_files("*.cpp")
    flags = ["-O0", "-g", "-std=c++17", "-pthread", "-I", os.path.join(ROOT, "csrc")]
    digest = hashlib.sha256(" ".join([cxx] + flags).encode())
    for path in sources + _core_files("*.h"):
        with open(path, "rb") as f:
            digest.update(path.encode() + f.read())
    out_dir = os.path.join(ROOT, "build", "reliability")
    os.makedirs(out_dir, exist_ok=True)
    binary = os.path.join(out_dir, f"core_driver_{digest.hexdigest()[:16]}")
    if not os.path.exists(binary):
        proc = subprocess.run([cxx, *flags, *sources, "-o", binary + ".tmp"], capture_output=True, text=True,
                              timeout=600)
        assert proc.returncode == 0, proc.stderr[-4000:]
        os.replace(binary + ".tmp", binary)
    return binary


def test_core_driver():
    proc = subprocess.run([build_driver(), "--quick"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert proc.stdout.rstrip().endswith("0 failures"), proc.stdout[-2000:]


def test_core_driver_lists_every_component():
    names = subprocess.run([build_driver(), "--list"], capture_output=True, text=True, timeout=60).stdout.split()
    for component in ("caching_", "arena_", "block_pool_", "planner_", "replayer"):
        assert any(n.startswith(component) for n in names), names
    assert {"caching_threads", "caching_fail_kth", "caching_random_faults", "arena_threads"} <= set(names)


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("TORCHMEM_SANITIZE") != "1",
                    reason="two sanitizer builds of the core take minutes: set TORCHMEM_SANITIZE=1 or run make sanitize")
def test_sanitizers_quick():
    _compiler()
    env = dict(os.environ, TORCHMEM_QUICK="1")
    proc = subprocess.run(["bash", SCRIPT], capture_output=True, text=True, timeout=1800, env=env, cwd=ROOT)
    if proc.returncode == 2:
        pytest.skip(f"the compiler lacks a sanitizer runtime: {proc.stderr.strip()[-500:]}")
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert proc.stdout.count("0 failures") == 2
    assert "== asan: clean" in proc.stdout and "== tsan: clean" in proc.stdout
