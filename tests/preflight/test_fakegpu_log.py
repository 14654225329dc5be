"""Preflight's reading of the fake GPU's log (torchmem/preflight/fakegpu_log.py; the format is docs/fakegpu.md's)."""
from __future__ import annotations

from torchmem.preflight.fakegpu_log import cause

CUDA_ERROR = "RuntimeError: CUDA error: invalid argument (train.py:9 (in step))"


def log(tmp_path, *lines: str):
    path = tmp_path / "fakegpu.log"
    path.write_text("".join(f"torchmem fake GPU: {line}\n" for line in lines))
    return path


def test_the_last_failed_call_of_the_failing_process_is_named_with_its_arguments(tmp_path):
    path = log(tmp_path, "failed cudaSetDevice(device=3) = cudaErrorInvalidDevice (pid 10)",
               "failed cuMemMap(ptr=0x7f00, size=2097152, offset=0) = CUDA_ERROR_INVALID_VALUE (pid 10)",
               "failed cudaStreamCreateWithFlags(flags=0x4) = cudaErrorInvalidValue (pid 11)")
    assert cause(path, 10, CUDA_ERROR) == ("the fake GPU's cuMemMap(ptr=0x7f00, size=2097152, offset=0) returned "
                                           "CUDA_ERROR_INVALID_VALUE: a limit of the fake GPU, not of the script")


def test_a_reason_after_the_error_name_is_kept(tmp_path):
    path = log(tmp_path, "failed cudaFoo(flags=0x8) = cudaErrorNotSupported: flags other than 0 (pid 4)")
    assert "returned cudaErrorNotSupported (flags other than 0): a limit" in cause(path, 4, CUDA_ERROR)


def test_a_missing_entry_point_is_named(tmp_path):
    path = log(tmp_path, "unimplemented libcuda cuCtxFoo (pid 4)")
    assert cause(path, 4, CUDA_ERROR).startswith("the fake GPU does not implement libcuda cuCtxFoo: ")


def test_a_full_card_and_nvmls_probes_are_not_blamed_on_the_fake_gpu(tmp_path):
    path = log(tmp_path, "failed cudaMalloc(size=85899345920) = cudaErrorMemoryAllocation (pid 4)",
               "failed nvmlDeviceGetGpuFabricInfoV(device=0x1, info=0x2) = NVML_ERROR_NOT_SUPPORTED: a card before "
               "sm90 (pid 4)")
    assert cause(path, 4, "torch.OutOfMemoryError: CUDA out of memory.") is None
    assert cause(path, 4, CUDA_ERROR) is None


def test_a_scripts_own_error_or_another_process_or_no_log_gives_nothing(tmp_path):
    path = log(tmp_path, "failed cudaSetDevice(device=3) = cudaErrorInvalidDevice (pid 4)")
    assert cause(path, 4, "ValueError: the data folder is empty (train.py:3 (in <module>))") is None
    assert cause(path, 5, CUDA_ERROR) is None
    assert cause(tmp_path / "missing.log", 4, CUDA_ERROR) is None
    assert cause(None, 4, CUDA_ERROR) is None
