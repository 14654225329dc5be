"""The CUDA glue compiles against the torch releases it must build with (scripts/check_cuda_build.sh).

Runs where the wheels are at hand and skips where they are not: give their
paths in TORCHMEM_TORCH_WHEELS (separated by os.pathsep), e.g. after
`pip download --no-deps torch==2.11.0 -d DIR` (the GPU machine's release).
Needs the CUDA headers ($CUDA_HOME, default /usr/local/cuda).
"""
import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
WHEELS = [w for w in os.environ.get("TORCHMEM_TORCH_WHEELS", "").split(os.pathsep) if w]
CUDA_HOME = pathlib.Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))


@pytest.mark.skipif(not WHEELS, reason="set TORCHMEM_TORCH_WHEELS to torch wheels (CUDA builds) to compile against")
@pytest.mark.skipif(not (CUDA_HOME / "include" / "cuda_runtime.h").exists(), reason="no CUDA headers")
def test_glue_compiles_against_each_torch():
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "check_cuda_build.sh"), *WHEELS], cwd=ROOT,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert proc.stdout.count("   ok      ") == 5 * len(WHEELS)


def test_the_script_refuses_a_torch_without_cuda(tmp_path):
    (tmp_path / "torch" / "include").mkdir(parents=True)
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "check_cuda_build.sh"), str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    if "no CUDA headers" in proc.stderr:
        pytest.skip("no CUDA headers")
    assert proc.returncode == 1 and "not a CUDA build of torch" in proc.stderr
