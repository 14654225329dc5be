"""A natural CPU training loop: a per-step torchmem.arena against the caching
allocator alone, paired in one run.

    python benchmarks/bench_arena_loop.py [--rounds 40] [--warmup 3] [--threads 1] [--json out.json]

The loop is what a user writes, no `del` anywhere: each step makes its batch,
runs a small transformer classifier (2 encoder layers, width 256, 4 heads,
FFN 1024, dropout 0.1, batch 16 x 128 tokens), cross-entropy, backward,
AdamW, `total += loss.item()`; the loop variables (batch, target, logits,
loss) stay referenced until the next step replaces them.

Three replicas (same initial weights, same batches, same dropout masks) run
under torchmem.install(): one on the caching allocator alone; one with each
step inside `with torchmem.arena(scratch)`, a roomy arena (--capacity-mib,
no wraps needed); one inside a tight arena (--tight times the caching
allocator's step memory, measured in the warm-up) with fallback="caching",
which wraps to reuse what the step freed and spills what still does not fit.
Each round runs one step of each, in an order that rotates and flips round
by round, in one process, so all see the same machine; each replica keeps its
own loop variables into its next step. Warm-up steps are not timed; the first
makes AdamW's state, outside any arena.

Reported:
- step time: median per mode, and the median of the per-round ratios
  arena / caching (with its quartiles);
- step memory, median and max over the timed steps: for an arena, the
  block's peak (region bytes in use at once: the step's tensors, the previous
  step's loop variables it works around, alignment and gaps) plus the bytes
  its fallback served in the block (an upper bound); for the
  caching allocator, its peak allocated bytes during the step minus what it
  held before the timed steps, when that replica held no loop variable (the
  same tensors; block rounding to 512 bytes; no fragmentation, so a lower
  bound of what it reserves for them);
- per arena its wraps and fallback allocations, and whether every replica
  ends with the caching replica's weights (bit for bit).
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import torchmem  # noqa: E402
from torchmem.runtime.arena import Arena, arena  # noqa: E402

MiB = 2**20


class Classifier(torch.nn.Module):
    def __init__(self, width: int = 256, layers: int = 2, classes: int = 10):
        super().__init__()
        layer = torch.nn.TransformerEncoderLayer(width, 4, 4 * width, dropout=0.1, batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = torch.nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x).mean(1))


class Replica:
    """A model, its optimizer and the loop variables a natural loop keeps."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        self.total = 0.0
        self.kept: tuple = ()

    def step(self, seed: int, batch: int, tokens: int, width: int) -> None:
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(batch, tokens, width, generator=g)
        target = torch.randint(0, 10, (batch,), generator=g)
        torch.manual_seed(seed)  # the same dropout masks in both replicas
        logits = self.model(x)
        loss = F.cross_entropy(logits, target)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad()
        self.total += loss.item()
        self.kept = (x, target, logits, loss)  # alive until the next step replaces them


def quartiles(xs: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(xs, n=4)
    return q[0], statistics.median(xs), q[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=40, help="timed rounds (one step per mode each)")
    parser.add_argument("--warmup", type=int, default=3, help="warm-up steps (at least 2)")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--capacity-mib", type=int, default=512, help="the roomy arena's capacity")
    parser.add_argument("--tight", type=float, default=1.5,
                        help="the tight arena's capacity, in multiples of the caching allocator's step memory")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()

    torchmem.install()
    torch.set_num_threads(args.threads)
    load_start = os.getloadavg()
    torch.manual_seed(0)
    model = Classifier(args.width)
    modes = ("caching", "arena", "arena-tight")
    replicas = {m: Replica(copy.deepcopy(model)) for m in modes}
    arenas = {"arena": Arena(args.capacity_mib * MiB)}
    caching = torchmem.caching_allocator()
    shape = (args.batch, args.tokens, args.width)

    def run(mode: str, seed: int, routed: bool = True) -> tuple[float, int]:
        r = replicas[mode]
        if mode in arenas and routed:
            t0 = time.perf_counter()
            with arena(arenas[mode]):
                r.step(seed, *shape)
            block = arenas[mode].last_block
            return time.perf_counter() - t0, block["peak"] + block["fallback_bytes"]
        # What the tight arena's fallback holds for its loop variables is not this replica's.
        spilled = arenas["arena-tight"].stats()["fallback_live_bytes"] if "arena-tight" in arenas else 0
        caching.reset_peak_stats()
        t0 = time.perf_counter()
        r.step(seed, *shape)
        elapsed = time.perf_counter() - t0
        return elapsed, caching.stats()["allocated_bytes"]["all"]["peak"] - spilled

    # Warm-up; the first step of each replica makes AdamW's state, outside any
    # arena; the second sizes the tight arena from the caching replica's step.
    for m in modes:
        run(m, 1000, routed=False)
    replicas["caching"].kept = ()  # the baseline: the caching replica holds no loop variable
    base = caching.stats()["allocated_bytes"]["all"]["current"]
    tight = int(args.tight * (run("caching", 1001)[1] - base)) // MiB * MiB + MiB
    arenas["arena-tight"] = Arena(tight, fallback="caching")
    for m in arenas:
        run(m, 1001)
    for i in range(2, args.warmup):
        for m in modes:
            run(m, 1000 + i)
    replicas["caching"].kept = ()
    spilled = arenas["arena-tight"].stats()["fallback_live_bytes"]
    base = caching.stats()["allocated_bytes"]["all"]["current"] - spilled

    times: dict[str, list[float]] = {m: [] for m in modes}
    memory: dict[str, list[int]] = {m: [] for m in modes}
    ratios: dict[str, list[float]] = {m: [] for m in arenas}
    for i in range(args.rounds):
        order = modes[i % 3:] + modes[:i % 3]
        if i % 2:
            order = order[::-1]
        took = {}
        for m in order:
            took[m], peak = run(m, i)
            times[m].append(took[m])
            memory[m].append(peak - base if m == "caching" else peak)
        for m in arenas:
            ratios[m].append(took[m] / took["caching"])
    load_end = os.getloadavg()

    params = {m: list(r.model.parameters()) for m, r in replicas.items()}
    same = all(all(torch.equal(a, b) for a, b in zip(params[m], params["caching"])) for m in arenas)
    result = {
        "config": {"rounds": args.rounds, "warmup": args.warmup, "threads": args.threads, "batch": args.batch,
                   "tokens": args.tokens, "width": args.width, "capacity_mib": args.capacity_mib,
                   "tight_capacity_mib": tight / MiB, "torch": torch.__version__, "cpus": os.cpu_count(),
                   "loadavg_start": load_start, "loadavg_end": load_end},
        "median_step_ms": {m: 1e3 * statistics.median(t) for m, t in times.items()},
        "ratio_over_caching": {m: quartiles(r) for m, r in ratios.items()},
        "step_memory_mib_median": {m: statistics.median(v) / MiB for m, v in memory.items()},
        "step_memory_mib_max": {m: max(v) / MiB for m, v in memory.items()},
        "arenas": {m: {k: a.stats()[k] for k in ("peak", "wraps", "fallback_allocations", "fallback_bytes", "rewinds")}
                   for m, a in arenas.items()},
        "holes_last_block": {m: a.last_block["holes"] for m, a in arenas.items()},
        "same_weights": same,
    }
    c = result["config"]
    print(f"natural training loop, {args.rounds} rounds after {args.warmup} warm-up steps; batch {args.batch} x "
          f"{args.tokens} tokens, width {args.width}; torch {c['torch']}, {args.threads} thread(s), "
          f"{c['cpus']} CPUs, load average {load_start[0]:.2f} -> {load_end[0]:.2f}")
    print(f"{'':<13}{'capacity MiB':>13}{'median step ms':>16}{'vs caching (quartiles)':>26}"
          f"{'step memory MiB median / max':>31}{'wraps':>7}{'fallbacks':>10}")
    for m in modes:
        cap = "" if m == "caching" else f"{arenas[m].capacity / MiB:.0f}"
        ratio = "" if m == "caching" else "{1:.3f} ({0:.3f}-{2:.3f})".format(*result["ratio_over_caching"][m])
        a = result["arenas"].get(m, {})
        print(f"{m:<13}{cap:>13}{result['median_step_ms'][m]:>16.2f}{ratio:>26}"
              f"{result['step_memory_mib_median'][m]:>22.2f} / {result['step_memory_mib_max'][m]:<6.2f}"
              f"{a.get('wraps', ''):>7}{a.get('fallback_allocations', ''):>10}")
    print(f"holes in the last block: {result['holes_last_block']}; same weights as the caching replica: {same}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
