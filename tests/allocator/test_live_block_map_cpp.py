"""Builds and runs the C++ test of LiveBlockMap, the caching allocator's flat
hash map of live blocks (tests/cpp/test_live_block_map.cpp, header only).

By hand:
    g++ -O1 -std=c++17 -Icsrc tests/cpp/test_live_block_map.cpp -o build/test_live_block_map \
        && build/test_live_block_map
Under AddressSanitizer and UBSan when the compiler has them.
"""
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SOURCE = os.path.join(ROOT, "tests", "cpp", "test_live_block_map.cpp")


def _build(out: str, flags: list[str]) -> subprocess.CompletedProcess:
    cmd = [os.environ.get("CXX", "g++"), "-O1", "-g", "-std=c++17", f"-I{ROOT}/csrc", *flags, SOURCE, "-o", out]
    return subprocess.run(cmd, capture_output=True, text=True)


@pytest.mark.skipif(shutil.which(os.environ.get("CXX", "g++")) is None, reason="no C++ compiler")
def test_live_block_map_matches_unordered_map(tmp_path):
    binary = str(tmp_path / "test_live_block_map")
    build = _build(binary, ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined"])
    if build.returncode != 0:  # no sanitizer runtime: a plain build still checks the behaviour
        build = _build(binary, [])
    assert build.returncode == 0, build.stderr[-3000:]
    run = subprocess.run([binary], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "live_block_map: ok" in run.stdout
