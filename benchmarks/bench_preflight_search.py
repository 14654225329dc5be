"""Wall time of `torchmem preflight --search` over the whole catalog, for an HF Trainer fine-tune.

The workload is a Qwen2-shaped model of about 98M parameters, built from a
config (nothing downloaded), trained by the HF Trainer at 1,024 tokens a row,
with bf16, activation checkpointing and fused AdamW, for up to 10 steps. The
search bisects its per-device batch over LO..HI on the twelve catalog cards,
each probe stopped after --steps optimizer steps.

    python benchmarks/bench_preflight_search.py [--range 1..64] [--steps 3] [--json]

Run it with the CUDA venv's Python, with PYTHONPATH and TORCHMEM_EXT_DIR as
for any preflight (docs/preflight.md). It prints the search's table and the
wall time of the whole command.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

TRAINER = """
import sys, torch
from transformers import Qwen2Config, Qwen2ForCausalLM, Trainer, TrainingArguments
batch = int(sys.argv[1])
config = Qwen2Config(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                     num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=1024,
                     tie_word_embeddings=True)
class Tokens(torch.utils.data.Dataset):
    def __len__(self):
        return 16 * batch
    def __getitem__(self, i):
        ids = torch.randint(0, 32000, (1024,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids.clone()}
args = TrainingArguments(output_dir=sys.argv[2], per_device_train_batch_size=batch, max_steps=10, bf16=True,
                         gradient_checkpointing=True, optim="adamw_torch_fused", save_strategy="no",
                         report_to=[], disable_tqdm=True, logging_steps=1)
Trainer(model=Qwen2ForCausalLM(config), args=args, train_dataset=Tokens()).train()
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--range", default="1..64")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-search-") as tmp:
        script = os.path.join(tmp, "trainer.py")
        with open(script, "w") as f:
            f.write(TRAINER)
        command = [sys.executable, "-m", "torchmem", "preflight", "--search", f"BATCH={args.range}",
                   "--steps", str(args.steps), "--json", "--out", os.path.join(tmp, "out"), "--",
                   sys.executable, script, "{BATCH}", os.path.join(tmp, "trainer-out")]
        started = time.monotonic()
        proc = subprocess.run(command, capture_output=True, text=True)
        seconds = time.monotonic() - started
    if proc.returncode != 0:
        sys.exit(f"the search failed ({proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")
    table = json.loads(proc.stdout)
    probes = sum(1 for line in proc.stderr.splitlines() if line.startswith("torchmem preflight: BATCH="))
    result = {"seconds": round(seconds, 1), "probes": probes, "cores": os.cpu_count(), "machine": platform.machine(),
              "cards": {c["card"]: c["largest"] for c in table["cards"]}}
    print(json.dumps(result) if args.json else
          f"{probes} probes in {seconds:.1f} s on {os.cpu_count()} cores\n"
          + "\n".join(f"  {card}: largest batch {largest}" for card, largest in result["cards"].items()))


if __name__ == "__main__":
    main()
