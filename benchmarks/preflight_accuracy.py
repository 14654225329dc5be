"""Preflight against a real GPU: the same workloads recorded on the card and under preflight (item 4, docs/preflight.md).

    python benchmarks/preflight_accuracy.py --out DIR [--workloads gpt2_adamw resnet checkpointing ...]

For each workload of tests/fakegpu/preflight_workloads.py, one interpreter
runs it on the real GPU with PyTorch's history recorded from the start and
writes the native snapshot; then `torchmem preflight` runs the same child on
the fake GPU, on a card of the real one's memory and compute capability.
For each pair: peak allocated and peak reserved (PyTorch's memory_stats),
and the share of allocations that land at the same offset in their segment
(the i-th allocation of one run against the i-th of the other). Writes
DIR/preflight_accuracy.md and .json. scripts/gpu_check.sh runs it as its
`preflight` stage. Where no GPU is, --rehearse runs the "real" side on the
fake GPU too (every figure then compares the fake GPU with itself).
"""
from __future__ import annotations

import argparse
import bisect
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ["gpt2_adamw", "t5_training", "resnet", "checkpointing", "autocast_gradscaler"]
HF = {"gpt2_adamw", "bert_inference", "t5_training"}

CHILD = """
import json, os, sys
sys.path.insert(0, {root!r})
import torch
kind, out = sys.argv[1], sys.argv[2]
recording = not os.environ.get("TORCHMEM_PREFLIGHT_PLAN")
if recording:
    torch.cuda.memory._record_memory_history(stacks="python")
    torch.backends.cudnn.enabled = False  # as under preflight, so both runs take the same kernels
from tests.fakegpu.preflight_workloads import KINDS
kept = KINDS[kind]("cuda")
torch.cuda.synchronize()
if recording:
    torch.cuda.memory._dump_snapshot(out)
stats = torch.cuda.memory_stats()
props = torch.cuda.get_device_properties(0)
print(json.dumps({{"peak_allocated": stats["allocated_bytes.all.peak"], "peak_reserved": stats["reserved_bytes.all.peak"],
                  "total": props.total_memory, "capability": f"{{props.major}}.{{props.minor}}"}}))
"""


def offsets(snapshot: dict[str, Any], device: int = 0) -> list[int]:
    """Each allocation's offset in its segment, in trace order (segments from segment_alloc / segment_map)."""
    starts: list[int] = []
    sizes: dict[int, int] = {}
    for seg in snapshot.get("segments", []):
        if seg.get("device", 0) == device:
            bisect.insort(starts, seg["address"])
            sizes[seg["address"]] = seg["total_size"]
    out = []
    traces = snapshot.get("device_traces", [])
    for e in traces[device] if device < len(traces) else []:
        if e["action"] in ("segment_alloc", "segment_map") and e["addr"] not in sizes:
            bisect.insort(starts, e["addr"])
            sizes[e["addr"]] = e["size"]
        elif e["action"] == "alloc":
            i = bisect.bisect_right(starts, e["addr"]) - 1
            out.append(e["addr"] - starts[i] if i >= 0 else -1)
    return out


def same_offset_share(a: dict[str, Any], b: dict[str, Any], device: int = 0) -> tuple[float, int, int]:
    """The share of allocations at the same offset in their segment, and the two runs' allocation counts."""
    x, y = offsets(a, device), offsets(b, device)
    n = max(len(x), len(y))
    same = sum(1 for p, q in zip(x, y) if p == q)
    return (same / n if n else 1.0), len(x), len(y)


def run_real(kind: str, out: Path, env: dict[str, str]) -> dict[str, Any]:
    code = CHILD.format(root=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", code, kind, str(out)], capture_output=True, text=True, env=env,
                          timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"{kind} on the GPU: exit {proc.returncode}: {proc.stderr[-1500:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--workloads", nargs="+", default=DEFAULT)
    parser.add_argument("--rehearse", action="store_true", help="no GPU: the 'real' side runs on the fake GPU too")
    args = parser.parse_args()
    from torchmem import fakegpu

    try:
        import transformers  # noqa: F401
    except ImportError:  # the Hugging Face workloads need it; the others run without
        dropped = [k for k in args.workloads if k in HF]
        if dropped:
            print(f"transformers is not installed: leaving out {', '.join(dropped)}", file=sys.stderr)
        args.workloads = [k for k in args.workloads if k not in HF]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    real_env = dict(os.environ, PYTHONPATH=str(ROOT))
    if args.rehearse:
        real_env = fakegpu.environment("80GiB", base=real_env)
    rows = []
    for kind in args.workloads:
        print(f"preflight_accuracy: {kind}", file=sys.stderr, flush=True)
        try:
            rows.append(compare(kind, out, real_env, args.rehearse))
        except Exception as e:  # one workload's failure is a row of the table; the others still run
            rows.append({"workload": kind, "error": f"{type(e).__name__}: {str(e)[-600:]}"})
    (out / "preflight_accuracy.json").write_text(json.dumps(rows, indent=2))
    lines = ["| workload | peak allocated real / preflight | peak reserved real / preflight | same offset in segment |",
             "| --- | --- | --- | --- |"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['workload']} | failed: {r['error'].splitlines()[0][:200]} | | |")
            continue
        lines.append(f"| {r['workload']} | {r['real_peak_allocated']:,} / {r['preflight_peak_allocated']:,} | "
                     f"{r['real_peak_reserved']:,} / {r['preflight_peak_reserved']:,} | "
                     f"{r['same_offset_share']:.1%} of {max(r['allocations_real'], r['allocations_preflight']):,} |")
    (out / "preflight_accuracy.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    for r in rows:
        if "error" in r:
            print(f"{r['workload']}: {r['error']}", file=sys.stderr)
    return 1 if any("error" in r for r in rows) else 0


def compare(kind: str, out: Path, real_env: dict[str, str], rehearsal: bool) -> dict[str, Any]:
    """One workload on the card (or the fake GPU, rehearsing) and under preflight: the table's row."""
    from torchmem import preflight
    from torchmem.fakegpu import Card

    real_snapshot = out / f"real_{kind}.pickle"
    real = run_real(kind, real_snapshot, real_env)
    card = Card(f"preflight of the real card ({real['capability']})", real["total"], real["capability"])
    report = preflight.run_command([sys.executable, "-c", CHILD.format(root=str(ROOT)), kind, "-"], card,
                                   out=out / f"preflight_{kind}", advise=False, capture_output=True,
                                   env=dict(os.environ, PYTHONPATH=str(ROOT)))
    [fake] = report.devices
    with open(real_snapshot, "rb") as f:
        a = pickle.load(f)
    with open(fake.snapshot, "rb") as f:
        b = pickle.load(f)
    share, n_real, n_fake = same_offset_share(a, b)
    return {"workload": kind, "real_peak_allocated": real["peak_allocated"],
            "preflight_peak_allocated": fake.peak_allocated, "real_peak_reserved": real["peak_reserved"],
            "preflight_peak_reserved": fake.peak_reserved, "same_offset_share": share,
            "allocations_real": n_real, "allocations_preflight": n_fake, "rehearsal": rehearsal}


if __name__ == "__main__":
    sys.exit(main())
