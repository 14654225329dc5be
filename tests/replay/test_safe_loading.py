"""A snapshot is data, never code (torchmem/formats/safe_pickle.py, csrc/core/traces/pickle_scan.h).

Hostile pickles are refused by every reader and run nothing; every plain
pickle (any protocol) loads as pickle.load would; real snapshots, PyTorch's
format and torchmem's own dumps still load.
"""
from __future__ import annotations

import copyreg
import glob
import io
import os
import pickle

import pytest
from hypothesis import given, settings, strategies as st

from torchmem import _core
from torchmem import replay as sim
from torchmem.cli import main
from torchmem.formats.safe_pickle import DamagedPickleError, UnsafePickleError, loads_plain
from torchmem.runtime.snapshot import dump_snapshot
from torchmem.formats.snapshot_format import build_snapshot, load
from torchmem.formats.trace_types import TraceError

from tests.support.sim import MiB, sim_allocator

SNAPSHOTS = "/work/shared/data/snapshots" if os.path.isdir("/work/shared/data/snapshots") else os.path.join(
    os.path.dirname(__file__), "..", "..", "..", "shared", "data", "snapshots")


class RunsCommand:
    """Unpickling this with pickle.load would create `marker` (a shell command)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class Plain:
    def __init__(self) -> None:
        self.x = 1


def _ext_pickle() -> bytes:
    copyreg.add_extension("collections", "OrderedDict", 240)
    try:
        import collections

        return pickle.dumps(collections.OrderedDict(a=1), protocol=2)
    finally:
        copyreg.remove_extension("collections", "OrderedDict", 240)


def hostile_payloads(marker: str) -> dict[str, bytes]:
    snap = lambda value: {"segments": [], "device_traces": [[value]]}  # noqa: E731
    payloads = {f"reduce-protocol-{p}": pickle.dumps(snap(RunsCommand(marker)), protocol=p) for p in range(6)}
    payloads.update({
        "global-eval": b"\x80\x02cbuiltins\neval\nq\x00X\x0b\x00\x00\x00print(\"hi\")q\x01\x85q\x02Rq\x03.",
        "inst": b"(S'touch " + marker.encode() + b"'\nios\nsystem\n.",
        "object-build": pickle.dumps(snap(Plain()), protocol=4),
        "persistent-id": b"\x80\x04Pfoo\n.",
        "binpersid": b"\x80\x04K\x01Q.",
        "set": pickle.dumps(snap({1, 2}), protocol=4),
        "frozenset": pickle.dumps(snap(frozenset({1})), protocol=4),
        "bytearray": pickle.dumps(snap(bytearray(b"xy")), protocol=5),
        "out-of-band-buffer": pickle.dumps(pickle.PickleBuffer(b"abc"), protocol=5,
                                           buffer_callback=lambda b: False),
        "extension-code": _ext_pickle(),
        "not-an-opcode": b"\x80\x04\xff.",
    })
    return payloads


def test_hostile_pickles_are_refused_and_run_nothing(tmp_path):
    marker = str(tmp_path / "ran")
    for name, data in hostile_payloads(marker).items():
        with pytest.raises((UnsafePickleError, DamagedPickleError)) as info:
            loads_plain(data)
        assert "byte" in str(info.value), name
        assert not os.path.exists(marker), name
    with pytest.raises(UnsafePickleError, match=r"it names posix\.system \(STACK_GLOBAL\)"):
        loads_plain(pickle.dumps(RunsCommand(marker), protocol=4))
    with pytest.raises(UnsafePickleError, match=r"it names posix\.system \(GLOBAL\)"):
        loads_plain(pickle.dumps(RunsCommand(marker), protocol=2))
    with pytest.raises(UnsafePickleError, match=r"it names os\.system \(INST\)"):
        loads_plain(hostile_payloads(marker)["inst"])
    with pytest.raises(UnsafePickleError, match="it holds a set"):
        loads_plain(hostile_payloads(marker)["set"])
    assert not os.path.exists(marker)


COMMANDS = [
    ["replay", "{f}", "--no-progress"],
    ["advise", "{f}", "--no-progress"],
    ["ranks", "{f}", "--no-progress"],
    ["stats", "{f}"],
    ["plot", "{f}", "-o", "{d}/p.png", "--no-progress"],
    ["viz", "{f}", "-o", "{d}/v.html", "--no-progress"],
]


@pytest.mark.parametrize("argv", COMMANDS, ids=[a[0] for a in COMMANDS])
def test_no_command_runs_a_hostile_snapshot(tmp_path, capsys, argv):
    marker = str(tmp_path / "ran")
    path = tmp_path / "evil.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [[RunsCommand(marker)]]}))
    status = main([a.replace("{f}", str(path)).replace("{d}", str(tmp_path)) for a in argv])
    err = capsys.readouterr().err
    assert status == 1 and not os.path.exists(marker)
    assert err.count("\n") == 1 and err.startswith(f"torchmem {argv[0]}: error: {path}: refused to load:")
    assert "posix.system" in err and "Traceback" not in err


def test_python_readers_refuse_a_hostile_snapshot(tmp_path):
    marker = str(tmp_path / "ran")
    path = tmp_path / "evil.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [[RunsCommand(marker)]]}))
    for read in (sim.replay, load, sim.load_trace):
        with pytest.raises(TraceError, match="refused to load: it names posix.system"):
            read(str(path))
    assert not os.path.exists(marker)


plain = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20)
    | st.binary(max_size=20),
    lambda children: st.lists(children, max_size=5) | st.tuples(children, children)
    | st.dictionaries(st.text(max_size=8) | st.integers(), children, max_size=5),
    max_leaves=30,
)


@settings(max_examples=200, deadline=None)
@given(value=plain, protocol=st.integers(3, 5))
def test_every_plain_pickle_loads_as_pickle_would(value, protocol):
    data = pickle.dumps(value, protocol=protocol)
    assert loads_plain(data) == pickle.loads(data)


def test_old_protocols_load_without_bytes():
    value = {"segments": [{"address": 2**40, "blocks": [], "segment_pool_id": (0, 0)}], "f": 1.5, "n": None,
             "t": True, "s": "é" * 300, "big": -(2**100)}
    for protocol in range(0, 3):
        assert loads_plain(pickle.dumps(value, protocol=protocol)) == value


def test_every_cut_of_a_snapshot_is_a_clear_error():
    a, keep, snap = _sim_snapshot()
    data = pickle.dumps(snap)
    for cut in range(len(data)):
        with pytest.raises(DamagedPickleError, match=r"truncated file\? \(byte"):
            loads_plain(data[:cut])
    assert loads_plain(data) == snap


def test_the_scan_reads_arguments_not_their_bytes():
    # A string whose bytes spell a GLOBAL opcode is data; a length past the end is a truncated file.
    data = pickle.dumps({"s": "cos\nsystem\n", "b": b"\x93R"}, protocol=4)
    assert loads_plain(data) == {"s": "cos\nsystem\n", "b": b"\x93R"}
    assert _core.scan_plain_pickle(b"\x80\x04\x8d" + (2**62).to_bytes(8, "little") + b".")[0] is False


def _sim_snapshot() -> tuple:
    a = sim_allocator()
    table = _core.StackTable()
    _core.enable_history(a, 1000, table)
    keep = [a.allocate(s) for s in (1000, 3 * MiB, 25 * MiB)]
    a.deallocate(a.allocate(5 * MiB))
    return a, keep, build_snapshot(a.segments(), _core.history_entries(a), frames_of=table.frames)


def test_torchmem_dumps_load(tmp_path):
    a, keep, snap = _sim_snapshot()
    path = tmp_path / "own.pickle"
    dump_snapshot(str(path), snap)
    assert load(path) == pickle.loads(path.read_bytes())
    assert sim.replay(str(path)).completed


def pytorch_snapshot() -> dict:
    """The dict torch.cuda.memory._snapshot() returns in torch 2.11 and 2.13 (torch/csrc/cuda/Module.cpp), every
    field of its documented shape, frames shared between entries as py_symbolize shares them."""
    frames = [{"name": "forward", "filename": "train.py", "line": 42},
              {"name": "torch::unwind::unwind()", "filename": "??", "line": 0}]
    block = {"address": 2**40, "size": 2 * MiB, "requested_size": 2 * MiB - 100, "state": "active_allocated",
             "frames": frames}
    segment = {"device": 0, "address": 2**40, "total_size": 2 * MiB, "allocated_size": 2 * MiB,
               "active_size": 2 * MiB, "requested_size": 2 * MiB - 100, "stream": 0, "segment_type": "small",
               "segment_pool_id": (0, 0), "is_expandable": False, "frames": frames, "blocks": [block]}
    trace = [{"action": "segment_alloc", "addr": 2**40, "size": 2 * MiB, "stream": 0, "time_us": 1, "frames": frames,
              "compile_context": "N/A", "user_metadata": ""},
             {"action": "alloc", "addr": 2**40, "size": 2 * MiB - 100, "stream": 0, "time_us": 2, "frames": frames,
              "compile_context": "N/A", "user_metadata": ""}]
    settings = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False", "max_split_size": -1,
                "garbage_collection_threshold": 0.0, "expandable_segments": False, "pinned_num_register_threads": 1,
                "release_lock_on_malloc": False, "pinned_use_host_register": False,
                "roundup_power2_divisions": {1: 0, 2: 0, 4: 0}}
    return {"segments": [segment], "device_traces": [trace], "allocator_settings": settings,
            "external_annotations": [{"device": 0, "stage": "START", "name": "step", "time_us": 0}]}


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_pytorch_snapshots_of_every_protocol_load(tmp_path, protocol):
    path = tmp_path / "torch.pickle"
    snap = pytorch_snapshot()
    path.write_bytes(pickle.dumps(snap, protocol=protocol))
    assert load(path) == snap
    r = sim.replay(str(path))
    assert r.completed and r.events == 2 and r.recorded.conf == ""


@pytest.mark.skipif(not os.path.isdir(SNAPSHOTS), reason=f"the real snapshots ({SNAPSHOTS}) are not on this machine")
def test_every_real_snapshot_loads_as_pickle_would():
    paths = sorted(glob.glob(os.path.join(SNAPSHOTS, "*.pickle")))
    assert len(paths) >= 3
    for path in paths:
        with open(path, "rb") as f:
            expected = pickle.load(f)
        assert load(path) == expected, path
        assert sim.load_trace(path).recorded.entries > 0


# --- A replay's load without the stacks (csrc/core/traces/pickle_strip.h) ------------------------------

def _without_frames(value):
    if isinstance(value, dict):
        return {k: ([] if k == "frames" else _without_frames(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [_without_frames(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_without_frames(v) for v in value)
    return value


keyed = st.recursive(
    st.none() | st.integers() | st.text(max_size=6) | st.just("frames") | st.just("") | st.binary(max_size=4),
    lambda children: st.lists(children, max_size=4) | st.tuples(children, children)
    | st.dictionaries(st.sampled_from(["frames", "a", "", 7]), children, max_size=4),
    max_leaves=25,
)


@settings(max_examples=300, deadline=None)
@given(value=keyed, shared=keyed, protocol=st.integers(2, 5))
def test_dropping_frames_changes_nothing_else(value, shared, protocol):
    """Objects shared through the memo (the same list as frames and elsewhere) included: either exactly the
    value with every frames value emptied, or, where the rewrite cannot be sure, the whole value."""
    whole = {"frames": shared, "x": [shared, {"frames": shared}, value], "y": value, "": "frames"}
    if protocol == 2:
        whole = _no_bytes(whole)
    data = pickle.dumps(whole, protocol=protocol)
    stripped = _core.strip_pickle_key(data, "frames")
    got = loads_plain(data, "frames")
    if stripped is None:
        assert got == whole
    else:
        assert got == _without_frames(whole)


def _no_bytes(value):
    if isinstance(value, bytes):
        return value.decode("latin-1")
    if isinstance(value, dict):
        return {k: _no_bytes(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_no_bytes(v) for v in value)
    return value


@pytest.mark.skipif(not os.path.isdir(SNAPSHOTS), reason=f"the real snapshots ({SNAPSHOTS}) are not on this machine")
def test_real_snapshots_replay_the_same_without_their_frames():
    from torchmem.replay.snapshot_trace import snapshot_trace

    for path in sorted(glob.glob(os.path.join(SNAPSHOTS, "*.pickle"))):
        with open(path, "rb") as f:
            data = f.read()
        assert _core.strip_pickle_key(data, "frames") is not None, path  # the fast path is taken on real files
        full = pickle.loads(data)
        assert loads_plain(data, "frames") == _without_frames(full)
        fast, slow = sim.load_trace(path), snapshot_trace(full, path)
        assert [c.ops.tolist() + c.sizes.tolist() + c.addrs.tolist() for c in fast.chunks()] == \
               [c.ops.tolist() + c.sizes.tolist() + c.addrs.tolist() for c in slow.chunks()]
        a, b = sim.replay(fast), sim.replay(slow)
        assert (a.completed, a.events, a.peak_allocated, a.peak_reserved, a.exact) == \
               (b.completed, b.events, b.peak_allocated, b.peak_reserved, b.exact)


# --- Snapshots written by PyTorch's own CUDA builds (on the fake GPU, where its tier is built) -----------

DUMP = """
import torch
torch.cuda.memory._record_memory_history(max_entries=10000)
xs = [torch.empty(n * 1024, device="cuda") for n in (1, 300, 5000, 20000)]
del xs[1]
try:
    torch.empty(10**12, device="cuda")
except torch.OutOfMemoryError:
    pass
torch.cuda.memory._dump_snapshot({path!r})
"""


def _fake_gpu_tier(version: str) -> tuple[str, str] | None:
    """(python, extension dir) of the fake-GPU tier for a CUDA build of torch `version`, if built here."""
    from tests.support.subprocess_runner import ROOT

    venv = os.path.join(ROOT, ".venv-cuda" if version == "2.14.1" else f".venv-cuda-{version}")
    python, ext = os.path.join(venv, "bin", "python"), os.path.join(ROOT, "build", f"cuda-{version}", "lib", "torchmem")
    fake = os.path.join(ROOT, "build", "fakegpu")
    return (python, ext) if all(os.path.exists(p) for p in (python, ext, fake)) else None


@pytest.mark.slow
@pytest.mark.parametrize("version", ["2.11.0", "2.14.1"])
def test_snapshots_written_by_pytorchs_cuda_builds_load(tmp_path, version):
    """torch.cuda.memory._dump_snapshot() itself, in PyTorch's CUDA build on the fake GPU (make fakegpu): the
    pickle holds plain data only, loads as pickle.load reads it, and replays exactly, its OOM reproduced."""
    from tests.support.subprocess_runner import ROOT, ok, run_args

    tier = _fake_gpu_tier(version)
    if tier is None:
        pytest.skip(f"the fake-GPU tier for torch {version} is not built here (make test-fakegpu FAKEGPU_TORCH={version})")
    python, ext = tier
    path = str(tmp_path / f"torch-{version}.pickle")
    env = {"TORCHMEM_EXT_DIR": ext, "TORCHMEM_FAKEGPU_LIBS": os.path.join(ROOT, "build", "fakegpu")}
    ok(run_args(["-m", "torchmem.fakegpu", "--card", "8GiB", "--", python, "-c", DUMP.format(path=path)], env, 600,
                python=python))
    with open(path, "rb") as f:
        data = f.read()
    assert _core.scan_plain_pickle(data)[0] and _core.strip_pickle_key(data, "frames") is not None
    assert load(path) == pickle.loads(data)
    r = sim.replay(path)
    assert r.exact and r.recorded_oom is not None and r.recorded_oom["reproduced"]
