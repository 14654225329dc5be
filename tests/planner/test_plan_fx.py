"""Buffers of torch.fx graphs: views, in-place ops, workspaces, reordering."""
from __future__ import annotations

import torch
import torch.fx
from torch import nn

from torchmem.plan import lower_bound
from torchmem.plan.fx import analyze, plan_graph, register_workspace, unregister_workspace

F32 = 4


class ViewsAndInplace(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1 = nn.Linear(16, 16)
        self.l2 = nn.Linear(16, 16)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        a = self.relu(self.l1(x))      # in place: no buffer of its own
        flat = a.view(-1)              # a view: keeps l1's buffer alive
        c = self.l2(a)
        d = c + flat.view(c.shape)     # last use of the view
        d.add_(1)                      # in place
        return d.t()                   # a view of d, returned


def test_views_keep_the_base_alive_and_inplace_ops_create_nothing() -> None:
    gm = torch.fx.symbolic_trace(ViewsAndInplace())
    a = analyze(gm, torch.randn(4, 16))
    bufs = {b.id: b for b in a.buffers()}
    assert set(bufs) == {"l1", "l2", "add"}
    assert all(b.size == 4 * 16 * F32 for b in bufs.values())
    names = a.names
    # l1's buffer lives until the add that reads its view.
    assert bufs["l1"].upper == names.index("add") + 1
    # The returned value (a view of add) lives to the end.
    assert bufs["add"].upper > len(names)
    # shape propagation recorded metadata
    node = next(n for n in gm.graph.nodes if n.name == "l2")
    assert tuple(node.meta["tensor_meta"].shape) == (4, 16)


def test_workspace_registry_adds_a_buffer_live_during_the_op() -> None:
    register_workspace(nn.Linear, lambda node, args: 1000)
    try:
        gm = torch.fx.symbolic_trace(ViewsAndInplace())
        a = analyze(gm, torch.randn(4, 16))
        ws = [b for b in a.buffers() if "workspace" in b.id]
        assert len(ws) == 2 and all(b.size == 1000 and b.upper == b.lower + 1 for b in ws)
    finally:
        unregister_workspace(nn.Linear)


class Branches(nn.Module):
    """Two independent branches; running one to completion before starting
    the other lowers the peak."""

    def forward(self, x):
        a1 = x * 2
        b1 = x * 3
        a2 = a1.sum(dim=1)
        b2 = b1.sum(dim=1)
        return a2 + b2


def test_reordering_lowers_the_peak_and_plans_stay_valid() -> None:
    gm = torch.fx.symbolic_trace(Branches())
    a = analyze(gm, torch.randn(256, 256))
    order, before, after = a.schedule()
    assert after < before
    # the order is topological
    pos = {v: i for i, v in enumerate(order)}
    assert all(pos[u] < pos[v] for v in range(len(a.names)) for u in a.deps[v])
    plain = plan_graph(gm, analysis=a)
    reordered = plan_graph(gm, analysis=a, reorder=True)
    assert plain.plan.validate() and reordered.plan.validate()
    assert reordered.plan.lower_bound == after < plain.plan.lower_bound == before
    assert reordered.plan.height <= plain.plan.height
    assert lower_bound(a.buffers(order)) == after


class Block(nn.Module):
    def __init__(self, d: int = 32) -> None:
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        self.up = nn.Linear(d, 4 * d)
        self.down = nn.Linear(4 * d, d)
        self.norm = nn.LayerNorm(d)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)          # views of one buffer
        att = torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v
        x = self.norm(x + att)
        return x + self.down(nn.functional.gelu(self.up(x)))


def test_small_transformer_block_plans_below_naive() -> None:
    gm = torch.fx.symbolic_trace(nn.Sequential(Block(), Block()))
    gp = plan_graph(gm, torch.randn(2, 8, 32))
    assert gp.plan.validate()
    assert len(gp.plan.buffers) > 10
    assert gp.plan.lower_bound <= gp.plan.height < gp.naive_bytes / 2


def test_torch_export_graph_gives_the_same_buffers_as_symbolic_trace() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(Block(), Block()).eval()
    x = torch.randn(2, 8, 32)
    exported = plan_graph(torch.export.export(model, (x,)).module(), x)
    traced = plan_graph(torch.fx.symbolic_trace(model), x)
    assert exported.plan.validate()
    assert sorted(b.size for b in exported.plan.buffers) == sorted(b.size for b in traced.plan.buffers)
    assert exported.plan.lower_bound == traced.plan.lower_bound
