"""torchmem.dump_on_oom() on CPU: the snapshot written at an OOM, and what happens around it.

Every test that installs torchmem runs in a fresh interpreter (a subprocess
with a timeout). Checked: the snapshot is PyTorch's format with the `oom`
entry, named in the error, and `torchmem replay` reproduces the OOM from it
(same request, same reserved bytes); ranks and pids in names; a second OOM
never overwrites; bad paths and a second dump_on_oom get clear errors; a
write that fails (a file-size limit standing in for a full disk) loses the
snapshot but never the OOM; a reinstall keeps dumping.
"""
from __future__ import annotations

import json
import os
import pickle
import subprocess

import pytest

import torchmem
from torchmem.runtime.oom import files

from tests.support.subprocess_runner import ROOT, last_json, ok, run_args, run_python, torchmem_here
MiB = 1 << 20

# Fills a 64 MiB capacity with a mix of 3 and 5 MiB tensors, freeing some, until an OOM.
FILL = """
import torch
def fill():
    keep = []
    for i in range(100):
        keep.append(torch.empty(3 << 20, dtype=torch.uint8))
        if i % 3 == 0:
            keep.pop(0)
        keep.append(torch.empty(5 << 20, dtype=torch.uint8))
    raise AssertionError("no OOM")
"""


def run(code: str, cwd: str, env: dict | None = None, timeout: int = 120) -> subprocess.CompletedProcess:
    """FILL + `code` in a child in `cwd`, without this process's rank, world size and settings unless `env` gives them."""
    unset = [key for key in ("RANK", "WORLD_SIZE", "TORCHMEM_ALLOC_CONF") if key not in (env or {})]
    return run_python(code, env, timeout, prelude=FILL, cwd=cwd, drop_env=unset)


def test_snapshot_written_at_oom_replays_the_oom(tmp_path):
    out = last_json(run(f"""
        import json, os, torch, torchmem
        torchmem.install(conf="capacity:64MiB", dump_on_oom={str(tmp_path / "oom_rank{rank}_pid{pid}.pickle")!r})
        try:
            fill()
        except torch.OutOfMemoryError as e:
            message = str(e)
        print(json.dumps({{"message": message, "written": torchmem.runtime.oom.written_snapshots(), "pid": os.getpid(),
                          "reserved": torchmem.memory_reserved()}}))
    """, str(tmp_path)))
    path = str(tmp_path / f"oom_rank0_pid{out['pid']}.pickle")
    assert out["written"] == [path]
    message = out["message"]
    # A 5 MiB request: as PyTorch's, the message gives the 20 MiB segment the allocator tried to get.
    assert message.startswith("cpu out of memory. Tried to allocate 20.00 MiB.")
    assert f"wrote a snapshot of this out-of-memory error to {path} (rank 0)" in message
    assert f"torchmem replay {path}" in message and f"torchmem advise {path}" in message

    with open(path, "rb") as f:
        snap = pickle.load(f)
    trace = snap["device_traces"][0]
    assert trace[-1]["action"] == "oom" and trace[-1]["size"] == 5 * MiB
    reserved = sum(s["total_size"] for s in snap["segments"])
    assert reserved == out["reserved"]
    assert reserved + trace[-1]["device_free"] == 64 * MiB
    assert snap["torchmem_oom"]["rank"] == 0 and snap["torchmem_oom"]["pid"] == out["pid"]
    assert snap["torchmem_oom"]["requested"] == 5 * MiB
    # Python stacks: each live block names the line of the program that made it.
    live = [b for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated"]
    assert live and all(b["frames"] and b["frames"][0]["name"] == "fill" for b in live)

    from torchmem import replay as sim

    result = sim.replay(path)
    assert result.capacity_source == "oom" and result.capacity == 64 * MiB
    assert result.recorded_oom["reproduced"], result.recorded_oom
    assert result.recorded_oom["replay_reserved"] == reserved == result.recorded_oom["reserved"]
    assert result.exact

    cli = ok(torchmem_here("replay", path))
    assert "The recorded OOM is reproduced" in cli.stdout


def test_a_second_oom_gets_a_new_file_and_none_is_overwritten(tmp_path):
    existing = tmp_path / "oom_rank0.pickle"
    existing.write_bytes(b"someone else's file")
    out = last_json(run(f"""
        import json, torch, torchmem
        torchmem.install(conf="capacity:64MiB", dump_on_oom={str(tmp_path / "oom_rank{rank}.pickle")!r})
        messages = []
        for _ in range(2):
            try:
                fill()
            except torch.OutOfMemoryError as e:
                messages.append(str(e))
        print(json.dumps({{"messages": messages, "written": torchmem.runtime.oom.written_snapshots()}}))
    """, str(tmp_path)))
    first, second = str(tmp_path / "oom_rank0-2.pickle"), str(tmp_path / "oom_rank0-3.pickle")
    assert out["written"] == [first, second]
    assert existing.read_bytes() == b"someone else's file"
    assert f"to {first} " in out["messages"][0] and f"to {second} " in out["messages"][1]
    for path in (first, second):
        with open(path, "rb") as f:
            assert pickle.load(f)["device_traces"][0][-1]["action"] == "oom"


def test_rank_from_the_environment_and_the_default_path(tmp_path):
    out = last_json(run("""
        import json, os, torch, torchmem
        torchmem.install(conf="capacity:64MiB", dump_on_oom=True)
        try:
            fill()
        except torch.OutOfMemoryError:
            pass
        print(json.dumps({"written": torchmem.runtime.oom.written_snapshots(), "pid": os.getpid()}))
    """, str(tmp_path), env={"RANK": "3", "WORLD_SIZE": "4"}))
    path = os.path.join(str(tmp_path), f"oom_rank3_pid{out['pid']}.pickle")  # the default, in the working directory
    assert out["written"] == [path]
    with open(path, "rb") as f:
        meta = pickle.load(f)["torchmem_oom"]
    assert meta["rank"] == 3 and meta["world_size"] == 4


def test_full_disk_loses_the_snapshot_not_the_oom(tmp_path):
    # RLIMIT_FSIZE makes writes past 1000 bytes fail (EFBIG), as a full disk fails them (ENOSPC).
    proc = run(f"""
        import json, resource, signal, torch, torchmem
        torchmem.install(conf="capacity:64MiB", dump_on_oom={str(tmp_path / "oom.pickle")!r})
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1000, resource.RLIM_INFINITY))
        try:
            fill()
        except torch.OutOfMemoryError as e:
            print(json.dumps({{"message": str(e), "written": torchmem.runtime.oom.written_snapshots(),
                              "failures": torchmem.runtime.oom.dumping()["failures"]}}))
    """, str(tmp_path))
    out = last_json(proc)
    message = out["message"]
    assert message.startswith("cpu out of memory. Tried to allocate 20.00 MiB.")
    assert "could not write the snapshot of this out-of-memory error to" in message
    assert "File too large" in message and "the error above is the original one" in message
    assert out["written"] == [] and len(out["failures"]) == 1
    assert sorted(os.listdir(tmp_path)) == []  # the partial file was removed


def test_an_observer_that_fails_never_hides_the_oom(tmp_path):
    out = last_json(run("""
        import json, torch, torchmem
        from torchmem import _C, _core
        def broken(device, info):
            raise KeyError("boom")
        torchmem.install(conf="capacity:64MiB")
        _C.cpu_add_oom_observer(broken)
        _C.cpu_add_oom_observer(lambda device, info: f"second observer: {info['requested']} on {device}")
        try:
            fill()
        except torch.OutOfMemoryError as e:
            print(json.dumps({"message": str(e)}))
    """, str(tmp_path)))
    lines = out["message"].splitlines()
    assert lines[0].startswith("cpu out of memory. Tried to allocate 20.00 MiB.")
    assert lines[1] == "torchmem: an out-of-memory observer failed: KeyError: 'boom'"
    assert lines[-1] == f"second observer: {5 * MiB} on 0"


def test_oom_in_a_python_thread_is_dumped(tmp_path):
    out = last_json(run(f"""
        import json, threading, torch, torchmem
        torchmem.install(conf="capacity:64MiB", dump_on_oom={str(tmp_path / "t.pickle")!r})
        caught = []
        def worker():
            try:
                fill()
            except torch.OutOfMemoryError as e:
                caught.append(str(e))
        t = threading.Thread(target=worker)
        t.start(); t.join(60)
        print(json.dumps({{"caught": caught, "written": torchmem.runtime.oom.written_snapshots()}}))
    """, str(tmp_path)))
    assert out["written"] == [str(tmp_path / "t.pickle")]
    assert "wrote a snapshot" in out["caught"][0]


def test_reinstall_with_another_conf_keeps_dumping(tmp_path):
    out = last_json(run(f"""
        import json, torch, torchmem
        torchmem.install(conf="capacity:1GiB", dump_on_oom={str(tmp_path / "o.pickle")!r})
        torchmem.install(conf="capacity:64MiB,max_split_size_mb:32")  # a new caching allocator
        try:
            fill()
        except torch.OutOfMemoryError:
            pass
        print(json.dumps({{"written": torchmem.runtime.oom.written_snapshots()}}))
    """, str(tmp_path)))
    assert out["written"] == [str(tmp_path / "o.pickle")]
    from torchmem import replay as sim

    result = sim.replay(out["written"][0])
    # the CPU settings install() adds are recorded too: the replay makes the same decisions
    assert result.conf == "max_split_size_mb:32,reuse_order:recent,min_block_size:64" and result.conf_source == "recorded"
    assert result.recorded_oom["reproduced"]


def test_second_dump_on_oom_and_bad_paths(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    out = last_json(run(f"""
        import json, torchmem
        errors = {{}}
        def attempt(name, fn):
            try:
                fn()
                errors[name] = None
            except Exception as e:
                errors[name] = [type(e).__name__, str(e)]
        attempt("before_install", lambda: torchmem.dump_on_oom({str(tmp_path / "x.pickle")!r}))
        attempt("install_bad_value", lambda: torchmem.install(conf="capacity:64MiB", dump_on_oom=3))
        attempt("install_bad_template", lambda: torchmem.install(conf="capacity:64MiB", dump_on_oom="x_{{host}}.pickle"))
        errors["installed_after_bad_value"] = torchmem.installed()
        torchmem.install(conf="capacity:64MiB")
        attempt("under_a_file", lambda: torchmem.dump_on_oom({str(blocker / "x.pickle")!r}))
        attempt("state_after_bad", lambda: None)
        errors["dumping_after_bad"] = torchmem.runtime.oom.dumping()
        attempt("first", lambda: torchmem.dump_on_oom({str(tmp_path / "a.pickle")!r}))
        attempt("same_again", lambda: torchmem.dump_on_oom({str(tmp_path / "a.pickle")!r}))
        attempt("other_path", lambda: torchmem.dump_on_oom({str(tmp_path / "b.pickle")!r}))
        attempt("other_max_entries", lambda: torchmem.dump_on_oom({str(tmp_path / "a.pickle")!r}, max_entries=10))
        attempt("stop", lambda: torchmem.dump_on_oom(None))
        errors["dumping_after_stop"] = torchmem.runtime.oom.dumping()
        errors["recording_after_stop"] = torchmem._core.history_enabled(torchmem.caching_allocator())
        attempt("then_other_path", lambda: torchmem.dump_on_oom({str(tmp_path / "sub" / "b.pickle")!r}))
        errors["dumping_at_end"] = torchmem.runtime.oom.dumping()
        print(json.dumps(errors))
    """, str(tmp_path)))
    assert out["before_install"][0] == "RuntimeError" and "torchmem.install()" in out["before_install"][1]
    assert out["install_bad_value"][0] == "TypeError" and "dump_on_oom must be" in out["install_bad_value"][1]
    assert out["install_bad_template"][0] == "ValueError" and "{host}" in out["install_bad_template"][1]
    assert out["installed_after_bad_value"] is False
    assert out["under_a_file"][0] == "NotADirectoryError"
    assert f"cannot write OOM snapshots in {blocker}" in out["under_a_file"][1]
    assert out["dumping_after_bad"] is None
    assert out["first"] is None and out["same_again"] is None
    for key in ("other_path", "other_max_entries"):
        assert out[key][0] == "RuntimeError", out[key]
        assert "already writing snapshots to" in out[key][1] and "dump_on_oom(None)" in out[key][1]
    assert out["stop"] is None and out["dumping_after_stop"] is None and out["recording_after_stop"] is False
    assert out["then_other_path"] is None
    assert out["dumping_at_end"]["path"] == str(tmp_path / "sub" / "b.pickle")
    assert os.path.isdir(tmp_path / "sub")  # made at the call
    assert sorted(os.listdir(tmp_path)) == ["a_file", "sub"]  # the writability probes left nothing


@pytest.mark.parametrize("path, error, words", [
    ("oom_{host}.pickle", ValueError, "unknown placeholder {host}"),
    ("oom_{rank.pickle", ValueError, "not a valid template"),
    ("", ValueError, "path is empty"),
    ("snapshots/", ValueError, "names a directory"),
    (42, TypeError, "path must be a str"),
])
def test_bad_templates_are_refused_before_anything_starts(path, error, words):
    with pytest.raises(error, match=words.replace("{", r"\{").replace("}", r"\}")):
        torchmem.dump_on_oom(path)
    assert torchmem.runtime.oom.dumping() is None


@pytest.mark.parametrize("max_entries", [0, -5, 1.5, True, "10"])
def test_bad_max_entries(max_entries):
    with pytest.raises(ValueError, match="max_entries must be a positive int"):
        torchmem.dump_on_oom("x.pickle", max_entries=max_entries)


def test_file_names(tmp_path):
    assert files.format_path("oom_rank{rank}_pid{pid}.pickle", rank=2, pid=77) == os.path.abspath("oom_rank2_pid77.pickle")
    assert files.format_path("~/r{rank}.pickle", rank=1, pid=0) == os.path.expanduser("~/r1.pickle")
    assert list(files.candidates("d/x.pickle"))[:3] == ["d/x.pickle", "d/x-2.pickle", "d/x-3.pickle"]
    target = str(tmp_path / "s.pickle")
    assert files.write_new(target, lambda f: f.write(b"1")) == target
    assert files.write_new(target, lambda f: f.write(b"2")) == str(tmp_path / "s-2.pickle")

    def fails(f):
        f.write(b"partial")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        files.write_new(target, fails)
    assert sorted(os.listdir(tmp_path)) == ["s-2.pickle", "s.pickle"]
    assert (tmp_path / "s.pickle").read_bytes() == b"1"


def test_rank_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("RANK", "5")
    assert files.current_rank() == 5
    monkeypatch.setenv("RANK", "not a number")
    assert files.current_rank() == 0
    monkeypatch.delenv("RANK")
    assert files.current_rank() == 0


@pytest.mark.slow
def test_example_oom_to_fix(tmp_path):
    out = ok(run_args([os.path.join(ROOT, "examples", "oom_to_fix.py"), "--out", str(tmp_path)], timeout=300,
                      cwd=str(tmp_path), drop_env=["TORCHMEM_ALLOC_CONF"])).stdout
    assert "torch.OutOfMemoryError: cpu out of memory" in out and "wrote a snapshot of this out-of-memory error" in out
    assert "The recorded OOM is reproduced" in out
    assert "Best PyTorch setting: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in out
    assert "== 4. Training again in 276MiB with expandable_segments:True\nCompleted:" in out
    assert len([f for f in os.listdir(tmp_path) if f.endswith(".pickle")]) == 1
