"""The CUDA part of the build: skipped where torch has no CUDA, present where it has.

These run on any machine (CI has the CPU build of torch)."""
import pathlib

import pytest
import torch

import torchmem
from torchmem import _C, _core
from torchmem.runtime import cuda as tmcuda
from torchmem.runtime.devices import cuda_installed

CUDA_ONLY_STRINGS = (b"cuda_install", b"cuMemAddressReserve", b"CudaAllocator")


def extension_bytes() -> bytes:
    return pathlib.Path(_C.__file__).read_bytes()


ROOT = pathlib.Path(__file__).resolve().parents[2]
CPU_PYTHON = ROOT / ".venv" / "bin" / "python"  # the CPU tier's interpreter (make test-cpu)


def test_cpu_build_has_no_cuda_part():
    """Here with a CPU torch; under a CUDA torch (the fake-GPU tier), the same
    checks run in the CPU tier's interpreter on its in-tree extension."""
    if torch.version.cuda is not None:
        if not CPU_PYTHON.exists():
            pytest.skip("a CUDA build of torch compiles the CUDA part, and no CPU tier (.venv) is here to check")
        import os
        import subprocess
        import sys

        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("TORCHMEM_EXT_DIR", "TORCHMEM_FAKEGPU", "LD_PRELOAD", "PYTHONPATH"))}
        env["PYTHONPATH"] = str(ROOT)
        code = ("import sys, torch; sys.exit(0 if torch.version.cuda is None else 3)")
        if subprocess.run([str(CPU_PYTHON), "-c", code], env=env, cwd=ROOT).returncode != 0:
            pytest.skip(".venv has no CPU build of torch")
        proc = subprocess.run([str(CPU_PYTHON), "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               f"{__file__}::test_cpu_build_has_no_cuda_part"], env=env, cwd=ROOT,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0 and "1 passed" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-2000:]
        return
    assert not tmcuda.cuda_glue_built()
    assert not hasattr(_C, "cuda_install")
    data = extension_bytes()
    for s in CUDA_ONLY_STRINGS:
        assert s not in data, s
    with pytest.raises(tmcuda.CUDANotBuiltError, match="without its CUDA part"):
        tmcuda.install_cuda()
    assert cuda_installed() is False


@pytest.mark.skipif(torch.version.cuda is None, reason="needs a CUDA build of torch")
def test_cuda_build_has_the_cuda_part():
    if not tmcuda.cuda_glue_built():
        pytest.skip("built without CUDA_HOME: the CUDA part was skipped")
    for name in ("cuda_install", "cuda_installed", "cuda_caching_allocator", "cuda_pending_frees", "cuda_pool_count",
                 "cuda_push_thread_allocator", "cuda_pop_thread_allocator"):
        assert hasattr(_C, name), name


@pytest.mark.skipif(torch.version.cuda is None, reason="needs a CUDA build of torch")
def test_thread_allocator_push_and_pop_refuse_misuse_without_touching_cuda():
    """Runs without a GPU: a pop with nothing pushed, and a push while torchmem is
    not PyTorch's CUDA allocator, raise before anything touches CUDA."""
    if not tmcuda.cuda_glue_built():
        pytest.skip("built without CUDA_HOME: the CUDA part was skipped")
    was_initialised = torch.cuda.is_initialized()
    with pytest.raises(RuntimeError, match="without a matching push"):
        _C.cuda_pop_thread_allocator(0)
    if not cuda_installed():
        slab = _core.PlannedSlab(_core.CachingAllocator(_core.HostDevice()))
        with pytest.raises(RuntimeError, match="torchmem.install"):
            _C.cuda_push_thread_allocator(0, slab)
        with pytest.raises(RuntimeError, match="without a matching push"):
            _C.cuda_pop_thread_allocator(0)  # the refused push left nothing to pop
    assert torch.cuda.is_initialized() == was_initialised


def test_install_cuda_rejects_unknown_kind_and_bad_conf():
    with pytest.raises(ValueError, match="unknown allocator kind"):
        tmcuda.install_cuda("arena")
    with pytest.raises(ValueError):
        tmcuda.install_cuda("caching", "no_such_key:1")


def test_module_imports_without_touching_cuda():
    """In a fresh interpreter: a test worker's earlier tests may have initialised CUDA themselves."""
    import subprocess
    import sys

    code = "import torch, torchmem, torchmem.runtime.cuda; print(torch.cuda.is_initialized())"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "False"


@pytest.mark.skipif(torch.version.cuda is None, reason="needs a CUDA build of torch")
def test_torch_dispatches_to_the_overrides_without_initialising_cuda():
    """Works with or without a GPU: after the swap, torch's C++ entry points reach
    torchmem's overrides (a bare pluggable allocator raises "does not yet support")."""
    if not tmcuda.cuda_glue_built():
        pytest.skip("built without CUDA_HOME: the CUDA part was skipped")
    import json
    import os
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(
        """
        import json, torch
        from torchmem.runtime import cuda as tmcuda
        from torchmem.runtime.devices import cuda_installed
        tmcuda.install_cuda()
        C = torch._C
        stats = C._cuda_memoryStats(0)
        C._cuda_resetPeakMemoryStats(0)
        C._cuda_resetAccumulatedMemoryStats(0)
        try:
            snap = C._cuda_memorySnapshot(None)
        except TypeError:
            snap = C._cuda_memorySnapshot()
        print(json.dumps({
            "installed": cuda_installed(),
            "backend": torch.cuda.get_allocator_backend(),
            "num_ooms": stats["num_ooms"],
            "has_segments": "segments" in snap,
            "initialised": torch.cuda.is_initialized(),
        }))
        """
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.dirname(os.path.dirname(tmcuda.__file__)), env.get("PYTHONPATH")) if p)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r == {"installed": True, "backend": "torchmem", "num_ooms": 0, "has_segments": True, "initialised": False}


@pytest.mark.skipif(torch.version.cuda is None, reason="needs a CUDA build of torch")
def test_install_makes_torchmem_c10s_cuda_allocator_without_a_gpu():
    """changeCurrentAllocator swaps only CUDACachingAllocator::get(); install()
    also registers torchmem as c10::GetAllocator(kCUDA). Neither touches CUDA,
    so this runs without a GPU, in its own interpreter."""
    if not tmcuda.cuda_glue_built():
        pytest.skip("built without CUDA_HOME: the CUDA part was skipped")
    from tests.cuda.cuda_helpers import run_child

    proc = run_child(
        """
        from torchmem import _C, _core
        before = _C.cuda_is_c10_allocator()
        _C.cuda_install("")
        print(before, _C.cuda_installed(), _C.cuda_is_c10_allocator(), torch.cuda.is_initialized())
        """,
        install=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["False", "True", "True", "False"]

