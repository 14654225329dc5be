"""`torchmem ranks`: several snapshots (one per rank) side by side.

The figures of each row are checked against snapshots whose contents are
known exactly (built here), and against two snapshots written by torchmem
on CPU in subprocesses: rank 0's at the end of a run, rank 1's by
dump_on_oom at its OOM.
"""
from __future__ import annotations

import json
import pickle

import pytest

from torchmem.viz.ranks import format_rows, is_library_frame, rank_row, site_of, top_sites

from tests.support.subprocess_runner import ok, run_python, torchmem_here
MiB = 1 << 20

USER = {"filename": "/home/me/project/train.py", "line": 42, "name": "forward"}
LOOP = {"filename": "/home/me/project/train.py", "line": 90, "name": "main"}
TORCH = {"filename": "/usr/lib/python3.11/site-packages/torch/nn/modules/linear.py", "line": 125, "name": "forward"}
CPP = {"filename": "/pytorch/c10/cuda/CUDACachingAllocator.cpp", "line": 1, "name": "malloc"}


def block(size, state="active_allocated", requested=None, frames=()):
    return {"address": 0, "size": size, "requested_size": requested if requested is not None else size,
            "state": state, "frames": list(frames)}


def segment(blocks, device=0):
    total = sum(b["size"] for b in blocks)
    return {"device": device, "address": 0, "total_size": total, "stream": 0, "segment_type": "large", "blocks": blocks}


def snapshot(segments, trace=(), meta=None):
    snap = {"segments": segments, "device_traces": [list(trace)], "allocator_settings": {}}
    if meta is not None:
        snap["torchmem_oom"] = meta
    return snap


def test_row_figures():
    snap = snapshot(
        [segment([block(8 * MiB, requested=7 * MiB, frames=[CPP, TORCH, USER, LOOP]),
                  block(4 * MiB, state="inactive"),
                  block(2 * MiB, frames=[TORCH, LOOP])]),
         segment([block(6 * MiB, frames=[USER]), block(2 * MiB, state="inactive")])],
        trace=[{"action": "alloc", "addr": 1, "size": 1, "stream": 0, "time_us": 1},
               {"action": "oom", "size": 3 * MiB, "device_free": 1 * MiB, "stream": 0, "time_us": 1_700_000_000_000_000}],
        meta={"rank": 3},
    )
    row = rank_row(snap, "whatever.pickle", position=0)
    assert row["rank"] == 3 and row["rank_from"] == "snapshot"
    assert row["allocated"] == 15 * MiB           # requested bytes of live blocks
    assert row["reserved"] == 22 * MiB
    assert row["reserved_but_free"] == 6 * MiB     # free blocks in segments
    assert row["largest_free_block"] == 4 * MiB
    assert row["oom"] == {"size": 3 * MiB, "device_free": MiB, "time_us": 1_700_000_000_000_000, "entry": 1, "entries": 2}
    sites = row["top_sites"]
    assert [(s["site"], s["bytes"], s["blocks"]) for s in sites] == [
        ("train.py:42 forward", 13 * MiB, 2), ("train.py:90 main", 2 * MiB, 1)]
    text = format_rows([row])
    assert "train.py:42 forward (13.0 MiB)" in text
    assert "2023-11-1" in text and "trace entry 1 of 2" in text  # the oom is device_traces[0][1], as replay numbers it
    assert "1 of 1 rank ran out of memory: 3." in text


def test_sites():
    assert site_of([CPP, TORCH, USER]) == USER
    assert site_of([TORCH, CPP]) == TORCH  # all library: the innermost Python frame
    assert site_of([]) is None
    assert not is_library_frame("<string>") and is_library_frame("<frozen runpy>")
    assert is_library_frame("/root/.pyenv/versions/3.11.7/lib/python3.11/threading.py")
    assert is_library_frame("/work/x/torchmem/runtime/oom/dump.py") and is_library_frame("/work/x/torchmem/runtime/snapshot.py")
    assert not is_library_frame("/home/me/torchmem/examples/oom_to_fix.py")  # a checkout named torchmem
    blocks = [block(MiB, frames=[USER]), block(MiB, frames=[])]
    assert [s["site"] for s in top_sites([segment(blocks)])] == ["(no stack recorded)", "train.py:42 forward"]


def test_rank_from_name_then_position():
    snap = snapshot([segment([block(MiB)])])
    assert rank_row(snap, "/x/oom_rank7_pid1.pickle", 0)["rank"] == 7
    row = rank_row(snap, "/x/snapshot.pickle", 4)
    assert row["rank"] == 4 and row["rank_from"] == "position"


def _cpu_run(tmp_path, rank: int, code: str) -> None:
    ok(run_python(code, {"RANK": str(rank)}, 120, cwd=str(tmp_path), drop_env=["TORCHMEM_ALLOC_CONF"]))


def test_cli_on_snapshots_written_by_two_ranks(tmp_path):
    _cpu_run(tmp_path, 0, """
        import torch, torchmem
        torchmem.install(conf="capacity:64MiB")
        torchmem.record_memory_history()
        def weights():
            out = []
            for _ in range(3):
                out.append(torch.empty(4 << 20, dtype=torch.uint8))
            return out
        w = weights()
        torchmem.dump_snapshot("end_rank0.pickle")
    """)
    _cpu_run(tmp_path, 1, """
        import torch, torchmem
        torchmem.install(conf="capacity:64MiB", dump_on_oom="oom_rank{rank}.pickle")
        def activations():
            out = []
            while True:
                out.append(torch.empty(5 << 20, dtype=torch.uint8))
        try:
            activations()
        except torch.OutOfMemoryError:
            pass
    """)
    files = [str(tmp_path / "oom_rank1.pickle"), str(tmp_path / "end_rank0.pickle")]
    proc = ok(torchmem_here("ranks", *files, "--json"))
    rows = json.loads(proc.stdout)["ranks"]
    assert [r["rank"] for r in rows] == [0, 1]
    r0, r1 = rows
    assert r0["oom"] is None and r0["allocated"] == 12 * MiB
    assert r0["top_sites"][0]["site"] == "<string>:8 weights" and r0["top_sites"][0]["bytes"] == 12 * MiB
    assert r1["oom"]["size"] == 5 * MiB and r1["rank_from"] == "snapshot"
    with open(files[0], "rb") as f:
        snap = pickle.load(f)
    assert r1["reserved"] == sum(s["total_size"] for s in snap["segments"])
    assert r1["reserved"] + r1["oom"]["device_free"] == 64 * MiB
    assert r1["top_sites"][0]["site"] == "<string>:7 activations"

    text = ok(torchmem_here("ranks", *files))
    lines = text.stdout.splitlines()
    assert lines[0].split()[:4] == ["rank", "device", "allocated", "reserved"]
    assert lines[2].split()[0] == "0" and lines[3].split()[0] == "1"
    assert "5.0 MiB" in lines[3] and "1 of 2 ranks ran out of memory: 1." in text.stdout
    assert f"torchmem replay {files[0]}" in text.stdout


@pytest.mark.parametrize("content, words", [
    (b"", "empty file"),
    (b"not a pickle", "not a pickle"),
    (pickle.dumps([1, 2]), "not a memory snapshot"),
    (b'{"segments": 3}', "'segments' must be a list"),
])
def test_cli_bad_files(tmp_path, content, words):
    bad = tmp_path / "bad.pickle"
    bad.write_bytes(content)
    proc = torchmem_here("ranks", bad)
    assert proc.returncode == 1
    assert proc.stderr.startswith("torchmem ranks: error:") and words in proc.stderr, proc.stderr
    missing = torchmem_here("ranks", tmp_path / "nope.pickle")
    assert missing.returncode == 1 and "no such file" in missing.stderr
