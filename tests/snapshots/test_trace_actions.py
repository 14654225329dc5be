"""Trace actions that change no memory (docs/snapshots.md, Trace actions): every command reads them.

A small snapshot shaped like torch 2.14.1's: an `annotate` entry
(torch.cuda.memory._annotate_tensor), `user_metadata` on its entries
(_set_memory_metadata), and an action no release writes. Without a size that
action is a one-line warning; with one it is a refusal naming the entry.
Saved with pickle protocol 5. The fake-GPU tier records the real thing
(tests/fakegpu/test_annotated_snapshot.py).
"""
from __future__ import annotations

import json
import pickle

import pytest

from tests.support.subprocess_runner import ok, torchmem_here
from torchmem.replay import replay
from torchmem.formats.snapshot_format import load, snapshot_from_replay

MiB = 1 << 20
BASE = 1 << 40


def _e(action: str, addr: int, size: int, time_us: int, meta: str = "") -> dict:
    return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": time_us, "frames": [],
            "user_metadata": meta, "compile_context": "N/A", "pool_id": (0, 0)}


def annotated(marker: dict | None = None) -> dict:
    """A 20 MiB segment; a 3 MiB block kept and annotated twice; a 4 MiB block made and freed under metadata."""
    trace = [
        _e("segment_alloc", BASE, 20 * MiB, 10),
        _e("alloc", BASE, 3 * MiB, 11),
        _e("annotate", BASE, 3 * MiB, 12, "packed for backward"),
        _e("alloc", BASE + 3 * MiB, 4 * MiB, 13, "phase=fwd"),
        _e("free_requested", BASE + 3 * MiB, 4 * MiB, 14, "phase=fwd"),
        _e("free_completed", BASE + 3 * MiB, 4 * MiB, 15, "phase=fwd"),
        _e("annotate", BASE, 3 * MiB, 16, "still live"),
    ]
    if marker is not None:
        trace.insert(3, marker)
    segments = [{"address": BASE, "total_size": 20 * MiB, "stream": 0, "segment_type": "large",
                 "allocated_size": 3 * MiB, "active_size": 3 * MiB, "requested_size": 3 * MiB, "device": 0,
                 "is_expandable": False,
                 "blocks": [{"address": BASE, "size": 3 * MiB, "requested_size": 3 * MiB, "state": "active_allocated",
                             "frames": []},
                            {"address": BASE + 3 * MiB, "size": 17 * MiB, "requested_size": 0, "state": "inactive",
                             "frames": []}]}]
    return {"segments": segments, "device_traces": [trace], "allocator_settings": {}}


def write(tmp_path, snap: dict, name: str = "snap.pickle") -> str:
    path = tmp_path / name
    path.write_bytes(pickle.dumps(snap, protocol=5))
    return str(path)


MARKER = {"action": "step_marker", "stream": 0, "time_us": 12, "frames": []}  # no size: changes no memory


def test_annotated_replay_is_exact(tmp_path):
    path = write(tmp_path, annotated(MARKER))
    result = replay(path, history=100)
    out = snapshot_from_replay(result)["device_traces"][0]
    memory = [(e["action"], e["addr"], e["size"]) for e in annotated()["device_traces"][0]
              if e["action"] not in ("annotate", "free_requested")]
    assert [(e["action"], e["addr"], e["size"]) for e in out if e["action"] != "free_requested"] == memory
    assert result.peak_allocated == 7 * MiB and result.peak_reserved == 20 * MiB
    assert any("2 annotations and 1 user metadata value carried through" in n for n in result.notes), result.notes


@pytest.mark.parametrize("command", ["replay", "advise", "stats", "plot", "viz"])
def test_every_command_reads_annotations_and_warns_once_of_an_unknown_action(tmp_path, command):
    path = write(tmp_path, annotated(MARKER))
    extra = {"plot": ["-o", str(tmp_path / "p.png")], "viz": ["-o", str(tmp_path / "v.html")]}.get(command, [])
    proc = ok(torchmem_here(command, path, *extra))
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("warning:")]
    assert warnings == [f"warning: {path}: device 0 entry 3: unknown action 'step_marker' carried through: "
                        "it has no size, so it changes no memory"], proc.stderr
    if command == "stats":
        assert "annotations                  2" in proc.stdout
        assert "entry 2 (0.000002 s in): 'packed for backward' on the 3.0 MiB block" in proc.stdout
        assert "entry 7 (0.000006 s in): 'still live'" in proc.stdout
        assert "'phase=fwd' on 3 entries, first entry 4" in proc.stdout
    if command == "viz":
        page = (tmp_path / "v.html").read_text()
        assert page.count('class="annotation"') == 2
        assert "annotation at trace entry 2: packed for backward" in page and "<td>still live</td>" in page


def test_stats_json_keeps_annotations_and_metadata(tmp_path):
    data = json.loads(ok(torchmem_here("stats", write(tmp_path, annotated()), "--json")).stdout)
    assert [(a["entry"], a["text"], a["addr"], a["size"]) for a in data["annotations"]] == [
        (2, "packed for backward", BASE, 3 * MiB), (6, "still live", BASE, 3 * MiB)]
    assert data["user_metadata"] == [{"text": "phase=fwd", "entries": 3, "first_entry": 3}]
    assert data["allocated"] == 3 * MiB  # the annotations add nothing


def test_load_keeps_annotate_entries(tmp_path):
    snap = load(write(tmp_path, annotated()))
    assert [e["user_metadata"] for e in snap["device_traces"][0] if e["action"] == "annotate"] == [
        "packed for backward", "still live"]


@pytest.mark.parametrize("marker, what", [
    ({"action": "segment_grow", "addr": BASE, "size": 2 * MiB, "stream": 0}, "with a size of 2097152"),
    ({"action": "step_marker", "size": "big"}, "with a size of 'big'"),
    ({"action": ["alloc"], "size": 0}, "that is not a name"),
])
@pytest.mark.parametrize("command", ["replay", "advise", "stats", "plot", "viz"])
def test_an_unknown_action_that_may_change_memory_is_refused(tmp_path, command, marker, what):
    path = write(tmp_path, annotated(marker))
    extra = {"plot": ["-o", str(tmp_path / "p.png")], "viz": ["-o", str(tmp_path / "v.html")]}.get(command, [])
    proc = torchmem_here(command, path, *extra)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"{path}: device 0 entry 3: unknown action " in lines[0] and what in lines[0], lines[0]
    assert "it may change memory" in lines[0]
