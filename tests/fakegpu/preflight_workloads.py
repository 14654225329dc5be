"""Module-level workloads for torchmem.preflight.run (importable by name in the child interpreter)."""
from __future__ import annotations


def allocate(n_bytes: int) -> dict:
    """Allocates n_bytes on the device: what it allocated, seen from inside."""
    import torch

    x = torch.empty(n_bytes, dtype=torch.uint8, device="cuda")
    return {"allocated": torch.cuda.memory_allocated(), "is_fake": x.device.type == "cuda"}
