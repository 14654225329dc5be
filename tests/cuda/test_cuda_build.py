"""The CUDA part of the build: skipped where torch has no CUDA, present where it has.

These run on any machine (CI has the CPU build of torch)."""
import pathlib

import pytest
import torch

import torchmem
from torchmem import _C
from torchmem import cuda as tmcuda

CUDA_ONLY_STRINGS = (b"cuda_install", b"cuMemAddressReserve", b"CudaAllocator")


def extension_bytes() -> bytes:
    return pathlib.Path(_C.__file__).read_bytes()


@pytest.mark.skipif(torch.version.cuda is not None, reason="a CUDA build of torch compiles the CUDA part")
def test_cpu_build_has_no_cuda_part():
    assert not tmcuda.cuda_glue_built()
    assert not hasattr(_C, "cuda_install")
    data = extension_bytes()
    for s in CUDA_ONLY_STRINGS:
        assert s not in data, s
    with pytest.raises(tmcuda.CUDANotBuiltError, match="without its CUDA part"):
        tmcuda.install_cuda()
    assert tmcuda.installed() is False


@pytest.mark.skipif(torch.version.cuda is None, reason="needs a CUDA build of torch")
def test_cuda_build_has_the_cuda_part():
    if not tmcuda.cuda_glue_built():
        pytest.skip("built without CUDA_HOME: the CUDA part was skipped")
    for name in ("cuda_install", "cuda_installed", "cuda_caching_allocator", "cuda_pending_frees", "cuda_pool_count"):
        assert hasattr(_C, name), name


def test_install_cuda_rejects_unknown_kind_and_bad_conf():
    with pytest.raises(ValueError, match="unknown allocator kind"):
        tmcuda.install_cuda("arena")
    with pytest.raises(ValueError):
        tmcuda.install_cuda("caching", "no_such_key:1")


def test_module_imports_without_touching_cuda():
    assert torchmem is not None
    if torch.version.cuda is not None:
        assert not torch.cuda.is_initialized()
