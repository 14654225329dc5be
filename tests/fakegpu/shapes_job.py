"""Calls whose output's size follows device values, each marked with its label after "counted:", and look-alikes
that are not (tests/fakegpu/test_preflight_workloads.py). Prints "scripted" once a TorchScript function calling
torch.nonzero has compiled and run."""
import torch

x = torch.randn(1000, device="cuda")
mask = x > 0
a = torch.nonzero(x)  # counted: torch.nonzero()
rows, = torch.where(mask)  # counted: torch.where(mask)
b = x[mask]  # counted: x[mask]
x[mask] = 0  # counted: x[mask] = v
d = x.nonzero()  # counted: .nonzero()
e = torch.where(mask, x, 0)
f = x[1:5]
g2 = x.repeat_interleave(2)
g = torch.repeat_interleave(x[:4], 2)
h = x[torch.arange(3, device="cuda")]


@torch.jit.script
def scripted(t: torch.Tensor) -> torch.Tensor:
    return torch.nonzero(t)


scripted(x)
print("scripted")
