"""Host memory of a script that moves two large fp32 models to the fake GPU in turn (docs/preflight.md).

The workload builds a stack of bias-free torch.nn.Linear(8192, 8192) layers on
the CPU (about --params billion parameters, 4 bytes each), moves it with
.to("cuda"), then builds a second one on the CPU and moves that too. Both stay
alive, so the first one's device memory is held while the second is built.

Each run is a child process (python -m torchmem.fakegpu, exec'ing the
workload). The figure is the child's peak resident set (ru_maxrss of
RUSAGE_CHILDREN), against one CPU copy of a model (parameters x 4 bytes).
Device memory that holds no data keeps that ratio near 1; a fake GPU that
keeps every copied byte needs about 2 copies or more.

    python benchmarks/bench_preflight_host_memory.py [--params 2.7] [--libs DIR] [--json]

--libs names a stand-in set other than the launcher's default (an older
build, to measure the rule it had). Set PYTHONPATH, TORCHMEM_EXT_DIR and
TORCHMEM_FAKEGPU_LIBS as for any fake-GPU run; run it with the CUDA venv's
Python. On a machine with too little memory the child is killed (-9): the
output says so.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time

WIDTH = 8192


def workload(params: float) -> None:
    """The child: two models built on the CPU and moved to the device in turn."""
    import torch

    layers = max(1, round(params * 1e9 / (WIDTH * WIDTH)))
    kept = []
    for _ in range(2):
        with torch.no_grad():
            model = torch.nn.Sequential(*(torch.nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(layers)))
        kept.append(model.to("cuda"))
        del model
    torch.cuda.synchronize()
    print(json.dumps({"layers": layers, "parameters": layers * WIDTH * WIDTH,
                      "allocated": torch.cuda.memory_allocated()}))


def measure(params: float, libs: str | None) -> dict:
    """Runs the workload on the fake GPU; its peak RSS and its ratio to one CPU copy."""
    env = dict(os.environ)
    if libs:
        env["TORCHMEM_FAKEGPU_LIBS"] = libs
    command = [sys.executable, "-m", "torchmem.fakegpu", "--card", "80GiB", "--",
               sys.executable, os.path.abspath(__file__), "--workload", "--params", str(params)]
    start = time.monotonic()
    proc = subprocess.run(command, env=env, capture_output=True, text=True)
    seconds = time.monotonic() - start
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    layers = max(1, round(params * 1e9 / (WIDTH * WIDTH)))
    one_copy = layers * WIDTH * WIDTH * 4
    result = {"params": layers * WIDTH * WIDTH, "one_cpu_copy_bytes": one_copy, "peak_rss_bytes": peak,
              "ratio": round(peak / one_copy, 3), "returncode": proc.returncode, "seconds": round(seconds, 1),
              "libs": env.get("TORCHMEM_FAKEGPU_LIBS"), "machine": f"{os.cpu_count()} cores, {platform.machine()}"}
    if proc.returncode != 0:
        result["stderr_tail"] = proc.stderr[-800:]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=float, default=2.7, help="billions of parameters per model (default 2.7)")
    parser.add_argument("--libs", help="the fake GPU's stand-in set to run on (default: TORCHMEM_FAKEGPU_LIBS)")
    parser.add_argument("--workload", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    if args.workload:
        workload(args.params)
        return
    result = measure(args.params, args.libs)
    if args.json:
        print(json.dumps(result))
        return
    print(f"{result['params'] / 1e9:.2f}B parameters x2, one CPU copy {result['one_cpu_copy_bytes'] / 1e9:.2f} GB: "
          f"peak RSS {result['peak_rss_bytes'] / 1e9:.2f} GB = {result['ratio']:.2f} copies "
          f"(exit {result['returncode']}, {result['seconds']} s)")
    if result["returncode"] != 0:
        print(result.get("stderr_tail", ""), file=sys.stderr)


if __name__ == "__main__":
    main()
