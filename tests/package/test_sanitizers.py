"""The C++ reliability drivers of the core (tests/cpp/core_driver.cpp,
tests/cpp/stitch_driver.cpp for the stitch policy and
tests/cpp/device_memory_driver.cpp for DeviceMemory with threads): random
sequences, threads, injected device faults and bad input for the caching
allocator, arena, block pool, planner and replayer, with invariant checks.

- test_core_driver: the driver without sanitizers in quick mode
  (scripts/sanitize.sh's "plain" flavour: per-file -O0 objects, rebuilt only
  when their source or a header changes). A third build of the whole core
  costs make test about five CPU-minutes, so it and the two listing tests
  run with TORCHMEM_CPP_DRIVERS=1: `make sanitize-quick` sets it, and CI
  runs that target after `make test`.
- test_sanitizers_quick: scripts/sanitize.sh in quick mode (AddressSanitizer +
  UBSan + LeakSanitizer, then ThreadSanitizer). Two sanitizer builds of the
  whole core take minutes on two cores, so it runs only with
  TORCHMEM_SANITIZE=1 (or `make sanitize`, which runs the full script).
"""
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "sanitize.sh")


def _compiler() -> str:
    cxx = shutil.which(os.environ.get("CXX", "g++"))
    if cxx is None:
        pytest.skip("no C++ compiler (g++) on PATH")
    return cxx


def _script(sanitizers: str) -> subprocess.CompletedProcess:
    _compiler()
    env = dict(os.environ, TORCHMEM_QUICK="1", SANITIZERS=sanitizers)
    return subprocess.run(["bash", SCRIPT], capture_output=True, text=True, timeout=1800, env=env, cwd=ROOT)


drivers = pytest.mark.skipif(os.environ.get("TORCHMEM_CPP_DRIVERS") != "1",
                             reason="a third build of the core: run by `make sanitize-quick` (TORCHMEM_CPP_DRIVERS=1)")


@drivers
def test_core_driver():
    # The script's plain flavour: incremental per-file -O0 builds under build/sanitize/plain-quick.
    proc = _script("plain")
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert "0 failures" in proc.stdout and "== plain: clean" in proc.stdout, proc.stdout[-2000:]


@drivers
def test_core_driver_lists_every_component():
    binary = os.path.join(ROOT, "build", "sanitize", "plain-quick", "core_driver")
    if not os.path.exists(binary):
        assert _script("plain").returncode == 0
    names = subprocess.run([binary, "--list"], capture_output=True, text=True, timeout=60).stdout.split()
    for component in ("caching_", "arena_", "block_pool_", "planner_", "replayer", "planned_slab_"):
        assert any(n.startswith(component) for n in names), names
    assert {"caching_threads", "caching_fail_kth", "caching_random_faults", "arena_threads",
            "fork_while_threads_allocate", "fork_waits_for_a_held_lock"} <= set(names)


@drivers
def test_stitch_driver_lists_its_tests():
    binary = os.path.join(ROOT, "build", "sanitize", "plain-quick", "stitch_driver")
    if not os.path.exists(binary):
        assert _script("plain").returncode == 0
    names = subprocess.run([binary, "--list"], capture_output=True, text=True, timeout=60).stdout.split()
    assert {"stitch_stitches_free_pages", "stitch_fail_kth", "stitch_memory_fraction", "stitch_replayer"} <= set(names)
    core = os.path.join(ROOT, "build", "sanitize", "plain-quick", "core_driver")
    core_names = subprocess.run([core, "--list"], capture_output=True, text=True, timeout=60).stdout.split()
    assert {"stitch_random", "stitch_random_faults", "stitch_threads"} <= set(core_names)  # the native loops, policy:stitch


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("TORCHMEM_SANITIZE") != "1",
                    reason="two sanitizer builds of the core take minutes: set TORCHMEM_SANITIZE=1 or run make sanitize")
def test_sanitizers_quick():
    proc = _script("asan tsan")
    if proc.returncode == 2:
        pytest.skip(f"the compiler lacks a sanitizer runtime: {proc.stderr.strip()[-500:]}")
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert proc.stdout.count("0 failures") == 6  # three drivers, two sanitizers
    assert "== asan: clean" in proc.stdout and "== tsan: clean" in proc.stdout
