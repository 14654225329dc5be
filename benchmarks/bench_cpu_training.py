"""A BERT-base-sized CPU training step under each allocator, in the same run.

    python benchmarks/bench_cpu_training.py [--rounds 3] [--steps 4] [--layers 12] [--threads N]
        [--allocators glibc,torchmem,...] [--conf NAME=CONF ...]

Allocators: glibc (PyTorch's default CPU allocator on glibc malloc),
torchmem (torchmem.install(), with its CPU settings), torchmem-native
(torchmem.install(conf="reuse_order:address,min_block_size:512"): the native
policy), tcmalloc and jemalloc (LD_PRELOAD of Debian's libtcmalloc-minimal4
and libjemalloc2), and tcmalloc+torchmem (tcmalloc preloaded for the
non-tensor allocations, torchmem for the tensors). --conf NAME=CONF adds a
torchmem run named NAME with that config (for experiments). Each run is a
fresh process: hidden 768, --layers layers, 12 heads, FFN 3072, batch 8,
sequence 128, forward, backward and AdamW; two warm-up steps, then --steps
timed steps. The runs alternate allocators round by round; the table gives
each allocator's median step time, its ratio to glibc (or to the first
allocator listed, when glibc is not run: median of the per-round ratios) and
the minor page faults per step. "CPU s" is the process's CPU time per step
(all threads), which other work on a shared machine disturbs less than the
wall time; with more than one thread it includes the threads' spin-waits.
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
allocator, steps, layers, threads, conf = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
if threads > 0:
    torch.set_num_threads(threads)
if allocator != "glibc" and allocator not in ("tcmalloc", "jemalloc"):
    import torchmem
    torchmem.install(conf=conf or None)
torch.manual_seed(0)
layer = torch.nn.TransformerEncoderLayer(768, 12, 3072, dropout=0.1, batch_first=True)
model = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
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
times, cpu = [], []
faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(steps):
    t0, c0 = time.perf_counter(), time.process_time()
    step()
    times.append(time.perf_counter() - t0)
    cpu.append(time.process_time() - c0)
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0
print(json.dumps({"allocator": allocator, "step_s": sorted(times)[len(times) // 2],
                  "cpu_s": sorted(cpu)[len(cpu) // 2], "faults_per_step": faults / steps}))
"""


TORCHMEM_CONFS = {"torchmem": "", "torchmem-native": "reuse_order:address,min_block_size:512", "tcmalloc+torchmem": ""}


def run_one(allocator: str, conf: str, steps: int, layers: int, threads: int) -> dict:
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("TORCHMEM_ALLOC_CONF", None)
    preload = PRELOADS.get(allocator.split("+")[0])
    if preload:
        env["LD_PRELOAD"] = preload
    cmd = [sys.executable, "-c", WORKER, allocator, str(steps), str(layers), str(threads), conf]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: PyTorch's default)")
    parser.add_argument("--allocators", default="", help="comma-separated subset, in this order")
    parser.add_argument("--conf", action="append", default=[], metavar="NAME=CONF", help="a torchmem run with this config")
    args = parser.parse_args()
    confs = dict(TORCHMEM_CONFS)
    for item in args.conf:
        name, sep, conf = item.partition("=")
        if not sep or not name or name in PRELOADS or name == "glibc":
            parser.error(f"--conf takes NAME=CONF with a new name, got {item!r}")
        confs[name] = conf
    installed = [name for name, lib in PRELOADS.items() if os.path.exists(lib)]
    if args.allocators:
        allocators = [a.strip() for a in args.allocators.split(",") if a.strip()]
    else:
        allocators = ["glibc", "torchmem", "torchmem-native"] + installed + ["tcmalloc+torchmem"]
        allocators += [name for name in confs if name not in allocators]
    unknown = [a for a in allocators if a != "glibc" and a not in PRELOADS and a not in confs]
    if unknown:
        parser.error(f"unknown allocators {unknown}: glibc, {', '.join(PRELOADS)}, {', '.join(confs)}")
    missing = [a for a in allocators if a.split("+")[0] in PRELOADS and a.split("+")[0] not in installed]
    if missing:
        print(f"note: not installed, skipped: {', '.join(missing)} (apt-get install libtcmalloc-minimal4 libjemalloc2)")
        allocators = [a for a in allocators if a not in missing]
    results: dict[str, list[dict]] = {a: [] for a in allocators}
    for r in range(args.rounds):
        for a in allocators:
            results[a].append(run_one(a, confs.get(a, ""), args.steps, args.layers, args.threads))
            x = results[a][-1]
            print(f"round {r + 1}/{args.rounds} {a:<18} step {x['step_s']:.3f} s, CPU {x['cpu_s']:.3f} s", file=sys.stderr)
    ref = "glibc" if "glibc" in allocators else allocators[0]
    base = results[ref]
    print(f"\n{'allocator':<18} {'median step s':>14} {'vs ' + ref:>14} {'median CPU s':>13} {'CPU vs ' + ref:>14} "
          f"{'minor faults/step':>18}")
    for a in allocators:
        steps = [x["step_s"] for x in results[a]]
        cpu = [x["cpu_s"] for x in results[a]]
        ratio = statistics.median(x["step_s"] / b["step_s"] for x, b in zip(results[a], base))
        cpu_ratio = statistics.median(x["cpu_s"] / b["cpu_s"] for x, b in zip(results[a], base))
        faults = statistics.median(x["faults_per_step"] for x in results[a])
        print(f"{a:<18} {statistics.median(steps):>14.3f} {ratio:>14.3f} {statistics.median(cpu):>13.3f} "
              f"{cpu_ratio:>14.3f} {faults:>18,.0f}")


if __name__ == "__main__":
    main()
