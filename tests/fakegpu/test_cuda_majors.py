"""One fake GPU per CUDA major (fakegpu/, docs/fakegpu.md): CUDA 12 and CUDA 13 builds of torch.

The stand-ins of a major export every symbol of the real libraries of that
major, in the version node named after the soname, and the launcher picks the
set that matches the torch of the interpreter it will run. The fake-GPU tier
runs this file under torch 2.14.1 (CUDA 13) and the CUDA 12 tier under torch
2.6.0 (CUDA 12.4); each checks the set its torch needs against that torch's
own nvidia wheels.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from torchmem import fakegpu
from tests.fakegpu.helpers import ROOT, run_json
from tests.support.subprocess_runner import run_args

MAJOR = int(torch.version.cuda.split(".")[0]) if torch.version.cuda else None
SYMBOL_LISTS = {  # (soname, committed list) per major
    13: [("libcudart.so.13", "fakegpu/cudart/cudart_symbols.txt"), ("libcublas.so.13", "fakegpu/cublas/cublas_symbols.txt"),
         ("libcublasLt.so.13", "fakegpu/cublas/cublasLt_symbols.txt")],
    12: [("libcudart.so.12", "fakegpu/cudart/cudart12_symbols.txt"), ("libcublas.so.12", "fakegpu/cublas/cublas12_symbols.txt"),
         ("libcublasLt.so.12", "fakegpu/cublas/cublasLt12_symbols.txt")],
}


def versioned_exports(library: Path) -> dict[str, str]:
    """Defined dynamic symbols and their version node: {name: node} ('' when unversioned)."""
    out = subprocess.run(["readelf", "--dyn-syms", "-W", str(library)], check=True, capture_output=True,
                         text=True).stdout
    found = {}
    for line in out.splitlines():
        cols = line.split()
        if len(cols) < 8 or cols[6] == "UND" or cols[4] not in ("GLOBAL", "WEAK"):
            continue
        name, _, node = cols[7].replace("@@", "@").partition("@")
        found[name] = node
    return found


def real_library(soname: str) -> Path | None:
    """The library of this torch's nvidia wheels (nvidia/cu13/lib for CUDA 13, nvidia/<name>/lib for CUDA 12)."""
    site = Path(torch.__file__).parents[1] / "nvidia"
    found = sorted(site.glob(f"*/lib/{soname}"))
    return found[0] if found else None


def listed(path: str) -> set[str]:
    return {s.strip() for s in (Path(ROOT) / path).read_text().splitlines() if s.strip() and not s.startswith("#")}


@pytest.mark.parametrize("index", [0, 1, 2], ids=["cudart", "cublas", "cublasLt"])
def test_the_stand_in_exports_every_symbol_of_the_real_library_in_its_version_node(index):
    soname, symbols = SYMBOL_LISTS[MAJOR][index]
    real = real_library(soname)
    if real is None:
        pytest.skip(f"torch {torch.__version__}'s nvidia wheels hold no {soname}")
    ours_name = fakegpu.RUNTIME if soname.startswith("libcudart.") else soname
    ours = versioned_exports(fakegpu.library_dir(MAJOR) / ours_name)
    theirs = {name: node for name, node in versioned_exports(real).items() if name != soname}
    assert set(theirs.values()) == {soname}, f"the real {soname} has other version nodes: {set(theirs.values())}"
    missing = sorted(set(theirs) - set(ours))
    assert not missing, f"the {soname} stand-in lacks {len(missing)} of the real one's exports: {missing[:20]}"
    wrong = sorted(name for name in theirs if ours[name] != soname)
    assert not wrong, f"exported outside the {soname} node: {wrong[:20]}"
    assert set(theirs) <= listed(symbols), f"{symbols} is behind torch {torch.__version__}'s {soname}"


def test_the_runtime_and_cublas_report_this_major():
    out = run_json("""
        import ctypes, json, torch
        torch.ones(2, 2, device="cuda") @ torch.ones(2, 2, device="cuda")
        lib = ctypes.CDLL(None)
        runtime, driver = ctypes.c_int(), ctypes.c_int()
        lib.cudaRuntimeGetVersion(ctypes.byref(runtime))
        lib.cudaDriverGetVersion(ctypes.byref(driver))
        lib.cublasLtGetCudartVersion.restype = ctypes.c_size_t
        print(json.dumps({"runtime": runtime.value, "driver": driver.value,
                          "lt_cudart": lib.cublasLtGetCudartVersion(), "cuda": torch.version.cuda}))
    """)
    assert out["runtime"] // 1000 == MAJOR and out["lt_cudart"] // 1000 == MAJOR
    assert out["driver"] >= out["runtime"]


def fake_interpreter(folder: Path, cuda: str | None) -> Path:
    """A `python3` that imports a torch package claiming CUDA `cuda` (None: a CPU build), and nothing else of it."""
    package = folder / "site" / "torch"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('a stand-in torch: read, never imported')\n")
    (package / "version.py").write_text(f"__version__ = '2.6.0+fake'\ncuda: Optional[str] = {cuda!r}\n")
    python = folder / "bin" / "python3"
    python.parent.mkdir()
    python.write_text(f"#!/bin/sh\nPYTHONPATH={folder / 'site'} exec {sys.executable} -S \"$@\"\n")
    python.chmod(0o755)
    return python


def built_sets(folder: Path, majors: tuple[int, ...]) -> Path:
    """A folder laid out as `make fakegpu` lays out build/fakegpu, with empty files."""
    for major in majors:
        where = folder if major == 13 else folder / f"cuda{major}"
        where.mkdir(parents=True, exist_ok=True)
        for name in fakegpu.libraries(major):
            (where / name).write_bytes(b"")
    return folder


@pytest.mark.parametrize("cuda, folder", [("12.4", "cuda12"), ("13.0", ""), (None, "")])
def test_the_launcher_picks_the_set_of_the_commands_torch(tmp_path, monkeypatch, cuda, folder):
    libs = built_sets(tmp_path / "libs", (12, 13))
    monkeypatch.setenv("TORCHMEM_FAKEGPU_LIBS", str(libs))
    python = fake_interpreter(tmp_path / "venv", cuda)
    script = tmp_path / "train"
    script.write_text(f"#!{python}\nprint('hi')\n")
    script.chmod(0o755)
    for command in ([str(python), "train.py"], [str(script)]):
        env = fakegpu.environment("24GiB", command=command, base={"PATH": os.environ["PATH"]})
        where = libs / folder if folder else libs
        major = 12 if cuda == "12.4" else 13
        assert env["LD_PRELOAD"].split(":") == [str(where / name) for name in (fakegpu.RUNTIME, *fakegpu.blas(major), "libnccl.so.2")]
        assert env["LD_LIBRARY_PATH"].split(":")[0] == str(where)


def test_without_a_variable_the_installed_packages_set_comes_before_a_checkouts(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHMEM_FAKEGPU_LIBS", raising=False)
    package, checkout = tmp_path / "package" / "lib", tmp_path / "checkout" / "build" / "fakegpu"
    for major in (12, 13):
        built_sets(package / f"cuda{major}", (13,))  # pip's layout: lib/cuda12 and lib/cuda13, each flat
        for name in fakegpu.libraries(major):
            (package / f"cuda{major}" / name).write_bytes(b"")
    built_sets(checkout, (12, 13))
    monkeypatch.setattr(fakegpu, "PACKAGED", package)
    monkeypatch.setattr(fakegpu, "CHECKOUT", checkout)
    assert fakegpu.library_dir(13) == package / "cuda13"
    assert fakegpu.library_dir(12) == package / "cuda12"
    (package / "cuda12" / "libcublas.so.12").unlink()  # an incomplete set is passed over
    assert fakegpu.library_dir(12) == checkout / "cuda12"
    (checkout / "cuda12" / "libcublas.so.12").unlink()
    with pytest.raises(fakegpu.FakeGPUError, match=r"CUDA 12 builds of torch is not installed \(libcublas.so.12 "):
        fakegpu.library_dir(12)


def test_a_missing_set_is_a_one_line_error_saying_what_to_run(tmp_path):
    libs = built_sets(tmp_path / "libs", (13,))
    python = fake_interpreter(tmp_path / "venv", "12.4")
    proc = run_args(["-m", "torchmem.fakegpu", "--", str(python), "-c", "pass"], {"TORCHMEM_FAKEGPU_LIBS": str(libs)},
                    120)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "CUDA 12" in lines[0] and "make fakegpu" in lines[0] and "libcublas.so.12" in lines[0]


def test_a_torch_of_another_major_is_refused_in_one_line(tmp_path):
    built_sets(tmp_path / "libs", (12, 13))
    python = fake_interpreter(tmp_path / "venv", "11.8")
    proc = run_args(["-m", "torchmem.fakegpu", "--", str(python), "-c", "pass"],
                    {"TORCHMEM_FAKEGPU_LIBS": str(tmp_path / "libs")}, 120)
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and "CUDA 11 build" in proc.stderr, proc.stderr


def test_this_interpreters_build_is_read_from_its_files():
    fakegpu.torch_build.cache_clear()
    build = fakegpu.torch_build()
    assert (build.version, build.cuda, build.major) == (torch.__version__, torch.version.cuda, MAJOR)
