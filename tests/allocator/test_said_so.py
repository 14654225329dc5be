"""Nothing silently off: what used to be dropped or ignored without a word
now says so. Each case runs the user's path (torchmem's API in a fresh
interpreter, or the command line)."""
from __future__ import annotations

import json
import os
import subprocess

from tests.support.subprocess_runner import ok, run_python, torchmem_here


def run(code: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return ok(run_python(code, env=env))


def test_a_second_install_with_other_settings_says_the_live_tensors_leave_the_figures():
    proc = run("""
import json, warnings, torch, torchmem
torchmem.install()
kept = torch.empty(1 << 20, dtype=torch.uint8)          # 1 MiB, live across the second install
before = torchmem.memory_allocated()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    torchmem.install(conf="max_split_size_mb:64")
print(json.dumps({"before": before, "after": torchmem.memory_allocated(), "messages": [str(w.message) for w in caught]}))
""")
    r = json.loads(proc.stdout.splitlines()[-1])
    assert r["before"] >= 1 << 20 and r["after"] < 1 << 20  # the tensor left the figures ...
    [message] = [m for m in r["messages"] if "installed again" in m]  # ... and a warning says so
    assert f"{r['before']:,} bytes" in message and "memory_allocated()" in message


def test_a_second_install_with_nothing_live_says_nothing():
    proc = run("""
import json, warnings, torchmem
torchmem.install()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    torchmem.install(conf="max_split_size_mb:64")
print(json.dumps([str(w.message) for w in caught if "installed again" in str(w.message)]))
""")
    assert json.loads(proc.stdout.splitlines()[-1]) == []


def test_statistics_before_install_warn_that_torchmem_is_not_installed():
    proc = run("""
import json, warnings, torchmem
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    stats = torchmem.memory_stats()
    allocated = torchmem.memory_allocated()
print(json.dumps({"stats": stats, "allocated": allocated,
                  "warnings": [(w.category.__name__, str(w.message), os.path.basename(w.filename)) for w in caught]}))
""".replace("import json,", "import os, json,"))
    r = json.loads(proc.stdout.splitlines()[-1])
    assert r["stats"] == {} and r["allocated"] == 0
    assert [w[0] for w in r["warnings"]] == ["NotInstalledWarning", "NotInstalledWarning"]
    assert "torchmem.memory_stats(): torchmem is not installed" in r["warnings"][0][1]
    assert "torchmem.memory_allocated()" in r["warnings"][1][1] and "install()" in r["warnings"][1][1]
    assert r["warnings"][0][2] == "<string>"  # the warning points at the caller's line, not at torchmem


def test_skip_bad_events_skips_bad_lines_and_counts_exactly_what_it_skipped(tmp_path):
    trace = tmp_path / "bad.jsonl"
    trace.write_text(
        '{"op": "alloc", "id": 1, "size": 1024, "stream": 0}\n'
        '{"op": "free", "id": 7}\n'                          # an id never allocated: refused by the replay
        '{"op": "allocate", "id": 2, "size": 1024}\n'        # a bad op: the line cannot be used
        '{"op": "alloc", "id": 3, "size": -5}\n'             # a negative size: the line cannot be used
        '{"op": "alloc", "id": 4, "size": 2048, "stream": 0}\n'
        '{"op": "free", "id": 1}\n')
    args = ["replay", str(trace), "--skip-bad-events", "--no-progress"]
    proc = ok(torchmem_here(*args))
    assert "skipped 3 bad events: 2 trace lines that could not be used (first: line 3: unknown op 'allocate'" in proc.stderr
    assert "1 event refused" in proc.stderr
    result = json.loads(torchmem_here(*args, "--json").stdout)
    assert result["completed"] and result["skipped_events"] == 3
    assert result["peak_allocated"] == 1024 + 2048  # ids 1 and 4 live together: both replayed
    plain = torchmem_here(*args[:-2], "--no-progress")
    # without the flag: the first line that cannot be read stops it (lines are read before they are replayed)
    assert plain.returncode == 1 and "line 3: unknown op 'allocate'" in plain.stderr
