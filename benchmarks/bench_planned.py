"""Planned allocation against the caching allocator on CPU steps.

    python benchmarks/bench_planned.py --workload bert-inference [--rounds 2] [--steps 4]
    python benchmarks/bench_planned.py --workload gpt2-train [--rounds 2] [--steps 4]

Workloads:
- bert-inference: a BERT-base-sized encoder (hidden 768, 12 layers, 12
  heads, FFN 3072, random weights), inference at batch 32, sequence 128.
- gpt2-train: a GPT-2-sized model (embedding 50,257 x 768, 12 pre-norm
  layers with 12 heads and a causal mask, a 50,257-way head, AdamW),
  training at batch 4 on sequence lengths that vary step by step from 96 to
  256, padded to buckets of 128: two plans.

Modes, each run in a fresh process under torchmem.install():
- caching: the caching allocator alone;
- compact: the same, plus torchmem.compact(model) and
  torchmem.compact(optimizer) after the first step (long-lived tensors
  repacked, one block per object);
- planned: each step inside torchmem.planned(key=bucket) (one warm-up and
  one recorded step per bucket, then planned steps), plus the same
  compaction after the first step.
Every mode runs the same warm-up steps (until every bucket is planned),
then the cache is emptied and the peaks reset, and --steps steps are timed.
Rounds rotate the order of the modes; step-time ratios are medians of the
per-round ratios of median step times. Then, with --pairs N, one more
process runs N pairs of the same step on the caching allocator and planned
(order alternating pair by pair, after the warm-up and compaction), which
compares the two with the same weights, memory and machine state.

Reported, over the timed steps: peak reserved and peak allocated (the
planned region is one block of the caching allocator, so both include it),
the lower bound (the peak of bytes requested and live at once, from the
caching run: no allocator can hold less), and per plan its height against
its own lower bound. Also the peak reserved over the warm-up (recording,
planning and compaction included), paid once.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Any, Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MiB = 2**20
GPT2_LENGTHS = [200, 100, 256, 96, 180, 128, 240, 110, 150, 250, 120, 200]


Workload = tuple[Callable[[int, Callable[[Any], Any]], None], int, list]


def bert_inference() -> Workload:
    """A step function (step index, scope for a key), how many steps plan every
    key, and the long-lived objects to compact."""
    import torch

    layer = torch.nn.TransformerEncoderLayer(768, 12, 3072, dropout=0.0, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, 12, enable_nested_tensor=False).eval()
    del layer  # the encoder holds deep copies
    x = torch.randn(32, 128, 768)

    def step(i: int, scope: Callable[[Any], Any]) -> None:
        with scope("bert"), torch.no_grad():
            model(x).sum().item()

    return step, 2, [model, x]


def gpt2_train() -> Workload:
    import torch

    vocab, hidden = 50257, 768
    emb = torch.nn.Embedding(vocab, hidden)
    layer = torch.nn.TransformerEncoderLayer(hidden, 12, 4 * hidden, dropout=0.0, batch_first=True, norm_first=True)
    body = torch.nn.TransformerEncoder(layer, 12, enable_nested_tensor=False)
    del layer
    head = torch.nn.Linear(hidden, vocab, bias=False)
    params = list(emb.parameters()) + list(body.parameters()) + list(head.parameters())
    opt = torch.optim.AdamW(params, lr=1e-4)

    def step(i: int, scope: Callable[[Any], Any]) -> None:
        bucket = -(-GPT2_LENGTHS[i % len(GPT2_LENGTHS)] // 128) * 128
        ids = torch.randint(0, vocab, (4, bucket), generator=torch.Generator().manual_seed(i))
        with scope(bucket):
            mask = torch.nn.Transformer.generate_square_subsequent_mask(bucket)
            logits = head(body(emb(ids), mask=mask, is_causal=True))
            loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, vocab), ids[:, 1:].reshape(-1))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            del logits, loss

    model = torch.nn.ModuleList([emb, body, head])
    return step, 4, [model, opt]  # lengths 200, 100, 256, 96: each bucket warms up, then is recorded


WORKLOADS = {"bert-inference": bert_inference, "gpt2-train": gpt2_train}
MODES = ("caching", "compact", "planned")


def compact_each(long_lived: list) -> None:
    """One compaction per object: the copy then needs room for the largest
    object twice, not for all of them."""
    import torchmem

    for obj in long_lived:
        torchmem.compact(obj)


def worker(mode: str, workload: str, steps: int) -> dict:
    import contextlib

    import torch

    import torchmem
    from torchmem.runtime.planned import plans, slab_stats

    torch.manual_seed(0)
    torchmem.install()
    step, warm_steps, long_lived = WORKLOADS[workload]()
    reports: list[list] = []

    @contextlib.contextmanager
    def scope(key: Any):
        if mode != "planned":
            yield
            return
        with torchmem.planned(key) as report:
            yield
        reports.append([str(key), report.phase, report.hits, report.misses])

    for i in range(warm_steps):
        step(i, scope)
        if i == 0 and mode != "caching":
            compact_each(long_lived)
    warmup_peak = torchmem.max_memory_reserved()
    torchmem.empty_cache()
    torchmem.reset_peak_memory_stats()
    times = []
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for i in range(warm_steps, warm_steps + steps):
        t0 = time.perf_counter()
        step(i, scope)
        times.append(time.perf_counter() - t0)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    stats = torchmem.memory_stats()
    out = {
        "mode": mode,
        "step_s": statistics.median(times),
        "faults_per_step": faults / steps,
        "peak_reserved": stats["reserved_bytes.all.peak"],
        "peak_allocated": stats["allocated_bytes.all.peak"],
        "peak_requested": stats["requested_bytes.all.peak"],
        "warmup_peak_reserved": warmup_peak,
        "reports": reports[warm_steps:],
    }
    if mode == "planned":
        out["region"] = slab_stats()["region_bytes"]
        out["plans"] = {str(k): [e.plan_height, e.lower_bound] for k, e in plans().items()}
    return out


def paired_worker(workload: str, pairs: int) -> dict:
    """One process: after the warm-up (every key planned) and compaction,
    `pairs` pairs of the same step, once on the caching allocator and once
    planned, in alternating order (the first pair of each is untimed)."""
    import contextlib

    import torch

    import torchmem

    torch.manual_seed(0)
    torchmem.install()
    step, warm_steps, long_lived = WORKLOADS[workload]()
    plain = lambda key: contextlib.nullcontext()  # noqa: E731
    for i in range(warm_steps):
        step(i, torchmem.planned)
        if i == 0:
            compact_each(long_lived)
    timed: dict[str, list[float]] = {"caching": [], "planned": []}
    for n in range(pairs + 1):
        i = warm_steps + n
        order = (("caching", plain), ("planned", torchmem.planned))
        for mode, scope in order if n % 2 == 0 else order[::-1]:
            t0 = time.perf_counter()
            step(i, scope)
            if n:
                timed[mode].append(time.perf_counter() - t0)
    ratios = [p / c for p, c in zip(timed["planned"], timed["caching"])]
    return {"caching_s": statistics.median(timed["caching"]), "planned_s": statistics.median(timed["planned"]),
            "ratios": ratios}


def run_mode(mode: str, workload: str, steps: int) -> dict:
    argv = [sys.executable, os.path.abspath(__file__), "--worker", mode, "--workload", workload, "--steps", str(steps)]
    proc = subprocess.run(argv, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=ROOT))
    if proc.returncode != 0:
        raise SystemExit(f"{mode} run failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def report(workload: str, steps: int, rounds: list[dict[str, dict]]) -> None:
    last = rounds[-1]
    c = last["caching"]
    bound = c["peak_requested"]
    title = {"bert-inference": "BERT-base inference, batch 32, sequence 128",
             "gpt2-train": "GPT-2-sized training, batch 4, lengths 96-256 in buckets of 128"}[workload]
    print(f"{title}; {steps} timed steps, {len(rounds)} rounds")
    print(f"{'':<18}{'peak reserved MiB':>18}{'peak allocated MiB':>20}{'reserved / bound':>18}{'median step s':>15}"
          f"{'faults/step':>13}{'warm-up peak MiB':>18}")
    names = {"caching": "caching allocator", "compact": "caching + compact", "planned": "planned + compact"}
    for mode, name in names.items():
        if mode not in last:
            continue
        row = last[mode]
        steps_s = statistics.median(r[mode]["step_s"] for r in rounds)
        print(f"{name:<18}{row['peak_reserved'] / MiB:>18,.1f}{row['peak_allocated'] / MiB:>20,.1f}"
              f"{row['peak_reserved'] / bound:>18.4f}{steps_s:>15.3f}{row['faults_per_step']:>13,.0f}"
              f"{row['warmup_peak_reserved'] / MiB:>18,.1f}")
    print(f"{'lower bound':<18}{bound / MiB:>18,.1f}   (peak of bytes requested and live at once, caching run)")
    if "planned" in last:
        p = last["planned"]
        print(f"planned region {p['region'] / MiB:,.1f} MiB; plans (key: height / own bound MiB): "
              + ", ".join(f"{k}: {h / MiB:,.1f} / {b / MiB:,.1f}" for k, (h, b) in p["plans"].items()))
        print(f"timed planned steps (key, phase, hits, misses): {p['reports']}")
    for mode in [m for m in ("compact", "planned") if m in last]:
        ratios = [r[mode]["step_s"] / r["caching"]["step_s"] for r in rounds]
        print(f"step time {mode} / caching per round: {', '.join(f'{x:.3f}' for x in ratios)}; "
              f"median {statistics.median(ratios):.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="bert-inference")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--modes", default=",".join(MODES),
                        help="comma-separated modes to run; caching is always one (default: all)")
    parser.add_argument("--pairs", type=int, default=6,
                        help="pairs of steps, caching and planned, in one process (0: skip)")
    parser.add_argument("--worker", choices=MODES + ("paired",), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.steps < 1 or args.rounds < 1 or args.pairs < 0:
        parser.error("--steps and --rounds must be >= 1, --pairs >= 0")
    if args.worker == "paired":
        print(json.dumps(paired_worker(args.workload, args.steps)))
        return
    if args.worker:
        print(json.dumps(worker(args.worker, args.workload, args.steps)))
        return
    chosen = [m for m in MODES if m == "caching" or m in args.modes.split(",")]
    unknown = set(args.modes.split(",")) - set(MODES)
    if unknown:
        parser.error(f"unknown modes {sorted(unknown)}; choose from {', '.join(MODES)}")
    rounds = []
    for r in range(args.rounds):
        modes = chosen[r % len(chosen):] + chosen[: r % len(chosen)]
        rounds.append({mode: run_mode(mode, args.workload, args.steps) for mode in modes})
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    report(args.workload, args.steps, rounds)
    if args.pairs:
        paired = run_mode("paired", args.workload, args.pairs)
        print(f"in one process, {args.pairs} pairs of the same step: caching {paired['caching_s']:.3f} s, "
              f"planned {paired['planned_s']:.3f} s (medians); planned / caching per pair: "
              f"{', '.join(f'{x:.3f}' for x in paired['ratios'])}; median {statistics.median(paired['ratios']):.3f}")


if __name__ == "__main__":
    main()
