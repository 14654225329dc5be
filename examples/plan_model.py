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

then what running it as a pipeline costs in memory: the graph cut into 2 and
4 stages (balanced by each node's measured time), one stream per stage, the
tensors between stages double-buffered (in_flight=2), every stage busy; each
plan with its lower bound and the ideal speed-up (sum of stage times over the
largest).

Run:  python examples/plan_model.py [--batch 32] [--seq 128] [--layers 12] [--stages 2,4] [--in-flight 2]
"""
from __future__ import annotations

import argparse
import math
import time

import torch
import torch.fx
from torch import nn

from torchmem.plan import pipeline, solve
from torchmem.plan.fx import analyze, measure_seconds, plan_graph


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


def bert_inputs(batch: int = 32, seq: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    return torch.randint(0, 30522, (batch, seq)), torch.arange(seq).expand(batch, seq)


def bert_analysis(batch: int = 32, seq: int = 128, layers: int = 12):
    torch.manual_seed(0)
    model = Bert(layers=layers).eval()
    gm = torch.fx.symbolic_trace(model)
    return gm, analyze(gm, *bert_inputs(batch, seq))


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


def pipeline_table(analysis, costs: list[float], stage_counts: tuple[int, ...] = (2, 4), in_flight: int = 2,
                   time_limit: float = 10.0) -> list[str]:
    """Markdown rows: the sequential plan, then each K-stage pipeline plan."""
    plans = [pipeline(analysis, stages=k, in_flight=in_flight, cost=costs, time_limit=time_limit)
             for k in stage_counts]
    seq = plans[0].sequential
    mib = 2**20
    lines = ["| plan | MiB | lower bound MiB | vs sequential | of which copies between stages | "
             "stage times (ms) | ideal speed-up |", "|---|---:|---:|---:|---:|---|---:|",
             f"| sequential (one stream) | {seq.height / mib:,.1f} | {seq.lower_bound / mib:,.1f} | 1.00x | - "
             f"| {sum(costs) * 1e3:,.0f} | 1.00x |"]
    for k, p in zip(stage_counts, plans):
        times = " / ".join(f"{s.cost * 1e3:,.0f}" for s in p.stages)
        lines.append(f"| {k} stages, in_flight {in_flight} | {p.height / mib:,.1f} | {p.lower_bound / mib:,.1f} "
                     f"| {p.height / seq.height:.2f}x | {p.slot_bytes / mib:,.1f} | {times} | {p.speedup:.2f}x |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--time-limit", type=float, default=10.0)
    parser.add_argument("--stages", default="2,4", help="pipeline stage counts, comma-separated ('' for none)")
    parser.add_argument("--in-flight", type=int, default=2)
    parser.add_argument("--timing-runs", type=int, default=1, help="runs to time each node (median)")
    args = parser.parse_args()
    start = time.perf_counter()
    gm, analysis = bert_analysis(args.batch, args.seq, args.layers)
    print(f"BERT-base inference, batch {args.batch}, sequence {args.seq}, {args.layers} layers, hidden 768: "
          f"{len(analysis.names)} graph nodes, traced and run in {time.perf_counter() - start:.1f} s\n")
    rows = table(analysis, args.time_limit)
    bound = rows[4][1]
    print(f"| strategy | MiB | vs bound | note |\n|---|---:|---:|---|")
    for name, size, note in rows:
        print(f"| {name} | {size / 2**20:,.1f} | {size / bound:.3f}x | {note} |")
    stage_counts = tuple(int(k) for k in args.stages.split(",") if k.strip())
    if stage_counts:
        costs = measure_seconds(gm, *bert_inputs(args.batch, args.seq), runs=args.timing_runs)
        print(f"\nAs a pipeline (node times: median of {args.timing_runs} run(s) on this machine; the stages are cut "
              "to balance them, so another run can cut elsewhere and print other figures):\n")
        print("\n".join(pipeline_table(analysis, costs, stage_counts, args.in_flight, args.time_limit)))


if __name__ == "__main__":
    main()
