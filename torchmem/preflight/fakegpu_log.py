"""What the fake GPU's log says about a failed run (TORCHMEM_FAKEGPU_LOG, docs/fakegpu.md).

The stand-ins write one line per failed call of an entry point they implement,
and one per call of an entry point they do not:

    torchmem fake GPU: failed cudaMalloc(size=85899345920) = cudaErrorMemoryAllocation (pid 12)
    torchmem fake GPU: unimplemented cudaIpcGetMemHandle (pid 12)

When a script fails with a CUDA error, the last such line of its process
names the call behind it. Out-of-memory lines are left out: a full card is the
card's limit, which preflight reports as an OOM. So are NVML's: PyTorch probes
NVML and takes its refusals (a fabric query on a card before sm90).
"""
from __future__ import annotations

import os
import re
from pathlib import Path

_LINE = re.compile(r"^torchmem fake GPU: (?:failed (?P<call>.+?) = (?P<error>\S+?):?(?: (?P<why>.*?))? "
                   r"|unimplemented (?P<missing>.+) )\(pid (?P<pid>\d+)\)$")
_OUT_OF_MEMORY = ("cudaErrorMemoryAllocation", "CUDA_ERROR_OUT_OF_MEMORY", "CUBLAS_STATUS_ALLOC_FAILED")
# What a CUDA library's failure looks like once PyTorch has raised it.
_CUDA_ERROR = re.compile(r"CUDA|cuBLAS|CUBLAS|cuDNN|CUDNN|NCCL|nccl|torchmem fake GPU")


def cause(log: str | os.PathLike[str] | None, pid: int, error: str) -> str | None:
    """The fake GPU's part in `error`, the one-line error of process `pid`: a sentence naming the last call the
    fake GPU failed or does not implement in that process, or None when the error is not a CUDA library's or
    the log names no such call."""
    if log is None or not _CUDA_ERROR.search(error):
        return None
    try:
        lines = Path(log).read_text(errors="replace").splitlines()
    except OSError:
        return None
    for text in reversed(lines):
        found = _LINE.match(text)
        if found is None or int(found["pid"]) != pid or found["error"] in _OUT_OF_MEMORY \
                or (found["call"] or "").startswith("nvml"):
            continue
        if found["missing"]:
            return f"the fake GPU does not implement {found['missing']}: a limit of the fake GPU, not of the script"
        why = f" ({found['why']})" if found["why"] else ""
        return (f"the fake GPU's {found['call']} returned {found['error']}{why}: "
                "a limit of the fake GPU, not of the script")
    return None
