"""torchmem under torchrun on CPU: a DDP job (gloo) whose rank 1 runs out of memory.

The job (tests/support/ddp_oom_job.py) runs two ranks, each with torchmem installed
and dump_on_oom on; rank 1 has a 40 MiB capacity and runs out of memory at
its fourth step. Checked: torchmem works in both ranks (they train three
steps together), rank 1's snapshot is written and named in its error, the
job fails as torchrun fails a job (non-zero status, rank 0 stopped, no
hang), and `torchmem replay` reproduces rank 1's OOM from the file alone.
"""
from __future__ import annotations

import glob
import json
import os
import pickle
import signal
import subprocess
import sys
import time

from tests.support.subprocess_runner import ROOT, ok, run_torchmem

JOB = os.path.join(ROOT, "tests", "support", "ddp_oom_job.py")
LIMIT_S = 60


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    env.pop("TORCHMEM_ALLOC_CONF", None)
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return env


def _run_job(out: str) -> tuple[subprocess.CompletedProcess, float]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", JOB, "--out", out]
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(), cwd=out,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=LIMIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # torchrun and both ranks
        stdout, stderr = proc.communicate()
        raise AssertionError(f"the job did not end within {LIMIT_S} s (a hang?)\n{stdout[-2000:]}\n{stderr[-4000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr), time.monotonic() - start


def test_rank1_oom_under_torchrun_is_dumped_and_replays(tmp_path):
    out = str(tmp_path)
    proc, seconds = _run_job(out)
    log = proc.stdout + proc.stderr
    assert seconds < LIMIT_S

    # Both ranks trained together with torchmem until rank 1 ran out of memory.
    for rank in (0, 1):
        for step in (0, 1, 2):
            assert f"rank {rank} step {step} reserved" in proc.stdout, log[-4000:]
    assert "rank 1 step 3" not in proc.stdout

    # The job failed the way torchrun fails a job.
    assert proc.returncode != 0, log[-4000:]
    assert "ChildFailedError" in proc.stderr, proc.stderr[-4000:]

    # Rank 1's snapshot (and only it) was written, and its error names it.
    files = glob.glob(os.path.join(out, "oom_rank*.pickle"))
    assert len(files) == 1 and os.path.basename(files[0]).startswith("oom_rank1_pid"), files
    path = files[0]
    assert "torch.OutOfMemoryError: cpu out of memory" in proc.stderr
    assert f"wrote a snapshot of this out-of-memory error to {path} (rank 1)" in proc.stderr
    assert f"torchmem replay {path}" in proc.stderr and f"torchmem advise {path}" in proc.stderr
    with open(path, "rb") as f:
        snap = pickle.load(f)
    assert snap["torchmem_oom"]["rank"] == 1 and snap["torchmem_oom"]["world_size"] == 2
    oom = [e for e in snap["device_traces"][0] if e["action"] == "oom"]
    assert len(oom) == 1 and oom[0]["size"] == 2048 * 1024 * 4  # the ReLU's output at the batch of 2048
    assert 0 <= oom[0]["device_free"] < 40 * 2**20

    # `torchmem replay FILE` reproduces rank 1's OOM from the file alone.
    replay = ok(run_torchmem("replay", path, "--json", cwd=out, timeout=120, base_env=_env()))
    result = json.loads(replay.stdout)
    assert result["capacity_source"] == "oom"
    assert result["recorded_oom"]["reproduced"], result["recorded_oom"]
    assert result["recorded_oom"]["replay_reserved"] == result["recorded_oom"]["reserved"]
    assert result["exact"]
    assert result["capacity"] == 40 * 2**20  # reserved + device_free: rank 1's capacity
