"""Where setup.py finds the CUDA runtime for the CUDA glue, on folder trees laid out as the wheels lay them.

torch's own nvidia wheels come first: nvidia/cu13 (CUDA 13), or nvidia/cuda_runtime and its sibling wheels
(CUDA 12). A toolkit (CUDA_HOME) is used only without them, and only when its CUDA major is torch's: a build
never depends on a matching toolkit. The crt/ headers the runtime wheels lack come from elsewhere, or the build
stops with one line naming the wheel to install.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def setup_py() -> ModuleType:
    """setup.py as a module: imported, not run (it calls setup() only as __main__)."""
    spec = importlib.util.spec_from_file_location("torchmem_setup", ROOT / "setup.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def runtime(home: Path, version: int, *, crt: bool = True) -> Path:
    """A CUDA runtime's include/ and lib/ under `home`, of CUDART_VERSION `version` (12040, 13000)."""
    (home / "include").mkdir(parents=True)
    (home / "include" / "cuda_runtime_api.h").write_text(f"#define CUDART_VERSION  {version}\n")
    if crt:
        (home / "include" / "crt").mkdir()
        (home / "include" / "crt" / "host_defines.h").write_text("\n")
    (home / "lib").mkdir()
    (home / "lib" / f"libcudart.so.{version // 1000}").write_bytes(b"")
    return home


def fake_torch(site: Path, version: str, cuda: str | None) -> SimpleNamespace:
    (site / "torch").mkdir(parents=True, exist_ok=True)
    return SimpleNamespace(__version__=version, __file__=str(site / "torch" / "__init__.py"),
                           version=SimpleNamespace(cuda=cuda))


def test_cuda_12_wheels_bring_their_siblings_include_folders(setup_py, tmp_path):
    home = runtime(tmp_path / "nvidia" / "cuda_runtime", 12040)
    (tmp_path / "nvidia" / "cublas" / "include").mkdir(parents=True)
    found = setup_py.wheel_runtime(tmp_path / "nvidia", 12)
    assert found.complete
    assert found.include_dirs == [str(home / "include"), str(tmp_path / "nvidia" / "cublas" / "include")]
    assert found.library == str(home / "lib" / "libcudart.so.12")


def test_a_runtime_of_another_major_is_not_taken(setup_py, tmp_path):
    runtime(tmp_path / "nvidia" / "cuda_runtime", 12040)
    assert setup_py.wheel_runtime(tmp_path / "nvidia", 13) is None


def test_crt_comes_from_elsewhere_when_the_runtime_wheel_lacks_it(setup_py, tmp_path, monkeypatch):
    home = runtime(tmp_path / "nvidia" / "cu13", 13000, crt=False)
    bundled = runtime(tmp_path / "triton-headers", 13010)
    monkeypatch.setattr(setup_py, "crt_elsewhere", lambda major: bundled / "include" if major == 13 else None)
    found = setup_py.wheel_runtime(tmp_path / "nvidia", 13)
    assert found.complete
    assert found.include_dirs == [str(home / "include"), str(bundled / "include")]  # the runtime's own first


def test_without_crt_anywhere_the_build_names_the_wheel_to_install(setup_py, tmp_path, monkeypatch):
    runtime(tmp_path / "site" / "nvidia" / "cu13", 13000, crt=False)
    monkeypatch.setattr(setup_py, "crt_elsewhere", lambda major: None)
    torch = fake_torch(tmp_path / "site", "2.14.1+cu130", "13.0")
    with pytest.raises(SystemExit) as stop:
        setup_py.cuda_runtime(torch, SimpleNamespace(CUDA_HOME=None))
    said = str(stop.value)
    assert said.startswith("torchmem: ") and "\n" not in said
    assert "lack crt/" in said and "pip install 'nvidia-cuda-crt==" in said


def test_the_wheels_win_over_a_toolkit_and_a_toolkit_of_another_major_is_ignored(setup_py, tmp_path):
    wheel = runtime(tmp_path / "site" / "nvidia" / "cu13", 13000)
    toolkit_13 = runtime(tmp_path / "cuda-13", 13020)
    torch = fake_torch(tmp_path / "site", "2.14.1+cu130", "13.0")
    found = setup_py.cuda_runtime(torch, SimpleNamespace(CUDA_HOME=str(toolkit_13)))
    assert found.include_dirs == [str(wheel / "include")]
    torch_12 = fake_torch(tmp_path / "site12", "2.8.0+cu128", "12.8")
    with pytest.raises(SystemExit) as stop:  # no CUDA 12 wheels, and the toolkit is CUDA 13
        setup_py.cuda_runtime(torch_12, SimpleNamespace(CUDA_HOME=str(toolkit_13)))
    assert "no CUDA 12 runtime headers were found" in str(stop.value) and "TORCHMEM_NO_CUDA=1" in str(stop.value)


def test_a_toolkit_of_torchs_major_serves_when_there_are_no_wheels(setup_py, tmp_path):
    toolkit = tmp_path / "cuda-12.8"
    runtime(toolkit, 12080)
    (toolkit / "lib").rename(toolkit / "lib64")
    torch = fake_torch(tmp_path / "site", "2.8.0+cu128", "12.8")
    found = setup_py.cuda_runtime(torch, SimpleNamespace(CUDA_HOME=str(toolkit)))
    assert found.include_dirs == [str(toolkit / "include")]
    assert found.library == str(toolkit / "lib64" / "libcudart.so.12")


def test_a_cpu_torch_or_torchmem_no_cuda_builds_no_glue(setup_py, tmp_path, monkeypatch):
    assert setup_py.cuda_runtime(fake_torch(tmp_path, "2.13.0+cpu", None), SimpleNamespace(CUDA_HOME=None)) is None
    monkeypatch.setenv("TORCHMEM_NO_CUDA", "1")
    assert setup_py.cuda_runtime(fake_torch(tmp_path, "2.6.0+cu124", "12.4"), SimpleNamespace(CUDA_HOME=None)) is None


def test_a_cuda_torch_older_than_the_glue_supports_builds_without_it(setup_py, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("TORCHMEM_NO_CUDA", raising=False)
    runtime(tmp_path / "site" / "nvidia" / "cuda_runtime", 12040)
    torch = fake_torch(tmp_path / "site", "2.6.0+cu124", "12.4")
    assert setup_py.cuda_runtime(torch, SimpleNamespace(CUDA_HOME=None)) is None
    assert "without the CUDA allocator glue, which needs torch 2.8 or newer, not 2.6.0+cu124" in capsys.readouterr().err
    # Its objects and version still say CUDA: the fake GPU's set and preflight are built for it.
    assert setup_py.build_dir(torch, None) == "build/cuda-2.6.0"
    assert setup_py.version(torch, None) == "0.1.0+torch2.6.0.cu124"


def test_the_fake_gpu_takes_torchs_own_wheels_then_a_toolkit_of_the_other_major(setup_py, tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA12_HOME", raising=False)
    monkeypatch.delenv("CUDA13_HOME", raising=False)
    own = runtime(tmp_path / "site" / "nvidia" / "cuda_runtime", 12040)
    (tmp_path / "site" / "nvidia" / "cublas" / "include").mkdir(parents=True)
    toolkit = runtime(tmp_path / "cuda-13", 13000)
    torch = fake_torch(tmp_path / "site", "2.6.0+cu124", "12.4")
    ext = SimpleNamespace(CUDA_HOME=str(toolkit))
    assert setup_py.fakegpu_headers(torch, ext, 12) == [own / "include", tmp_path / "site" / "nvidia" / "cublas" / "include"]
    assert setup_py.fakegpu_headers(torch, ext, 13) == [toolkit / "include"]
    # A CPU torch has no wheels to read; a toolkit of the wrong major is not taken.
    cpu = fake_torch(tmp_path / "cpu", "2.13.0+cpu", None)
    assert setup_py.fakegpu_headers(cpu, ext, 12) == []
    monkeypatch.setenv("CUDA12_HOME", str(own))
    assert setup_py.fakegpu_headers(cpu, ext, 12) == [own / "include"]


def test_the_version_names_the_torch_built_against(setup_py, tmp_path):
    cuda = setup_py.CudaRuntime([], "", "")
    assert setup_py.version(fake_torch(tmp_path, "2.14.1+cu130", "13.0"), cuda) == "0.1.0+torch2.14.1.cu130"
    assert setup_py.version(fake_torch(tmp_path, "2.13.0+cpu", None), None) == "0.1.0+torch2.13.0.cpu"
    assert setup_py.build_dir(fake_torch(tmp_path, "2.14.1+cu130", "13.0"), cuda) == "build/cuda-2.14.1"
