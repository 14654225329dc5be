"""Plan the intermediates of a BERT-base inference step.

Builds BERT-base from torch.nn (12 layers, hidden 768, 12 heads, FFN 3072,
random weights, no download), traces it with torch.fx, runs it once on a
batch of 32 sequences of 128 tokens to record every intermediate buffer,
and prints what each strategy needs for them:

    naive       every intermediate in its own bytes (no reuse)
    greedy      size-first best fit
    planned     torchmem.plan.solve (method auto)
    reordered   planned after peak-aware reordering of the graph
    bound       the most bytes live at one instant

Run:  python examples/plan_model.py [--batch 32] [--seq 128] [--layers 12]
"""
from __future__ import annotations

import argparse
import math
import time

import torch
import torch.fx
from torch import nn

from torchmem.plan import solve
from torchmem.plan.fx import analyze, plan_graph


class SelfAttention(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.head_dim = hidden // heads
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, hidden)

    def split(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        return x.view(b, s, self.heads, self.head_dim).permute(0, 2, 1, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.split(self.query(x)), self.split(self.key(x)), self.split(self.value(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        probs = torch.softmax(scores, dim=-1)
        ctx = torch.matmul(probs, v).permute(0, 2, 1, 3).contiguous()
        b, s = ctx.shape[0], ctx.shape[1]
        return self.out(ctx.view(b, s, self.heads * self.head_dim))


class Layer(nn.Module):
    def __init__(self, hidden: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.attention = SelfAttention(hidden, heads)
        self.norm1 = nn.LayerNorm(hidden)
        self.up = nn.Linear(hidden, ffn)
        self.down = nn.Linear(ffn, hidden)
        self.norm2 = nn.LayerNorm(hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm1(x + self.attention(x))
        return self.norm2(x + self.down(nn.functional.gelu(self.up(x))))


class Bert(nn.Module):
    """BERT-base's encoder with embeddings and a pooler (inference)."""

    def __init__(self, layers: int = 12, hidden: int = 768, heads: int = 12, ffn: int = 3072,
                 vocab: int = 30522, max_len: int = 512) -> None:
        super().__init__()
        self.words = nn.Embedding(vocab, hidden)
        self.positions = nn.Embedding(max_len, hidden)
        self.norm = nn.LayerNorm(hidden)
        self.layers = nn.ModuleList(Layer(hidden, heads, ffn) for _ in range(layers))
        self.pool = nn.Linear(hidden, hidden)

    def forward(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = self.norm(self.words(ids) + self.positions(positions))
        for layer in self.layers:
            x = layer(x)
        return torch.tanh(self.pool(x[:, 0]))


def bert_analysis(batch: int = 32, seq: int = 128, layers: int = 12):
    torch.manual_seed(0)
    model = Bert(layers=layers).eval()
    gm = torch.fx.symbolic_trace(model)
    ids = torch.randint(0, 30522, (batch, seq))
    positions = torch.arange(seq).expand(batch, seq)
    return gm, analyze(gm, ids, positions)


def table(analysis, time_limit: float = 10.0) -> list[tuple[str, int, str]]:
    """Rows (strategy, bytes, note) for one analysed graph."""
    buffers = analysis.buffers()
    naive = sum(b.size for b in buffers)
    greedy = solve(buffers, method="greedy")
    planned = plan_graph(None, analysis=analysis, time_limit=time_limit)
    reordered = plan_graph(None, analysis=analysis, reorder=True, time_limit=time_limit)
    rows = [
        ("naive (no reuse)", naive, f"{len(buffers)} buffers"),
        ("greedy (size-first best fit)", greedy.height, f"{greedy.seconds:.3f} s"),
        ("planned", planned.plan.height,
         f"{planned.plan.method}, {planned.plan.seconds:.3f} s{', optimal' if planned.plan.optimal else ''}"),
        ("planned + reordered", reordered.plan.height,
         f"peak {reordered.peak_before / 2**20:,.1f} -> {reordered.peak_after / 2**20:,.1f} MiB, "
         f"{reordered.plan.method}{', optimal' if reordered.plan.optimal else ''}"),
        ("lower bound (graph order)", planned.plan.lower_bound, "most bytes live at one instant"),
        ("lower bound (reordered)", reordered.plan.lower_bound, ""),
    ]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--time-limit", type=float, default=10.0)
    args = parser.parse_args()
    start = time.perf_counter()
    _, analysis = bert_analysis(args.batch, args.seq, args.layers)
    print(f"BERT-base inference, batch {args.batch}, sequence {args.seq}, {args.layers} layers, hidden 768: "
          f"{len(analysis.names)} graph nodes, traced and run in {time.perf_counter() - start:.1f} s\n")
    rows = table(analysis, args.time_limit)
    bound = rows[4][1]
    print(f"| strategy | MiB | vs bound | note |\n|---|---:|---:|---|")
    for name, size, note in rows:
        print(f"| {name} | {size / 2**20:,.1f} | {size / bound:.3f}x | {note} |")


if __name__ == "__main__":
    main()
