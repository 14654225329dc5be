"""The catalogue of bad input (docs/reliability.md): every public entry point,
the bad inputs tried, and the error each gets. Never a crash, never a silent
wrong answer. Each row of the catalogue is one case id below.

Cases that once crashed or answered wrongly are kept at the end as
regression tests.
"""
from __future__ import annotations

import os
import pickle
import sys

import pytest
import torch

import torchmem
import torchmem.runtime.cuda
from tests.support.subprocess_runner import run_python
from torchmem import _core
from torchmem.formats import trace_types
from torchmem.replay.trace_files import load_trace
from torchmem import replay as sim
from torchmem.cli import main as cli_main
from torchmem.runtime.cuda import CUDANotBuiltError, cuda_glue_built
from torchmem.plan import Buffer, buffers_from_trace, fx, load_csv, lower_bound, solve

EV = [{"op": "alloc", "id": 1, "size": 100}, {"op": "free", "id": 1}]


def _sim_alloc():
    return _core.CachingAllocator(_core.SimDevice(1 << 30), "")


def _arena():
    return torchmem.Arena(1 << 20, "sim")


def _kv(**kw):
    args = dict(num_blocks=4, block_size=2, num_heads=1, head_dim=2, dtype=torch.float32)
    args.update(kw)
    return torchmem.PagedKVCache(**args)


def _pool():
    return _core.PagedBlockPool(4)


# (id, callable, expected exception, fragment of the message)
CASES = [
    # install / uninstall / memory_* (torchmem not installed in this process)
    ("install-unknown-kind", lambda: torchmem.install("arena"), ValueError, "unknown allocator kind"),
    ("install-conf-not-str", lambda: torchmem.install(conf=5), TypeError, "conf must be a string"),
    ("install-conf-bad-value", lambda: torchmem.install(conf="max_split_size_mb:abc"), ValueError, "max_split_size_mb"),
    ("install-conf-unknown-key", lambda: torchmem.install(conf="nonsense:1"), ValueError, "nonsense"),
    ("install-conf-bad-bool", lambda: torchmem.install(conf="expandable_segments:maybe"), ValueError, "True or False"),
    # PyTorch's range is [0.0, 1.0] (CUDAAllocatorConfig::parsePerProcessMemoryFraction): 0 is accepted.
    ("install-conf-fraction-1.5", lambda: torchmem.install(conf="per_process_memory_fraction:1.5"), ValueError,
     "per_process_memory_fraction"),
    ("install-conf-gc-1.5", lambda: torchmem.install(conf="garbage_collection_threshold:1.5"), ValueError,
     "garbage_collection_threshold"),
    ("install-conf-backend", lambda: torchmem.install(conf="backend:cudaMallocAsync"), ValueError, "backend"),
    ("install-conf-capacity", lambda: torchmem.install(conf="capacity:lots"), ValueError, "a size such as 80GiB"),
    ("memory_stats-cuda", lambda: torchmem.memory_stats("cuda"), ValueError, "torchmem manages the CPU"),
    ("memory_stats-int", lambda: torchmem.memory_stats(0), ValueError, "torchmem manages the CPU"),
    ("memory_allocated-cuda1", lambda: torchmem.memory_allocated("cuda:1"), ValueError, "torchmem manages the CPU"),
    ("empty_cache-cuda", lambda: torchmem.empty_cache("cuda:1"), ValueError, "torchmem manages the CPU"),
    ("memory_summary-cuda", lambda: torchmem.memory_summary("cuda"), ValueError, "torchmem manages the CPU"),
    ("set_fraction-not-installed", lambda: torchmem.set_per_process_memory_fraction(0.5), RuntimeError,
     "not installed"),
    # CachingAllocator (torchmem._core)
    ("caching-conf-bad", lambda: _core.CachingAllocator(_core.SimDevice(1 << 30), "expandable_segments:maybe"), ValueError,
     "expandable_segments"),
    ("caching-allocate-negative", lambda: _sim_alloc().allocate(-1), TypeError, "incompatible function arguments"),
    ("caching-allocate-float", lambda: _sim_alloc().allocate(1.5), TypeError, "incompatible function arguments"),
    ("caching-allocate-2**64", lambda: _sim_alloc().allocate(2**64), TypeError, "incompatible function arguments"),
    ("caching-allocate-2**63", lambda: _sim_alloc().allocate(2**63), torch.OutOfMemoryError, "Tried to allocate"),
    ("caching-allocate-over-capacity", lambda: _sim_alloc().allocate(2 << 30), torch.OutOfMemoryError,
     "total capacity of 1024.00 MiB"),
    ("caching-free-foreign", lambda: _sim_alloc().deallocate(12345), ValueError, "not a live allocation"),
    ("caching-double-free", lambda: (lambda a: (a.deallocate(a.allocate(10)), a.deallocate(a.segments()[0]["address"])))(
        _sim_alloc()), ValueError, "not a live allocation"),
    ("caching-free-negative", lambda: _sim_alloc().deallocate(-1), TypeError, "incompatible function arguments"),
    # PyTorch's setMemoryFraction takes [0, 1]: 0 is a limit of 0 bytes, not an error.
    ("caching-fraction-negative", lambda: _sim_alloc().set_memory_fraction(-0.5), ValueError, "[0.0, 1.0]"),
    ("caching-fraction-nan", lambda: _sim_alloc().set_memory_fraction(float("nan")), ValueError, "[0.0, 1.0]"),
    ("caching-fraction-2", lambda: _sim_alloc().set_memory_fraction(2), ValueError, "[0.0, 1.0]"),
    ("simdevice-page-3", lambda: _core.SimDevice(1 << 30, 3), ValueError, "power of two"),
    ("simdevice-others-over-capacity", lambda: _core.SimDevice(10, 2 << 20, 20), ValueError, "exceeds the capacity"),
    ("simdevice-negative", lambda: _core.SimDevice(-1), TypeError, "incompatible constructor arguments"),
    ("parse_size-empty", lambda: _core.parse_size(""), ValueError, "a size such as 80GiB"),
    ("parse_size-overflow", lambda: _core.parse_size("17179869184GiB"), ValueError, "at most 8 EiB"),
    ("parse_size-unit", lambda: _core.parse_size("16EiB"), ValueError, "a size such as 80GiB"),
    # sim.replay / sim.compare
    ("replay-capacity-0", lambda: sim.replay(EV, 0), ValueError, "capacity must be positive"),
    ("replay-capacity-negative", lambda: sim.replay(EV, -1), ValueError, "capacity must be positive"),
    ("replay-capacity-unit", lambda: sim.replay(EV, "80XB"), ValueError, "a size such as 80GiB"),
    ("replay-capacity-float", lambda: sim.replay(EV, 1.5), TypeError, "capacity must be bytes"),
    ("replay-capacity-bool", lambda: sim.replay(EV, True), TypeError, "capacity must be bytes"),
    ("replay-capacity-list", lambda: sim.replay(EV, [1]), TypeError, "capacity must be bytes"),
    ("replay-capacity-2**64", lambda: sim.replay(EV, 2**64), TypeError, "incompatible constructor arguments"),
    ("replay-conf-bad", lambda: sim.replay(EV, "1GiB", "max_split_size_mb:x"), ValueError, "max_split_size_mb"),
    ("replay-conf-int", lambda: sim.replay(EV, "1GiB", 3), TypeError, "conf must be a string"),
    ("replay-others-over-capacity", lambda: sim.replay(EV, "1GiB", in_use_by_others="2GiB"), ValueError,
     "must be less than the capacity"),
    ("replay-others-negative", lambda: sim.replay(EV, "1GiB", in_use_by_others=-1), ValueError, "non-negative"),
    ("replay-trace-none", lambda: sim.replay(None), TypeError, "not iterable"),
    ("replay-missing-file", lambda: sim.replay("/nonexistent/trace.pickle"), FileNotFoundError, "no such file"),
    ("replay-free-unknown-id", lambda: sim.replay([{"op": "free", "id": 3}], "1GiB"), trace_types.TraceError,
     "event 0: free of id 3"),
    ("replay-alloc-live-id", lambda: sim.replay([{"op": "alloc", "id": 3, "size": 5}] * 2, "1GiB"), trace_types.TraceError,
     "event 1: alloc of id 3, which is already live"),
    ("replay-unknown-op", lambda: sim.replay([{"op": "malloc", "id": 1, "size": 5}], "1GiB"), trace_types.TraceError,
     "unknown op 'malloc'"),
    ("replay-event-not-dict", lambda: sim.replay([[1, 2]], "1GiB"), trace_types.TraceError, "expected an object"),
    ("replay-negative-stream", lambda: sim.replay([{"op": "alloc", "id": 1, "size": 5, "stream": -1}], "1GiB"),
     trace_types.TraceError, "non-negative"),
    ("replay-missing-id", lambda: sim.replay([{"op": "alloc", "size": 5}], "1GiB"), trace_types.TraceError,
     "bad or missing field"),
    ("replay-size-2**64", lambda: sim.replay([{"op": "alloc", "id": 1, "size": 2**64}], "1GiB"), trace_types.TraceError,
     "below 2**64"),
    ("replay-progress-not-callable", lambda: sim.replay(EV, "1GiB", progress=5), TypeError, "not callable"),
    ("replay-history-negative", lambda: sim.replay(EV, "1GiB", history=-1), TypeError, "incompatible function"),
    ("compare-no-confs", lambda: sim.compare(EV, []), ValueError, "at least one config"),
    ("compare-confs-a-string", lambda: sim.compare(EV, "expandable_segments:True", capacity="1GiB"), ValueError,
     "is not key:value"),
    # plan.solve and loaders
    ("solve-unknown-method", lambda: solve([(0, 0, 2, 4)], method="fastest"), ValueError, "unknown method"),
    ("solve-time-limit-0", lambda: solve([(0, 0, 2, 4)], time_limit=0), ValueError, "time limit"),
    ("solve-time-limit-nan", lambda: solve([(0, 0, 2, 4)], time_limit=float("nan")), ValueError, "time limit"),
    ("solve-alignment-0", lambda: solve([(0, 0, 2, 4)], alignment=0), ValueError, "alignment"),
    ("solve-alignment-float", lambda: solve([(0, 0, 2, 4)], alignment=1.5), ValueError, "alignment"),
    ("solve-empty-lifetime", lambda: solve([(0, 3, 3, 4)]), ValueError, "lower 3 >= upper 3"),
    ("solve-negative-size", lambda: solve([(0, 0, 2, -4)]), ValueError, "negative size"),
    ("solve-float-size", lambda: solve([(0, 0, 2, 4.5)]), ValueError, "must be an integer"),
    ("solve-str-size", lambda: solve([(0, 0, 2, "four")]), ValueError, "must be an integer"),
    ("solve-duplicate-id", lambda: solve([(0, 0, 2, 4), (0, 1, 3, 4)]), ValueError, "duplicate buffer id"),
    ("solve-wrong-arity", lambda: solve([(0, 0, 2)]), ValueError, "expected a Buffer"),
    ("solve-missing-key", lambda: solve([{"lower": 0, "upper": 2}]), ValueError, "missing key 'size'"),
    ("solve-size-2**64", lambda: solve([(0, 0, 2, 2**64)]), ValueError, "does not fit in 63 bits"),
    ("solve-sizes-sum-over-2**62", lambda: solve([(i, 0, 2, 2**62) for i in range(3)], method="greedy"), ValueError,
     "2**62 limit"),
    ("solve-alignment-pads-over-2**62", lambda: solve([(0, 0, 2, 2**62 + 1)], alignment=2**62), ValueError,
     "2**62 limit"),
    ("lower_bound-bad-buffer", lambda: lower_bound([(0, 2, 1, 4)]), ValueError, "lower 2 >= upper 1"),
    ("buffers_from_trace-double-alloc",
     lambda: buffers_from_trace([{"op": "alloc", "id": 1, "size": 4}, {"op": "alloc", "id": 1, "size": 4}]),
     ValueError, "allocated twice"),
    ("buffers_from_trace-free-unknown", lambda: buffers_from_trace([{"op": "free", "id": 1}]), ValueError,
     "not allocated"),
    ("buffers_from_trace-bad-size", lambda: buffers_from_trace([{"op": "alloc", "id": 1, "size": -1}]), ValueError,
     "non-negative integer size"),
    ("buffers_from_trace-bad-op", lambda: buffers_from_trace([{"op": "grow", "id": 1}]), ValueError,
     "op must be 'alloc' or 'free'"),
    ("buffers_from_trace-not-mapping", lambda: buffers_from_trace([5]), ValueError, "expected a mapping"),
    ("buffer-lower-ge-upper", lambda: Buffer("x", 5, 5, 1), ValueError, "lower 5 >= upper 5"),
    ("plan-offset_of-unknown", lambda: solve([(0, 0, 1, 4)]).offset_of("nope"), KeyError, "nope"),
    ("fx-analyze-not-graphmodule", lambda: fx.analyze(torch.nn.Linear(2, 2)), ValueError,
     "expected a torch.fx.GraphModule"),
    ("fx-plan_graph-not-graphmodule", lambda: fx.plan_graph(5), ValueError, "expected a torch.fx.GraphModule"),
    ("fx-workspace-not-callable", lambda: fx.register_workspace("x", 5), ValueError, "must be callable"),
    # Arena
    ("arena-capacity-0", lambda: torchmem.Arena(0), ValueError, "capacity must be positive"),
    ("arena-capacity-negative", lambda: torchmem.Arena(-5), TypeError, "incompatible constructor arguments"),
    ("arena-capacity-str", lambda: torchmem.Arena("big"), ValueError, "invalid literal"),
    ("arena-capacity-too-big", lambda: torchmem.Arena(2**62), torch.OutOfMemoryError, "could not provide a region"),
    ("arena-capacity-2**64", lambda: torchmem.Arena(2**64), TypeError, "incompatible constructor arguments"),
    ("arena-alignment-3", lambda: torchmem.Arena(1 << 20, alignment=3), ValueError, "power of two >= 64"),
    ("arena-alignment-32", lambda: torchmem.Arena(1 << 20, alignment=32), ValueError, "power of two >= 64"),
    ("arena-device-unknown", lambda: torchmem.Arena(1 << 20, device="tpu"), ValueError,
     "device must be 'cpu', 'cuda'"),
    ("arena-device-float", lambda: torchmem.Arena(1 << 20, device=5.0), TypeError, "unsupported device"),
    ("arena-fallback-unknown", lambda: torchmem.Arena(1 << 20, fallback="x"), ValueError, "fallback must be"),
    ("arena-fallback-caching-uninstalled", lambda: torchmem.Arena(1 << 20, fallback="caching"), RuntimeError,
     "needs torchmem.install()"),
    ("arena-allocate-negative", lambda: _arena().allocate(-1), TypeError, "incompatible function arguments"),
    ("arena-allocate-over-capacity", lambda: _arena().allocate(2 << 20), torch.OutOfMemoryError,
     "Arena out of memory"),
    ("arena-allocate-alignment-3", lambda: _arena().allocate(16, 3), ValueError, "power of two"),
    ("arena-free-foreign", lambda: _arena().deallocate(123), ValueError, "not a live allocation"),
    ("arena-reset-with-live", lambda: (lambda a: (a.allocate(64), a.reset()))(_arena()), torchmem.ArenaEscapeError,
     "still alive"),
    ("arena-empty-on-sim", lambda: _arena().empty(4), RuntimeError, "only a host ('cpu') arena"),
    ("arena-empty-too-big", lambda: torchmem.Arena(1 << 20).empty(1 << 30), torch.OutOfMemoryError,
     "Arena out of memory"),
    ("arena-scope-bad-policy", lambda: _arena().scope(on_escape="ignore").__enter__(), ValueError, "on_escape"),
    ("arena-block-uninstalled", lambda: torchmem.arena(1 << 20).__enter__(), RuntimeError, "torchmem.install()"),
    ("arena-block-arena-and-device", lambda: torchmem.arena(_arena(), device="cpu").__enter__(), ValueError,
     "belong to the Arena"),
    ("arena-allocate-other-stream", lambda: torchmem._core.Arena(torchmem._core.SimDevice(1 << 20), 4096, stream=3)
     .allocate(64, stream=4), ValueError, "serves stream 3 only"),
    # PagedKVCache and the block pool
    ("kv-num_blocks-0", lambda: _kv(num_blocks=0), ValueError, "num_blocks must be positive"),
    ("kv-num_blocks-negative", lambda: _kv(num_blocks=-1), ValueError, "num_blocks must be positive"),
    ("kv-num_blocks-2**31", lambda: _kv(num_blocks=2**31), TypeError, "incompatible constructor arguments"),
    ("kv-block_size-0", lambda: _kv(block_size=0), ValueError, "must be positive"),
    ("kv-dtype-str", lambda: _kv(dtype="float"), TypeError, "dtype"),
    ("kv-device-unknown", lambda: _kv(device="tpu"), RuntimeError, "Expected one of"),
    ("kv-add-negative-count", lambda: _kv().add_sequence(-1), ValueError, "negative token count"),
    ("kv-add-too-long", lambda: _kv().add_sequence(100), torchmem.OutOfBlocksError, "nothing was changed"),
    ("kv-add-str", lambda: _kv().add_sequence("abc"), TypeError, "token ids must be integers"),
    ("kv-append-unknown", lambda: _kv().append(99, 1), KeyError, "unknown sequence 99"),
    ("kv-append-negative", lambda: (lambda k: k.append(k.add_sequence(1).seq_id, -2))(_kv()), ValueError,
     "negative token count"),
    ("kv-free-unknown", lambda: _kv().free(99), KeyError, "unknown sequence 99"),
    ("kv-fork-unknown", lambda: _kv().fork(99), KeyError, "unknown sequence 99"),
    ("kv-step-duplicate", lambda: (lambda k: k.append_tokens([k.add_sequence(1).seq_id] * 2))(_kv()), ValueError,
     "appears twice"),
    ("kv-step-token-count", lambda: (lambda k: k.append_tokens([k.add_sequence(1).seq_id], [1, 2]))(_kv()), ValueError,
     "one token per sequence"),
    ("kv-write-bad-slot", lambda: _kv().write(0, torch.tensor([999]), torch.zeros(1, 1, 2), torch.zeros(1, 1, 2)),
     IndexError, "out of bounds"),
    ("kv-write-bad-layer", lambda: _kv().write(5, torch.tensor([0]), torch.zeros(1, 1, 2), torch.zeros(1, 1, 2)),
     IndexError, "out of bounds"),
    ("kv-write-bad-shape", lambda: _kv().write(0, torch.tensor([0]), torch.zeros(1, 3, 2), torch.zeros(1, 3, 2)),
     RuntimeError, "same slice shapes"),
    ("pool-num_blocks-0", lambda: _core.PagedBlockPool(0), ValueError, "num_blocks must be positive"),
    ("pool-release-out-of-range", lambda: _pool().release(9), ValueError, "out of range [0, 4)"),
    ("pool-release-free-block", lambda: _pool().release(0), ValueError, "is not in use"),
    ("pool-retain-negative", lambda: _pool().retain(-1), ValueError, "out of range"),
    ("pool-allocate_n-too-many", lambda: _pool().allocate_n(5), torchmem.OutOfBlocksError, "5 requested, 4 free"),
    ("pool-allocate_n-negative", lambda: _pool().allocate_n(-1), TypeError, "incompatible function arguments"),
    ("pool-set_hash-free-block", lambda: _pool().set_hash(0, 5), ValueError, "is not in use"),
    ("pool-make_writable-free-block", lambda: _pool().make_writable(3, lambda a, b: None), ValueError, "is not in use"),
    ("pool-release_n-over-release", lambda: (lambda p: p.release_n([p.allocate()] * 2))(_pool()), ValueError, ""),
]


@pytest.mark.parametrize("fn, error, fragment", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input(fn, error, fragment):
    with pytest.raises(error) as info:
        fn()
    assert fragment in str(info.value)


def test_case_ids_are_unique():
    ids = [c[0] for c in CASES + CUDA_CASES]
    assert len(ids) == len(set(ids))


# torchmem.runtime.cuda on a build without its CUDA part (CI's CPU torch).
CUDA_CASES = [
    ("cuda-install-not-built", lambda: torchmem.runtime.cuda.install_cuda(), CUDANotBuiltError, "built without its CUDA part"),
    ("cuda-install-unknown-kind", lambda: torchmem.runtime.cuda.install_cuda("arena"), ValueError, "unknown allocator kind"),
    ("cuda-caching_allocator-not-built", lambda: torchmem.runtime.cuda.caching_allocator(), CUDANotBuiltError,
     "built without its CUDA part"),
    ("cuda-pending_frees-not-built", lambda: torchmem.runtime.cuda.pending_frees(), CUDANotBuiltError,
     "built without its CUDA part"),
    ("arena-device-cuda-not-built", lambda: torchmem.Arena(1 << 20, device="cuda"), CUDANotBuiltError,
     "built without its CUDA part"),
    ("arena-block-cuda-not-built", lambda: torchmem.arena(1 << 20, device="cuda:0").__enter__(), CUDANotBuiltError,
     "built without its CUDA part"),
    # An index names a CUDA device, as everywhere in torchmem (torchmem/runtime/devices.py).
    ("arena-device-index-not-built", lambda: torchmem.Arena(1 << 20, device=5), CUDANotBuiltError,
     "built without its CUDA part"),
]


@pytest.mark.skipif(cuda_glue_built(), reason="this build has its CUDA part (tests/cuda covers it)")
@pytest.mark.parametrize("fn, error, fragment", [c[1:] for c in CUDA_CASES], ids=[c[0] for c in CUDA_CASES])
def test_bad_input_cuda_not_built(fn, error, fragment):
    with pytest.raises(error) as info:
        fn()
    assert fragment in str(info.value)


# ---------------------------------------------------------------------------
# File loaders: trace files (snapshot pickles, JSON lines) and planner CSVs


def _write(tmp_path, name, data):
    p = tmp_path / name
    if isinstance(data, bytes):
        p.write_bytes(data)
    else:
        p.write_text(data)
    return str(p)


def _snapshot(entries):
    return pickle.dumps({"segments": [], "device_traces": entries})


def _events(path, **kw):
    return [len(c) for c in load_trace(path, **kw).chunks()]


FILE_CASES = [
    # (id, file name, contents, loader, error, fragment)
    ("trace-empty-file", "e.jsonl", "", _events, trace_types.TraceError, "empty file"),
    ("trace-unknown-format", "g.bin", "hello world", _events, trace_types.TraceError, "unknown format"),
    ("trace-truncated-pickle", "t.pickle", _snapshot([[{"action": "alloc", "addr": 1, "size": 5}]])[:20], _events,
     trace_types.TraceError, "truncated"),
    ("trace-pickle-not-snapshot", "l.pickle", pickle.dumps([1, 2]), _events, trace_types.TraceError, "not a memory snapshot"),
    ("trace-pickle-no-device-traces", "n.pickle", pickle.dumps({"segments": []}), _events, trace_types.TraceError,
     "no device_traces"),
    ("trace-pickle-device-traces-dict", "d.pickle", pickle.dumps({"segments": [], "device_traces": {"a": 1}}), _events,
     trace_types.TraceError, "no device_traces"),
    ("trace-pickle-unknown-action", "a.pickle", _snapshot([[{"action": "boom", "addr": 1, "size": 512}]]), _events, trace_types.TraceError,
     "unknown action 'boom'"),
    ("trace-pickle-entry-not-dict", "x.pickle", _snapshot([[5]]), _events, trace_types.TraceError, "not a trace entry"),
    ("jsonl-not-json", "b.jsonl", '{"op": "alloc", "id": 1, "size"\n', _events, trace_types.TraceError,
     "line 1: not JSON"),
    ("jsonl-array-line", "a.jsonl", '{"op": "alloc", "id": 1, "size": 4}\n[1, 2]\n', _events, trace_types.TraceError,
     "line 2: expected an object"),
    ("jsonl-alloc-0", "z.jsonl", '{"op": "alloc", "id": 1, "size": 0}\n', _events, trace_types.TraceError, "alloc of 0 bytes"),
    ("jsonl-nan-size", "n.jsonl", '{"op": "alloc", "id": 1, "size": NaN}\n', _events, trace_types.TraceError,
     "line 1: size must be an integer"),
    ("jsonl-infinite-size", "i.jsonl", '{"op": "alloc", "id": 1, "size": Infinity}\n', _events, trace_types.TraceError,
     "line 1: size must be an integer"),
    ("jsonl-binary", "bin.jsonl", b"{\xff\xfe\n", _events, trace_types.TraceError, "line 1: not UTF-8"),
    ("csv-empty", "e.csv", "", load_csv, ValueError, "empty file"),
    ("csv-bad-header", "h.csv", "a,b,c,d\n", load_csv, ValueError, ":1: expected header"),
    ("csv-short-row", "s.csv", "id,lower,upper,size\n0,1,2\n", load_csv, ValueError, ":2: expected 4 fields"),
    ("csv-not-integer", "n.csv", "id,lower,upper,size\n0,1,2,x\n", load_csv, ValueError, ":2: lower, upper and size"),
    ("csv-duplicate-id", "d.csv", "id,lower,upper,size\n0,1,2,3\n0,2,3,3\n", load_csv, ValueError, ":3: duplicate id"),
    ("csv-empty-lifetime", "l.csv", "id,lower,upper,size\n0,2,2,3\n", load_csv, ValueError, ":2:"),
    ("csv-negative-size", "m.csv", "id,lower,upper,size\n0,1,2,-3\n", load_csv, ValueError, "negative size"),
    ("csv-a-pickle", "p.csv", pickle.dumps({"segments": []}), load_csv, ValueError, "p.csv: not UTF-8 text, not a CSV"),
]


@pytest.mark.parametrize("name, data, loader, error, fragment", [c[1:] for c in FILE_CASES],
                         ids=[c[0] for c in FILE_CASES])
def test_bad_file(tmp_path, name, data, loader, error, fragment):
    path = _write(tmp_path, name, data)
    with pytest.raises(error) as info:
        loader(path)
    assert fragment in str(info.value)


def test_trace_device_out_of_range(tmp_path):
    path = _write(tmp_path, "s.pickle", _snapshot([[]]))
    for device in (5, -1):
        with pytest.raises(trace_types.TraceError, match=f"no device {device}"):
            load_trace(path, device=device)


def test_directory_and_missing_file(tmp_path):
    with pytest.raises(IsADirectoryError):
        load_trace(str(tmp_path))
    with pytest.raises(FileNotFoundError):
        load_csv(str(tmp_path / "missing.csv"))


# ---------------------------------------------------------------------------
# Command line (in process: main(argv) returns the exit status)

CLI_CASES = [
    # (id, argv, files {name: contents}, exit status, stderr fragment)
    ("cli-no-command", [], {}, 2, ""),
    ("cli-unknown-command", ["frobnicate"], {}, 2, "invalid choice"),
    ("cli-replay-missing-file", ["replay", "{d}/nope.jsonl", "--no-progress"], {}, 1, "no such file"),
    ("cli-replay-bad-capacity", ["replay", "{d}/t.jsonl", "--capacity", "lots", "--no-progress"],
     {"t.jsonl": '{"op": "alloc", "id": 1, "size": 4}\n'}, 2, "argument --capacity: 'lots' is not a size"),
    ("cli-replay-bad-conf", ["replay", "{d}/t.jsonl", "--conf", "x:y", "--no-progress"],
     {"t.jsonl": '{"op": "alloc", "id": 1, "size": 4}\n'}, 2, "argument --conf: allocator config: unknown key 'x'"),
    ("cli-replay-others-over-capacity",
     ["replay", "{d}/t.jsonl", "--capacity", "1GiB", "--in-use-by-others", "2GiB", "--no-progress"],
     {"t.jsonl": '{"op": "alloc", "id": 1, "size": 4}\n'}, 1, "must be less than the capacity"),
    ("cli-replay-bad-event", ["replay", "{d}/t.jsonl", "--no-progress"], {"t.jsonl": '{"op": "free", "id": 1}\n'}, 1,
     "free of id 1"),
    ("cli-replay-not-json", ["replay", "{d}/t.jsonl", "--no-progress"], {"t.jsonl": "{oops\n"}, 1, "not JSON"),
    ("cli-replay-empty", ["replay", "{d}/t.jsonl", "--no-progress"], {"t.jsonl": ""}, 1, "empty file"),
    ("cli-replay-device-out-of-range", ["replay", "{d}/s.pickle", "--device", "3", "--no-progress"],
     {"s.pickle": _snapshot([[]])}, 1, "no device 3"),
    ("cli-replay-device-not-int", ["replay", "{d}/s.pickle", "--device", "x"], {}, 2, "invalid int value"),
    ("cli-plan-missing-file", ["plan", "{d}/nope.csv"], {}, 1, "nope.csv: no such file"),
    ("cli-plan-bad-method", ["plan", "{d}/p.csv", "--method", "fastest"], {}, 2, "invalid choice"),
    ("cli-plan-time-limit-0", ["plan", "{d}/p.csv", "--time-limit", "0"], {"p.csv": "id,lower,upper,size\n0,0,1,4\n"},
     2, "argument --time-limit: must be > 0"),
    ("cli-plan-alignment-0", ["plan", "{d}/p.csv", "--alignment", "0"], {"p.csv": "id,lower,upper,size\n0,0,1,4\n"}, 2,
     "argument --alignment: must be 1 or more"),
    ("cli-plan-bad-csv", ["plan", "{d}/p.csv"], {"p.csv": "id,lower,upper,size\n0,1,1,4\n"}, 1, ":2:"),
    ("cli-plan-empty-csv", ["plan", "{d}/p.csv"], {"p.csv": ""}, 1, "empty file"),
    ("cli-demo-steps-0", ["demo", "--steps", "0"], {}, 2, "argument --steps: must be 1 or more"),
]


def _run_cli(tmp_path, argv, files, capsys):
    for name, data in files.items():
        _write(tmp_path, name, data)
    argv = [a.replace("{d}", str(tmp_path)) for a in argv]
    try:
        status = cli_main(argv)
    except SystemExit as e:
        status = e.code
    return status, capsys.readouterr()


@pytest.mark.parametrize("argv, files, status, fragment", [c[1:] for c in CLI_CASES], ids=[c[0] for c in CLI_CASES])
def test_bad_command_line(tmp_path, capsys, argv, files, status, fragment):
    got, out = _run_cli(tmp_path, argv, files, capsys)
    assert got == status, out.err
    assert fragment in out.err + out.out
    assert "Traceback" not in out.err


# ---------------------------------------------------------------------------
# Crashes and silent wrong answers once found here, now regression tests.


def test_caching_allocator_with_no_device_is_an_error_not_a_crash():
    proc = run_python("""
        from torchmem import _core
        try:
            _core.CachingAllocator(None, "").allocate(100)
        except (TypeError, ValueError) as e:
            print("error:", e)
    """, timeout=120)
    assert proc.returncode == 0 and "error:" in proc.stdout, proc.returncode


def test_arena_with_no_device_is_an_error_not_a_crash():
    proc = run_python("""
        from torchmem import _core
        try:
            _core.Arena(None, 1 << 20)
        except (TypeError, ValueError) as e:
            print("error:", e)
    """, timeout=120)
    assert proc.returncode == 0 and "error:" in proc.stdout, proc.returncode


# Regression tests: planner int64 overflows (sizes near 2**62, alignment
# padding past int64, `torchmem plan` calling such a plan valid) reproduced
# here first, now ValueErrors.
def test_planner_huge_sizes_are_rejected_or_exact():
    big = 2**62
    try:
        plan = solve([(0, 0, 2, big), (1, 0, 2, big), (2, 0, 2, big)], method="greedy")
    except (ValueError, OverflowError):
        return
    assert plan.lower_bound == 3 * big
    assert plan.height >= 3 * big
    assert len(set(plan.offsets)) == 3


def test_planner_huge_alignment_is_rejected_or_exact():
    try:
        plan = solve([(0, 0, 2, 2**62 + 1)], alignment=2**62)
    except (ValueError, OverflowError):
        return
    assert plan.height >= 2**62 + 1


def test_cli_plan_does_not_report_an_overflowed_plan_as_valid(tmp_path, capsys):
    rows = "".join(f"{i},0,2,{2**62}\n" for i in range(3))
    status, out = _run_cli(tmp_path, ["plan", "{d}/big.csv", "--method", "greedy", "--quiet"],
                           {"big.csv": "id,lower,upper,size\n" + rows}, capsys)
    assert status != 0 or "valid        False" in out.out


def test_trace_fractional_size_is_an_error():
    with pytest.raises(trace_types.TraceError):
        sim.replay([{"op": "alloc", "id": 1, "size": 1.7}], "1GiB")


def test_kv_cache_fractional_token_ids_are_an_error():
    with pytest.raises((TypeError, ValueError)):
        _kv().add_sequence([1.5, 2.5])


def test_cli_replay_snapshot_entry_without_addr(tmp_path, capsys):
    status, out = _run_cli(tmp_path, ["replay", "{d}/s.pickle", "--no-progress"],
                           {"s.pickle": _snapshot([[{"action": "alloc", "size": 5}]])}, capsys)
    assert status == 1 and "entry 0: addr must be a non-negative integer" in out.err


def test_cli_replay_infinite_size(tmp_path, capsys):
    status, out = _run_cli(tmp_path, ["replay", "{d}/t.jsonl", "--no-progress"],
                           {"t.jsonl": '{"op": "alloc", "id": 1, "size": Infinity}\n'}, capsys)
    assert status == 1 and "line 1" in out.err


def test_cli_replay_snapshot_device_not_a_list(tmp_path, capsys):
    status, out = _run_cli(tmp_path, ["replay", "{d}/s.pickle", "--no-progress"], {"s.pickle": _snapshot([5])}, capsys)
    assert status == 1 and "Traceback" not in out.err
