"""Planned allocation against the caching allocator on CPU steps.

    python benchmarks/bench_planned.py [--steps 4] [--batch 32] [--seq 128]
    python benchmarks/bench_planned.py --workload gpt2-train [--steps 6]

The GPT-2 workload trains a GPT-2-sized model (hidden 768, 12 layers, 12
heads, vocabulary 50,257, AdamW) at batch 4 on sequence lengths that vary
step by step (96 to 256 tokens), padded to buckets of 128: one plan per
bucket, so the planned mode holds one slab per bucket.

A BERT-base-sized encoder (hidden 768, 12 layers, 12 heads, FFN 3072, random
weights) runs inference steps under torchmem.install(), first on the caching
allocator alone, then inside torchmem.planned() (one recorded step, then
planned steps). Each mode runs in a fresh process. After the first step the
cache is emptied, then peaks are measured over the timed steps. Reported:
peak reserved (caching: weights plus its cache; planned: the slab plus what
the caching allocator still holds, the weights and any misses), the plan's
lower bound, hits and misses, and the median step time.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

WORKER = r"""
import json, statistics, sys, time, torch, torchmem
from torchmem.planned import planned, plans
mode, steps, batch, seq = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
torch.manual_seed(0)
torchmem.install()
layer = torch.nn.TransformerEncoderLayer(768, 12, 3072, dropout=0.0, batch_first=True)
model = torch.nn.TransformerEncoder(layer, 12, enable_nested_tensor=False).eval()
x = torch.randn(batch, seq, 768)
weights = sum(p.numel() * p.element_size() for p in model.parameters()) + x.numel() * x.element_size()
times, reports = [], []
def run():
    with torch.no_grad():
        return model(x).sum().item()
for i in range(steps + 1):
    t0 = time.perf_counter()
    if mode == "planned":
        with planned("bert") as rep:
            run()
        reports.append([rep.phase, rep.hits, rep.misses])
    else:
        run()
    if i > 0:
        times.append(time.perf_counter() - t0)
    if i == 0:  # measure the steady state: drop what the first (recorded) step cached
        torchmem.empty_cache()
        torchmem.reset_peak_memory_stats()
out = {"mode": mode, "step_s": statistics.median(times),
       "caching_peak_reserved": torchmem.max_memory_reserved(), "weights": weights, "reports": reports}
if mode == "planned":
    e = plans()["bert"]
    out.update(slab=e.plan_height, lower_bound=e.lower_bound, method=e.method)
print(json.dumps(out))
"""


GPT2_WORKER = r"""
import json, statistics, sys, time, torch, torchmem
from torchmem.planned import planned, plans
mode, steps = sys.argv[1], int(sys.argv[2])
torch.manual_seed(0)
torchmem.install()
V, H = 50257, 768
emb = torch.nn.Embedding(V, H)
layer = torch.nn.TransformerEncoderLayer(H, 12, 4 * H, dropout=0.0, batch_first=True, norm_first=True)
body = torch.nn.TransformerEncoder(layer, 12, enable_nested_tensor=False)
head = torch.nn.Linear(H, V, bias=False)
params = list(emb.parameters()) + list(body.parameters()) + list(head.parameters())
opt = torch.optim.AdamW(params, lr=1e-4)
lengths = [200, 100, 256, 96, 180, 128, 240, 110, 150, 250, 120, 200]
def train(length):
    bucket = -(-length // 128) * 128
    ids = torch.randint(0, V, (4, bucket))
    mask = torch.nn.Transformer.generate_square_subsequent_mask(bucket)
    logits = head(body(emb(ids), mask=mask, is_causal=True))
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, V), ids[:, 1:].reshape(-1))
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return bucket
times, reports = [], []
for i, length in enumerate(lengths[: steps + 2]):
    t0 = time.perf_counter()
    if mode == "planned":
        bucket = -(-length // 128) * 128
        with planned(bucket) as rep:
            train(length)
        reports.append([bucket, rep.phase, rep.hits, rep.misses])
    else:
        train(length)
    if i >= 2:
        times.append(time.perf_counter() - t0)
    if i == 1:  # both buckets seen (and recorded): measure the steady state from here
        torchmem.empty_cache()
        torchmem.reset_peak_memory_stats()
out = {"mode": mode, "step_s": statistics.median(times), "caching_peak_reserved": torchmem.max_memory_reserved(),
       "weights": 0, "reports": reports}
if mode == "planned":
    es = plans()
    out.update(slab=sum(e.plan_height for e in es.values()), lower_bound=max(e.lower_bound for e in es.values()),
               method=",".join(sorted({e.method for e in es.values()})),
               slabs={str(k): [e.plan_height, e.lower_bound] for k, e in es.items()})
print(json.dumps(out))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=["bert-inference", "gpt2-train"], default="bert-inference")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq", type=int, default=128)
    args = parser.parse_args()
    rows = {}
    for mode in ("caching", "planned"):
        if args.workload == "gpt2-train":
            argv = [sys.executable, "-c", GPT2_WORKER, mode, str(args.steps)]
        else:
            argv = [sys.executable, "-c", WORKER, mode, str(args.steps), str(args.batch), str(args.seq)]
        out = subprocess.run(argv, capture_output=True, text=True, check=True, env=dict(os.environ, PYTHONPATH=ROOT)).stdout
        rows[mode] = json.loads(out.strip().splitlines()[-1])
    c, p = rows["caching"], rows["planned"]
    mib = 2**20
    if args.workload == "gpt2-train":
        print(f"GPT-2-sized training, batch 4, lengths 96-256 in buckets of 128, {args.steps} timed steps")
        print(f"caching allocator: peak reserved {c['caching_peak_reserved'] / mib:,.1f} MiB, median step {c['step_s']:.3f} s")
        print(f"planned:           peak reserved {(p['slab'] + p['caching_peak_reserved']) / mib:,.1f} MiB "
              f"(slabs {p['slab'] / mib:,.1f} + caching {p['caching_peak_reserved'] / mib:,.1f}), median step {p['step_s']:.3f} s")
        for key, (height, bound) in p["slabs"].items():
            print(f"  bucket {key}: slab {height / mib:,.1f} MiB, lower bound {bound / mib:,.1f} MiB, ratio {height / max(bound, 1):.4f}")
        print(f"steps (bucket, phase, hits, misses): {p['reports']}")
        print(f"step time planned / caching: {p['step_s'] / c['step_s']:.3f}")
        return
    print(f"BERT-base inference, batch {args.batch}, sequence {args.seq}, {args.steps} timed steps")
    print(f"weights and input: {c['weights'] / mib:,.1f} MiB (in the caching allocator in both modes)")
    print(f"caching allocator: peak reserved {c['caching_peak_reserved'] / mib:,.1f} MiB, median step {c['step_s']:.3f} s")
    print(f"planned:           peak reserved {(p['slab'] + p['caching_peak_reserved']) / mib:,.1f} MiB "
          f"(slab {p['slab'] / mib:,.1f} + caching {p['caching_peak_reserved'] / mib:,.1f}), median step {p['step_s']:.3f} s ({p['method']})")
    print(f"lower bound of the recorded step: {p['lower_bound'] / mib:,.1f} MiB; slab / bound = {p['slab'] / max(p['lower_bound'], 1):.4f}")
    print(f"planned steps (phase, hits, misses): {p['reports']}")
    print(f"step time planned / caching: {p['step_s'] / c['step_s']:.3f}")


if __name__ == "__main__":
    main()
