"""Under preflight the fake device holds no data (fakegpu/cudart/contents.c, Note [Device memory holds no data]).

A value a kernel computed reads zero, so GradScaler's found_inf reads "no inf" and the step that allocates
Adam's state is taken, as on a real card. A copy to the device takes no host memory. A run killed by
SIGKILL is reported as that.
"""
from __future__ import annotations

import sys

import pytest

from tests.fakegpu import device_reads_job as job
from torchmem import preflight

GiB = 1 << 30


def test_a_gradscaler_fp16_step_allocates_adams_state_on_its_first_step():
    report = preflight.run(job.gradscaler_first_step, card="h100", advise=False)
    assert report.value["moments"] == ["exp_avg", "exp_avg_sq"]
    # The weight, its gradient and Adam's two moments: at least four times the weight.
    assert report.value["allocated"] >= 4 * report.value["weight_bytes"]


def test_a_computed_value_reads_zero_so_isfinite_all_reads_false():
    value = preflight.run(job.isfinite_read, card="h100", advise=False).value
    assert value == {"all_finite": False, "norm": 0.0}  # the documented limit (docs/preflight.md)


def test_a_gib_copied_to_the_device_takes_no_host_memory():
    value = preflight.run(job.copy_to_device, 1, card="h100", advise=False).value
    assert value["device_bytes"] == GiB
    # The host copy (1 GiB) is freed after the move; the device's copy adds nothing resident.
    assert value["after_kib"] < value["before_kib"] - 900 * 1024


def test_a_run_killed_by_sigkill_says_so_in_one_line(tmp_path):
    script = tmp_path / "killed.py"
    script.write_text("import os, signal, torch\nx = torch.empty(1 << 20, device='cuda')\n"
                      "os.kill(os.getpid(), signal.SIGKILL)\n")
    with pytest.raises(preflight.PreflightError) as failed:
        preflight.run_command([sys.executable, str(script)], "h100", out=tmp_path / "out", advise=False)
    message = str(failed.value)
    assert "was killed by SIGKILL (exit status -9)" in message and "host memory" in message
    assert "\n" not in message
