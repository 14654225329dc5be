"""Every command agrees: one device rule, one event numbering, sizes with
their units. Each test runs the command line (its main, in this process) on a
snapshot of two devices built here: device 0 with the longer history and no
OOM, device 1 with an OOM. Expected values come from the snapshot dict
itself (which device holds the oom entry, its index, the segments' sizes).
"""
from __future__ import annotations

import json
import pickle
import re
import subprocess

import pytest

from tests.support.replay_recording import GiB, random_workload, record

from tests.support.subprocess_runner import ROOT, torchmem_here


@pytest.fixture(scope="module")
def two_devices(tmp_path_factory):
    a = record(random_workload(11, 4000), "", capacity=8 * GiB, device=0)
    b = record(random_workload(12, 3000, large=0.6), "", capacity=2 * GiB, device=1)
    snap = {"segments": a["segments"] + b["segments"],
            "device_traces": [a["device_traces"][0], b["device_traces"][1]],
            "allocator_settings": a["allocator_settings"]}
    traces = snap["device_traces"]
    assert not any(e["action"] == "oom" for e in traces[0])
    ooms = [i for i, e in enumerate(traces[1]) if e["action"] == "oom"]
    assert len(ooms) == 1 and len(traces[0]) > len(traces[1])  # the rule matters: the OOM is not the longest history
    path = tmp_path_factory.mktemp("two") / "two_devices.pickle"
    path.write_bytes(pickle.dumps(snap))
    return {"path": str(path), "snap": snap, "oom_entry": ooms[0], "entries": len(traces[1])}


def cli(*args: str, cwd: str | None = None) -> subprocess.CompletedProcess:
    return torchmem_here(*args, cwd=cwd or ROOT)


def ok(*args: str, cwd: str | None = None) -> subprocess.CompletedProcess:
    proc = cli(*args, cwd=cwd)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


def reserved_on(snap: dict, device: int) -> int:
    return sum(s["total_size"] for s in snap["segments"] if s["device"] == device)


WITH_OOM = "device 1 (the one with the OOM)"
GIVEN_0 = "device 0 (given)"


def test_every_command_takes_the_device_with_the_oom_and_says_so(two_devices, tmp_path):
    p = two_devices["path"]
    assert f"Replayed {WITH_OOM}" in ok("replay", p, "--no-progress").stdout
    assert f"on {WITH_OOM}" in ok("advise", p, "--no-progress", "--no-stitch").stdout
    plot = ok("plot", p, "-o", str(tmp_path / "t.png"), "--no-progress")
    assert WITH_OOM in plot.stderr
    seg = ok("plot", p, "-o", str(tmp_path / "s.png"), "--segments", "--json")
    assert json.loads(seg.stdout)["device"] == 1
    viz = ok("viz", p, "-o", str(tmp_path / "v.html"), "--no-progress")
    assert WITH_OOM in viz.stderr
    page = (tmp_path / "v.html").read_text()
    assert "Device 1 (the one with the OOM)" in page and 'id="ooms"' in page
    stats = json.loads(ok("stats", p, "--json").stdout)
    assert stats["device"] == 1 and stats["reserved"] == reserved_on(two_devices["snap"], 1)
    assert WITH_OOM in ok("stats", p).stdout
    ranks = json.loads(ok("ranks", p, "--json", "--no-progress").stdout)["ranks"][0]
    assert ranks["device"] == 1 and ranks["oom"] is not None
    assert WITH_OOM in ok("ranks", p, "--no-progress").stdout


def test_every_command_takes_device_n_when_given(two_devices, tmp_path):
    p = two_devices["path"]
    assert f"Replayed {GIVEN_0}" in ok("replay", p, "--device", "0", "--no-progress").stdout
    assert f"on {GIVEN_0}" in ok("advise", p, "--device", "0", "--no-progress", "--no-stitch").stdout
    plot = json.loads(ok("plot", p, "-o", str(tmp_path / "t.png"), "--device", "0", "--json").stdout)
    assert plot["device"] == 0 and plot["ooms"] == []
    viz = ok("viz", p, "-o", str(tmp_path / "v.html"), "--device", "0", "--no-progress")
    assert GIVEN_0 in viz.stderr and 'id="ooms"' not in (tmp_path / "v.html").read_text()
    stats = json.loads(ok("stats", p, "--json", "--device", "0").stdout)
    assert stats["device"] == 0 and stats["reserved"] == reserved_on(two_devices["snap"], 0)
    ranks = json.loads(ok("ranks", p, "--json", "--device", "0", "--no-progress").stdout)["ranks"][0]
    assert ranks["device"] == 0 and ranks["oom"] is None
    for command in (["stats", p], ["viz", p, "-o", str(tmp_path / "x.html")], ["plot", p, "-o", str(tmp_path / "x.png")],
                    ["ranks", p]):
        proc = cli(*command, "--device", "5")
        assert proc.returncode != 0 and "no device 5" in proc.stderr, (command, proc.stderr)


def test_stats_no_longer_adds_the_devices_together(two_devices):
    stats = json.loads(ok("stats", two_devices["path"], "--json").stdout)
    both = reserved_on(two_devices["snap"], 0) + reserved_on(two_devices["snap"], 1)
    assert stats["reserved"] != both


def test_one_oom_is_the_same_trace_entry_in_every_output(two_devices, tmp_path):
    p, e, n = two_devices["path"], two_devices["oom_entry"], two_devices["entries"]
    assert f"Out of memory at trace entry {e:,}:" in ok("replay", p, "--no-progress").stdout
    assert json.loads(ok("replay", p, "--json").stdout)["oom"]["entry"] == e
    assert "index" not in json.loads(ok("replay", p, "--json").stdout)["oom"]
    assert [o["entry"] for o in json.loads(ok("plot", p, "-o", str(tmp_path / "t.png"), "--json").stdout)["ooms"]] == [e]
    ok("viz", p, "-o", str(tmp_path / "v.html"), "--no-progress")
    page = (tmp_path / "v.html").read_text()
    oom_table = page[page.index('id="ooms"'):]
    assert re.search(rf'<td class="n">{e:,}</td>', oom_table)
    assert f"OOM at trace entry {e:,}" in page
    assert json.loads(ok("ranks", p, "--json", "--no-progress").stdout)["ranks"][0]["oom"]["entry"] == e
    assert f"trace entry {e:,} of {n:,}" in ok("ranks", p, "--no-progress").stdout


def test_replay_plot_and_torchmem_plot_share_the_trace_entry_axis(two_devices, tmp_path):
    """The x of the OOM in `replay --plot` is the same trace entry as in `torchmem plot`."""
    from torchmem import replay as sim
    from torchmem.viz.replays import entry_axis

    result = sim.replay(two_devices["path"])
    xs, label = entry_axis(result, [result.oom["index"]])
    assert int(xs[0]) == two_devices["oom_entry"] and label.startswith("trace entry")
    ok("replay", two_devices["path"], "--plot", str(tmp_path / "r.png"), "--no-progress")
    assert (tmp_path / "r.png").stat().st_size > 0


def test_small_figures_are_printed_in_a_unit_that_fits(tmp_path):
    """A run of a few MiB reads in MiB, not as '0.01 GiB'."""
    trace = tmp_path / "small.jsonl"
    trace.write_text("".join(f'{{"op": "alloc", "id": {i}, "size": {3 << 20}, "stream": 0}}\n' for i in range(4)))
    out = ok("replay", str(trace), "--capacity", "16MiB", "--no-progress").stdout
    assert not re.search(r"\b0\.\d\d [KMGT]iB", out)  # no figure shown as a fraction of a larger unit
    assert "request for 3.00 MiB" in out
    assert " GiB" not in out.split("device free")[0]  # every figure of this run is below 1 GiB
    advise = ok("advise", str(trace), "--capacity", "16MiB", "--no-progress").stdout
    assert "GiB" not in advise and "MiB" in advise


def test_a_size_without_a_unit_is_refused_and_decimal_units_are_named(two_devices):
    proc = cli("replay", two_devices["path"], "--capacity", "8")
    assert proc.returncode == 2 and "no unit" in proc.stderr and "8GiB" in proc.stderr and "8GB" in proc.stderr
    out = ok("replay", two_devices["path"], "--capacity", "80GB", "--no-progress").stdout
    assert "80GB = 80,000,000,000 bytes" in out and "80GiB would be 85,899,345,920" in out
    assert "would be" not in ok("replay", two_devices["path"], "--capacity", "80GiB", "--no-progress").stdout
