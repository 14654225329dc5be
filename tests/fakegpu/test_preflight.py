"""`torchmem preflight` on the fake GPU: the report, its errors, and the worked example of docs/preflight.md."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.fakegpu.helpers import GiB, ROOT
from tests.fakegpu.preflight_workloads import allocate
from torchmem import preflight
from torchmem.replay.advise import as_pytorch_setting

EXAMPLE = [sys.executable, "examples/preflight_batch32.py", "--batch", "32"]


def cli(*args: str, cwd: str = ROOT) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "torchmem", "preflight", *args], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=600)


def test_the_example_runs_out_of_memory_at_batch_32_and_the_setting_advise_finds_fits(tmp_path):
    first = cli("--card", "80GiB", "--out", str(tmp_path / "first"), "--json", "--", *EXAMPLE)
    assert first.returncode == preflight.OOM_EXIT, first.stderr[-3000:]
    report = json.loads(first.stdout)
    assert report["fits"] is False and report["card"]["memory"] == 80 * GiB
    [device] = report["devices"]
    assert device["oom"]["where"].startswith("examples/preflight_batch32.py:") and "in train" in device["oom"]["where"]
    assert device["peak_reserved"] <= 80 * GiB and device["num_ooms"] >= 1
    assert os.path.isfile(device["snapshot"])
    rows = report["advice"]
    own = next(r for r in rows if r["recorded"])
    assert not own["completes"] and own["min_capacity"] > 80 * GiB  # the replay agrees with the run: it does not fit
    best = next(r for r in rows if r["policy"] == "native" and r["completes"])
    assert any("garbage" in w for w in report["warnings"])

    second = preflight.run_command(EXAMPLE, "80GiB", conf=as_pytorch_setting(best["conf"]), out=tmp_path / "second",
                                   advise=False, capture_output=True, env=dict(os.environ, PYTHONPATH=ROOT))
    assert second.fits, second.captured[1][-3000:]
    [confirmed] = second.devices
    assert confirmed.oom is None and confirmed.num_ooms == 0
    # What advise predicted from the first run's snapshot is what PyTorch's own allocator then did.
    assert confirmed.peak_reserved == best["peak_reserved"]
    assert "trained 10 steps at batch 32" in second.captured[0]


def test_the_report_names_the_line_that_ran_out_and_the_next_step(tmp_path):
    script = tmp_path / "big.py"
    script.write_text("import torch\nkeep = torch.empty(3 << 30, dtype=torch.uint8, device='cuda')\n"
                      "def step():\n    return torch.empty(2 << 30, dtype=torch.uint8, device='cuda')\nstep()\n")
    proc = cli("--card", "4GiB", "--out", str(tmp_path / "out"), "--", sys.executable, str(script))
    assert proc.returncode == preflight.OOM_EXIT, proc.stderr[-3000:]
    assert f"OUT OF MEMORY at {script}:4 (in step): tried to allocate 2.00 GiB" in proc.stdout
    assert "peak allocated 3.00 GiB" in proc.stdout
    assert "Confirm a larger card: torchmem preflight --card 5GiB --" in proc.stdout  # 3 GiB + 2 GiB at once
    assert "Traceback" not in proc.stdout + proc.stderr
    assert "OutOfMemoryError" in (tmp_path / "out" / next(p for p in os.listdir(tmp_path / "out")
                                                        if p.endswith(".traceback.txt"))).read_text()


def test_a_script_that_fails_for_its_own_reasons_gives_its_status_and_one_line(tmp_path):
    script = tmp_path / "bad.py"
    script.write_text("import torch\nx = torch.ones(4, device='cuda')\nraise ValueError('the data folder is empty')\n")
    proc = cli("--card", "24GiB", "--", sys.executable, str(script))
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    [line] = proc.stderr.strip().splitlines()[-1:]
    assert line.startswith("torchmem preflight: error: `") and "failed: ValueError: the data folder is empty" in line
    assert f"({script}:3 (in <module>))" in line

    exits = tmp_path / "exits.py"
    exits.write_text("import sys, torch\nx = torch.ones(4, device='cuda')\nsys.exit(7)\n")
    proc = cli("--", sys.executable, str(exits))
    assert proc.returncode == 7
    assert proc.stderr.strip().splitlines()[-1].endswith("exited with status 7")


def test_the_python_form_returns_the_functions_value_and_each_devices_peaks():
    report = preflight.run(allocate, 5 << 20, card="h100", advise=False)
    assert report.fits and report.value == {"allocated": 5 << 20, "is_fake": True}
    [device] = report.devices
    assert device.peak_allocated == 5 << 20 and device.peak_reserved == 20 << 20  # 1-10 MiB: a 20 MiB segment
    assert report.to_json()["devices"][0]["peak_allocated"] == 5 << 20

    tight = preflight.run(allocate, 300 << 20, card="256MiB")
    assert not tight.fits and tight.value is None and tight.ooms[0].oom["tried"] == "300.00 MiB"
    assert tight.advice and all(not row.completes for row in tight.advice)


def test_a_named_card_takes_its_outside_memory_before_the_script_and_the_verdict_counts_it():
    """On an L4, a request that fits total_memory but not beside the CUDA context and libraries runs out of memory;
    the same request on a bare size of the same total (nothing assumed outside the allocator) fits."""
    from torchmem.fakegpu.cards import CARDS

    MiB = 1 << 20
    l4 = CARDS["l4"]
    fits = (l4.usable - 64 * MiB) // (2 * MiB) * (2 * MiB)
    report = preflight.run(allocate, fits, card="l4", advise=False)
    assert report.fits
    [device] = report.devices
    assert (device.total, device.outside, device.peak_reserved) == (l4.memory, l4.outside, fits)
    assert device.verdict.headroom == l4.memory - l4.outside - fits

    over = (l4.usable + 100 * MiB) // (2 * MiB) * (2 * MiB)
    assert over <= l4.memory  # the request alone fits the card's total_memory
    report = preflight.run(allocate, over, card="l4", advise=False)
    assert not report.fits and report.value is None
    [device] = report.ooms
    assert device.outside == l4.outside and device.oom["tried"] == f"{over / (1 << 30):.2f} GiB"
    assert "The run does not fit" in report.format()

    bare = preflight.run(allocate, over, card=f"{l4.memory}B", advise=False)
    assert bare.fits and bare.devices[0].outside == 0


def test_with_json_the_scripts_own_output_goes_to_stderr(tmp_path):
    script = "import torch; print('the script speaks'); torch.empty(1, device='cuda')"
    proc = cli("--no-advise", "--json", "--out", str(tmp_path), "--", sys.executable, "-c", script)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout)["fits"] is True
    assert "the script speaks" in proc.stderr


RANK_WITH_A_CHILD = """
import subprocess, sys, torch
x = torch.ones(1 << 20, device="cuda")  # 4 MiB: the rank's own
subprocess.run([sys.executable, "-c", "import torch; torch.ones(1 << 10, device='cuda')"], check=True)
"""


def test_a_child_of_a_rank_does_not_replace_the_ranks_report(tmp_path):
    """A process the rank spawns inherits RANK (inductor's compile workers do); it reports under a name of its own
    (Note [One report per rank])."""
    report = preflight.run_command([sys.executable, "-c", RANK_WITH_A_CHILD], "h100", out=tmp_path, advise=False,
                                   capture_output=True, env=dict(os.environ, RANK="3"))
    assert [p["name"] for p in report.processes][0] == "rank3"  # the rank's own report first
    by_name = {d.process: d.peak_allocated for d in report.devices}
    children = [n for n in by_name if n.startswith("rank3-pid")]
    assert by_name["rank3"] == 4 << 20 and len(children) == 1 and by_name[children[0]] == 4 << 10, by_name


def test_a_call_the_fake_gpu_does_not_implement_is_named_as_its_limit(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHMEM_FAKEGPU_LOG", raising=False)  # then preflight logs into its out folder
    script = tmp_path / "ipc.py"
    script.write_text("import torch\nfrom torch.multiprocessing.reductions import reduce_tensor\n"
                      "reduce_tensor(torch.ones(4, device='cuda'))\n")
    proc = cli("--card", "h100", "--out", str(tmp_path / "out"), "--", sys.executable, str(script))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert "Error: CUDA error: operation not supported (torchmem fake GPU)" in line  # Accelerator- or RuntimeError
    assert "the fake GPU does not implement cudaIpcGetMemHandle: a limit of the fake GPU, not of the script" in line
    assert "unimplemented cudaIpcGetMemHandle" in (tmp_path / "out" / "fakegpu.log").read_text()
