"""A BERT-base-sized CPU training step under each allocator, in the same run.

    python benchmarks/bench_cpu_training.py [--rounds 3] [--steps 4]

Allocators: glibc (PyTorch's default CPU allocator on glibc malloc),
torchmem (torchmem.install()), tcmalloc and jemalloc (LD_PRELOAD of
Debian's libtcmalloc-minimal4 and libjemalloc2). Each run is a fresh process:
hidden 768, 12 layers, 12 heads, FFN 3072, batch 8, sequence 128, forward,
backward and AdamW; two warm-up steps, then --steps timed steps. The runs
alternate allocators round by round; the table gives each allocator's median
step time, its ratio to glibc (median of the per-round ratios) and the minor
page faults per step.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRELOADS = {
    "tcmalloc": "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
    "jemalloc": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
}

WORKER = r"""
import json, resource, sys, time, torch
allocator, steps = sys.argv[1], int(sys.argv[2])
if allocator == "torchmem":
    import torchmem
    torchmem.install()
torch.manual_seed(0)
layer = torch.nn.TransformerEncoderLayer(768, 12, 3072, dropout=0.1, batch_first=True)
model = torch.nn.TransformerEncoder(layer, 12, enable_nested_tensor=False)
head = torch.nn.Linear(768, 30522)
params = list(model.parameters()) + list(head.parameters())
opt = torch.optim.AdamW(params, lr=1e-4)
x = torch.randn(8, 128, 768)
target = torch.randint(0, 30522, (8, 128))

def step():
    logits = head(model(x))
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 30522), target.reshape(-1))
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)

for _ in range(2):
    step()
times = []
faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(steps):
    t0 = time.perf_counter()
    step()
    times.append(time.perf_counter() - t0)
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0
print(json.dumps({"allocator": allocator, "step_s": sorted(times)[len(times) // 2], "faults_per_step": faults / steps}))
"""


def run_one(allocator: str, steps: int) -> dict:
    env = dict(os.environ, PYTHONPATH=ROOT)
    if allocator in PRELOADS:
        env["LD_PRELOAD"] = PRELOADS[allocator]
    out = subprocess.run([sys.executable, "-c", WORKER, allocator, str(steps)], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    allocators = ["glibc", "torchmem"] + [name for name, lib in PRELOADS.items() if os.path.exists(lib)]
    missing = sorted(set(PRELOADS) - set(allocators))
    if missing:
        print(f"note: not installed, skipped: {', '.join(missing)} (apt-get install libtcmalloc-minimal4 libjemalloc2)")
    results: dict[str, list[dict]] = {a: [] for a in allocators}
    for r in range(args.rounds):
        for a in allocators:
            results[a].append(run_one(a, args.steps))
            print(f"round {r + 1}/{args.rounds} {a:<9} step {results[a][-1]['step_s']:.3f} s", file=sys.stderr)
    base = results["glibc"]
    print(f"\n{'allocator':<10} {'median step s':>14} {'vs glibc':>9} {'minor faults/step':>18}")
    for a in allocators:
        steps = [x["step_s"] for x in results[a]]
        ratio = statistics.median(x["step_s"] / b["step_s"] for x, b in zip(results[a], base))
        faults = statistics.median(x["faults_per_step"] for x in results[a])
        print(f"{a:<10} {statistics.median(steps):>14.3f} {ratio:>9.3f} {faults:>18,.0f}")


if __name__ == "__main__":
    main()
