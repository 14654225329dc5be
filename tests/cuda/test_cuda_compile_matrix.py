"""The CUDA glue compiles against the torch releases it must build with (scripts/check_cuda_build.sh).

Runs against every torch it finds and skips when it finds none. Name them in
TORCHMEM_TORCH_WHEELS, entries separated by os.pathsep: a torch wheel (a CUDA
build), a directory of wheels (each torch-*.whl in it), or a directory holding
torch/include (an installed torch's site-packages). For the matrix of
issue 14 (2.11.0 is the GPU machine's release):

    pip download --no-deps torch==2.11.0 -d /tmp/wheels    # and torch==2.13.0; from pypi.org, the CUDA builds
    TORCHMEM_TORCH_WHEELS=/tmp/wheels:/tmp/cudavenv/lib/python3.11/site-packages pytest tests/cuda/test_cuda_compile_matrix.py

Needs the CUDA headers ($CUDA_HOME, default /usr/local/cuda). About a minute
per torch on 2 cores, most of it unpacking the wheel's include/.
"""
import os
import pathlib
import re
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "check_cuda_build.sh"
CUDA_HOME = pathlib.Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))


def torches_named(value: str) -> list[str]:
    """The torches TORCHMEM_TORCH_WHEELS names, as the script takes them (directories of wheels expanded)."""
    found = []
    for entry in filter(None, value.split(os.pathsep)):
        path = pathlib.Path(entry)
        if path.is_file() and path.name.endswith(".whl"):
            found.append(str(path))
        elif (path / "torch" / "include").is_dir():
            found.append(str(path))
        elif path.is_dir():
            found.extend(str(w) for w in sorted(path.glob("torch-*.whl")))
    return found


TORCHES = torches_named(os.environ.get("TORCHMEM_TORCH_WHEELS", ""))


@pytest.mark.skipif(not TORCHES, reason="no torch to compile against: set TORCHMEM_TORCH_WHEELS (see the module's doc); the "
                    "fake-GPU tier's own build (make fakegpu-ext) compiles the glue against its CUDA torch")
@pytest.mark.skipif(not (CUDA_HOME / "include" / "cuda_runtime.h").exists(), reason="no CUDA headers")
def test_glue_compiles_against_each_torch():
    proc = subprocess.run(["bash", str(SCRIPT), *TORCHES], cwd=ROOT, capture_output=True, text=True, timeout=1800)
    summary = proc.stdout.split("== summary\n")[-1]
    print(summary)  # which versions compile, in pytest's -rP / -s output
    compiled = re.findall(r"^compiles +torch (\S+)", summary, re.M)
    failed = re.findall(r"^FAILS +(.*)$", summary, re.M)
    assert proc.returncode == 0 and not failed and len(compiled) == len(TORCHES), (
        f"compiles: {compiled}; fails: {failed}\n" + proc.stdout[-6000:] + proc.stderr[-2000:])


def test_directories_of_wheels_are_expanded(tmp_path):
    (tmp_path / "wheels").mkdir()
    for name in ("torch-2.11.0-cp311-cp311-manylinux_2_28_x86_64.whl", "torch-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl",
                 "numpy-2.0.0-cp311-cp311-manylinux_2_28_x86_64.whl"):
        (tmp_path / "wheels" / name).write_bytes(b"")
    (tmp_path / "site" / "torch" / "include").mkdir(parents=True)
    found = torches_named(os.pathsep.join([str(tmp_path / "wheels"), str(tmp_path / "site"), "", str(tmp_path / "none")]))
    assert [pathlib.Path(p).name for p in found] == [
        "torch-2.11.0-cp311-cp311-manylinux_2_28_x86_64.whl", "torch-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl", "site"]


def test_the_script_refuses_a_torch_without_cuda(tmp_path):
    (tmp_path / "torch" / "include").mkdir(parents=True)
    proc = subprocess.run(["bash", str(SCRIPT), str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    if "no CUDA headers" in proc.stderr:
        pytest.skip("no CUDA headers")
    assert proc.returncode == 1 and "not a CUDA build of torch" in proc.stderr
    assert re.search(r"^FAILS +.*not a CUDA build", proc.stdout, re.M), proc.stdout


def test_the_script_refuses_a_directory_without_torch(tmp_path):
    proc = subprocess.run(["bash", str(SCRIPT), str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    if "no CUDA headers" in proc.stderr:
        pytest.skip("no CUDA headers")
    assert proc.returncode == 1 and "no torch/include and no torch-*.whl" in proc.stderr
