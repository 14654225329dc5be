"""One workload that takes PyTorch's sort paths, for tests/fakegpu/test_every_card.py (run by name in a child).

Sort, top-k, unique and an embedding's backward (which sorts its token ids), each over 65,536 elements:
above 4,096, where PyTorch sorts with CUB's segmented radix sort.
"""
from __future__ import annotations

import torch

N = 1 << 16


def sort_paths() -> dict:
    """Runs the workload with PyTorch's history on; returns the device name and each allocation's size."""
    torch.cuda.memory._record_memory_history(max_entries=100_000)
    x = torch.empty(N, device="cuda")
    values, indices = torch.sort(x)
    top = torch.topk(x, 1000)
    unique = torch.unique(torch.empty(N, dtype=torch.long, device="cuda"))
    embedding = torch.nn.Embedding(32000, 64).cuda()
    embedding(torch.zeros(N // 1024, 1024, dtype=torch.long, device="cuda")).sum().backward()
    torch.cuda.synchronize()
    trace = torch.cuda.memory._snapshot()["device_traces"][0]
    del values, indices, top, unique
    return {"name": torch.cuda.get_device_name(), "capability": list(torch.cuda.get_device_capability()),
            "allocs": [e["size"] for e in trace if e["action"] == "alloc"]}
