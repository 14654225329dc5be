"""Builds and runs the C++ tests of the arena, the block pool, the pmr adapters
and aligned_allocator (tests/cpp/test_arena_paged.cpp): pure C++17, no torch.

By hand:
    g++ -O1 -std=c++17 -Icsrc tests/cpp/test_arena_paged.cpp csrc/core/allocators/arena.cpp \
        csrc/core/allocators/paged_block_pool.cpp csrc/core/devices/host_device.cpp csrc/core/devices/sim_device.cpp \
        csrc/core/sync/fork_safety.cpp csrc/core/sync/fast_mutex.cpp -pthread -o build/test_arena_paged && build/test_arena_paged
The binary is cached under build/cpp_tests/, keyed by a hash of its sources.
TORCHMEM_SANITIZE=1 also runs it under AddressSanitizer and UBSan.
"""
import hashlib
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SOURCES = [
    "tests/cpp/test_arena_paged.cpp",
    "csrc/core/allocators/arena.cpp",
    "csrc/core/allocators/paged_block_pool.cpp",
    "csrc/core/devices/host_device.cpp",
    "csrc/core/devices/sim_device.cpp",
    "csrc/core/sync/fork_safety.cpp",
    "csrc/core/sync/fast_mutex.cpp",
]
HEADERS = [
    "csrc/core/allocators/arena.h",
    "csrc/core/allocators/paged_block_pool.h",
    "csrc/core/allocators/memory_resource.h",
    "csrc/core/allocators/aligned_allocator.h",
    "csrc/core/base/allocator.h",
    "csrc/core/devices/device.h",
    "csrc/core/base/out_of_memory.h",
    "csrc/core/devices/host_device.h",
    "csrc/core/devices/sim_device.h",
    "csrc/core/sync/fork_safety.h",
    "csrc/core/sync/fast_mutex.h",
]


def build(flags=("-O1",), tag="o1"):
    cxx = shutil.which(os.environ.get("CXX", "g++"))
    if cxx is None:
        pytest.skip("no C++ compiler (g++) on PATH")
    digest = hashlib.sha256(" ".join(flags).encode())
    for path in SOURCES + HEADERS:
        with open(os.path.join(ROOT, path), "rb") as f:
            digest.update(f.read())
    out_dir = os.path.join(ROOT, "build", "cpp_tests")
    os.makedirs(out_dir, exist_ok=True)
    binary = os.path.join(out_dir, f"test_arena_paged_{tag}_{digest.hexdigest()[:16]}")
    if not os.path.exists(binary):
        cmd = [cxx, *flags, "-std=c++17", "-Wall", "-Wextra", "-I", os.path.join(ROOT, "csrc")]
        cmd += [os.path.join(ROOT, s) for s in SOURCES] + ["-pthread", "-o", binary + ".tmp"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        os.replace(binary + ".tmp", binary)
    return binary


def test_cpp_arena_and_block_pool():
    proc = subprocess.run([build()], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 failures" in proc.stdout


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("TORCHMEM_SANITIZE") != "1", reason="set TORCHMEM_SANITIZE=1 (a ~1 min build)")
def test_cpp_under_sanitizers():
    try:
        binary = build(("-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined"), "asan")
    except AssertionError as e:
        pytest.skip(f"sanitizer build unavailable: {e}")
    proc = subprocess.run([binary], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
