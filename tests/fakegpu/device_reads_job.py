"""Workloads for tests/fakegpu/test_preflight_device_reads.py, run by name in preflight's child.

Under preflight the fake device holds no data (fakegpu/cudart/contents.c): a value a kernel computed reads
zero on the host, and a copy to the device takes no host memory.
"""
from __future__ import annotations

import resource

import torch


def gradscaler_first_step() -> dict:
    """One fp16 GradScaler step with Adam: GradScaler steps only when its found_inf, a device value, reads 0."""
    model = torch.nn.Linear(1024, 1024).cuda()
    opt = torch.optim.Adam(model.parameters())
    scaler = torch.amp.GradScaler("cuda")
    with torch.autocast("cuda", dtype=torch.float16):
        loss = model(torch.randn(64, 1024, device="cuda")).float().square().mean()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    state = opt.state[model.weight]
    return {"moments": sorted(k for k in state if k.startswith("exp_avg")), "allocated": torch.cuda.memory_allocated(),
            "weight_bytes": model.weight.numel() * 4}


def isfinite_read() -> dict:
    """What a device boolean and a device float read as on the host."""
    g = torch.randn(1000, device="cuda")
    return {"all_finite": bool(torch.isfinite(g).all()), "norm": float(g.norm())}


def resident_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def copy_to_device(gib: int = 1) -> dict:
    """The process's resident memory before and after `gib` GiB on the host is moved to the device and freed there."""
    host = torch.ones(gib << 28, dtype=torch.float32)  # written on the CPU: resident
    before = resident_kib()
    device = host.to("cuda")
    del host
    after = resident_kib()
    return {"before_kib": before, "after_kib": after, "device_bytes": device.numel() * 4,
            "peak_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}
