"""What a preflight costs (BENCHMARKS.md, "Preflight").

    python benchmarks/bench_preflight.py [--steps 3] [--skip-7b]

1. A GPT-2-small training step (Hugging Face GPT2LMHeadModel, default config
   124M parameters, AdamW, batch 4 x 256 tokens): on the CPU, and under
   `torchmem preflight` on an 80 GiB card (kernels skipped). Prints the
   median step time inside each run and each run's wall time (interpreter
   start, imports, model creation included) and peak host memory (max RSS).
2. A 7B-parameter Llama-shaped model (LlamaConfig: hidden 4096, 32 layers,
   intermediate 11008, vocabulary 32000; bf16 weights created on the device,
   AdamW), its first training step (batch 1 x 512 tokens) under preflight on
   an 80 GiB card: wall time, peak host memory, and what the run reports.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

GPT2 = """
import json, statistics, sys, time, torch
from transformers import GPT2Config, GPT2LMHeadModel
device, steps = sys.argv[1], int(sys.argv[2])
torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config()).to(device)
opt = torch.optim.AdamW(model.parameters())
ids = torch.randint(0, 50257, (4, 256), device=device)
times = []
for _ in range(steps):
    t = time.perf_counter()
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step(); opt.zero_grad(set_to_none=True)
    if device == "cuda": torch.cuda.synchronize()
    times.append(time.perf_counter() - t)
print(json.dumps({"step_s": statistics.median(times), "steps": times}))
"""

LLAMA_7B = """
import json, time, torch
from transformers import LlamaConfig, LlamaForCausalLM
t = time.perf_counter()
config = LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                     vocab_size=32000, max_position_embeddings=2048)
with torch.device("cuda"):
    model = LlamaForCausalLM(config).to(torch.bfloat16)
created = time.perf_counter() - t
params = sum(p.numel() for p in model.parameters())
opt = torch.optim.AdamW(model.parameters())
ids = torch.randint(0, 32000, (1, 512), device="cuda")
t = time.perf_counter()
model(input_ids=ids, labels=ids).loss.backward()
opt.step()
torch.cuda.synchronize()
print(json.dumps({"params": params, "create_s": created, "step_s": time.perf_counter() - t}))
"""


def timed(command: list[str], env: dict[str, str]) -> tuple[subprocess.CompletedProcess, float, int]:
    """The run, its wall time, and its own peak host memory (GNU time's maximum resident set size)."""
    t = time.perf_counter()
    proc = subprocess.run(["/usr/bin/time", "-f", "MAXRSS_KB %M", *command], capture_output=True, text=True, env=env,
                          timeout=1800)
    wall = time.perf_counter() - t
    rss = [int(line.split()[1]) for line in proc.stderr.splitlines() if line.startswith("MAXRSS_KB ")]
    return proc, wall, rss[-1] * 1024 if rss else -1


def last_json(text: str) -> dict:
    return json.loads([line for line in text.splitlines() if line.startswith("{")][-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--skip-7b", action="store_true")
    args = parser.parse_args()
    from torchmem.preflight import environment_for

    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("LD_PRELOAD", None)
    results = {}
    cpu, wall, rss = timed([sys.executable, "-c", GPT2, "cpu", str(args.steps)], env)
    assert cpu.returncode == 0, cpu.stderr[-2000:]
    results["gpt2_cpu"] = {**last_json(cpu.stdout), "wall_s": wall, "max_rss": rss}
    out = Path("/tmp/torchmem-bench-preflight")
    fake_env = environment_for("80GiB", out=out / "gpt2", base=env)
    (out / "gpt2").mkdir(parents=True, exist_ok=True)
    fake, wall, rss = timed([sys.executable, "-c", GPT2, "cuda", str(args.steps)], fake_env)
    assert fake.returncode == 0, fake.stderr[-2000:]
    report = json.loads(next((out / "gpt2").glob("pid*.json")).read_text())
    results["gpt2_preflight"] = {**last_json(fake.stdout), "wall_s": wall, "max_rss": rss,
                                 "peak_allocated": report["devices"][0]["peak_allocated"],
                                 "peak_reserved": report["devices"][0]["peak_reserved"]}
    if not args.skip_7b:
        (out / "7b").mkdir(parents=True, exist_ok=True)
        big, wall, rss = timed([sys.executable, "-c", LLAMA_7B], environment_for("80GiB", out=out / "7b", base=env))
        report = json.loads(next((out / "7b").glob("pid*.json")).read_text())
        results["llama7b_preflight"] = {**(last_json(big.stdout) if big.returncode == 0 else {}),
                                        "returncode": big.returncode, "wall_s": wall, "max_rss": rss,
                                        "status": report["status"], "oom": report.get("oom"),
                                        "peak_allocated": report["devices"][0]["peak_allocated"],
                                        "peak_reserved": report["devices"][0]["peak_reserved"],
                                        "snapshot_bytes": os.path.getsize(report["snapshot"])}
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
