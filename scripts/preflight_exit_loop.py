"""Consecutive preflight runs of the test workloads, counting how each process ended (an abort at exit among them).

    python scripts/preflight_exit_loop.py --runs 100            # the workloads of tests/fakegpu/test_preflight_workloads.py
    python scripts/preflight_exit_loop.py --runs 100 --jobs 2   # two runs at a time (a loaded machine)

Run it with the CUDA build of torch on the fake GPU's paths (docs/fakegpu.md),
e.g. ``PYTHONPATH=$PWD TORCHMEM_EXT_DIR=... TORCHMEM_FAKEGPU_LIBS=$PWD/build/fakegpu .venv-cuda/bin/python ...``.
Run i takes workload i modulo the list: the seven single-process steps of
tests/fakegpu/preflight_workloads.py, then the 2-rank DDP job under torchrun.
Each run is one ``torchmem.preflight`` call, as the tests make it; nothing is
retried. The last line is JSON: runs, fits, aborts (SIGABRT, status -6, in
any process), other failures, and the first few failures' messages. Exit
status 1 when any run did not fit.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.fakegpu import preflight_workloads as workloads  # noqa: E402
from torchmem import preflight  # noqa: E402

DDP = "ddp"


def plan() -> list[str]:
    return sorted(workloads.KINDS) + [DDP]


def aborted(text: str) -> bool:
    """Whether a failure is a process's SIGABRT: its status, or torchrun's root cause in the named traceback file."""
    named = re.search(r"traceback in (\S+\.traceback\.txt)", text)
    if named and os.path.exists(named.group(1)):
        text += Path(named.group(1)).read_text()
    return "SIGABRT" in text or "status -6" in text or "exitcode: -6" in text


def one(kind: str, folder: Path) -> dict[str, Any]:
    started = time.monotonic()
    try:
        if kind == DDP:
            results = folder / "results"
            results.mkdir(parents=True, exist_ok=True)
            torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
            report = preflight.run_command([torchrun, "--nproc-per-node", "2", "tests/fakegpu/ddp_preflight_job.py",
                                            str(results)], "24GiB", devices=2, out=folder / "out", advise=False,
                                           capture_output=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
        else:
            report = preflight.run(workloads.measure, kind, "cuda", card="h100", advise=False, out=folder / "out")
        outcome = "fits" if report.fits else "does not fit"
        message = ""
    except preflight.PreflightError as exc:
        message = str(exc)
        outcome = "abort" if aborted(message) else "failed"
    return {"kind": kind, "outcome": outcome, "seconds": round(time.monotonic() - started, 1), "message": message}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time (default 1)")
    parser.add_argument("--kinds", default=",".join(plan()), help=f"comma-separated, from {','.join(plan())}")
    args = parser.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    unknown = sorted(set(kinds) - set(plan()))
    if unknown or args.runs < 1 or args.jobs < 1:
        parser.error(f"unknown kinds {unknown}" if unknown else "--runs and --jobs must be 1 or more")
    os.chdir(ROOT)
    counts = {"fits": 0, "abort": 0, "failed": 0, "does not fit": 0}
    failures: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="preflight-exit-loop-") as tmp, ThreadPoolExecutor(args.jobs) as pool:
        jobs = [pool.submit(one, kinds[i % len(kinds)], Path(tmp) / f"run{i}") for i in range(args.runs)]
        for i, job in enumerate(jobs):
            result = job.result()
            counts[result["outcome"]] += 1
            print(f"run {i + 1}/{args.runs} {result['kind']}: {result['outcome']} ({result['seconds']} s)", flush=True)
            if result["outcome"] != "fits":
                failures.append(result)
    print(json.dumps({"runs": args.runs, "jobs": args.jobs, "fits": counts["fits"], "aborts": counts["abort"],
                      "other_failures": counts["failed"] + counts["does not fit"],
                      "first_failures": [f"{f['kind']}: {f['outcome']}: {f['message'][:400]}" for f in failures[:5]]}))
    return 0 if counts["fits"] == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
