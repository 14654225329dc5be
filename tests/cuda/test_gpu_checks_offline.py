"""The GPU checks, checked where no GPU is: a GPU run is rare, and a typo found
there wastes it.

- Each child's code (the *_CHILD constants of test_cuda_semantics.py and
  test_cuda_pressure.py, with the preludes it runs under) compiles, names
  nothing undefined (pyflakes, where installed), and every torch.X.Y, every
  torchmem.runtime.cuda function, every method called on a graph, pool, stream or
  tensor and every keyword given to a Python-level torch function exists in
  the installed torch (a CPU build defines the torch.cuda API too).
- Every key a check expects is one its child notes; an ideal run (what
  PyTorch's allocator gives) passes every check, and a wrong one fails with
  each difference named.
- The helpers collect notes from a child that dies, and check_noted runs the
  native control when torchmem differs.
- The replay check and the benchmark's driver (its GPT-2 model, tables,
  budget and exact replay comparison) run on the CPU.
"""
import ast
import importlib
import inspect
import json
import os
import pathlib
import pickle
import sys
import textwrap

import pytest
import torch

import torchmem.runtime.cuda
from tests.cuda import cuda_helpers, test_cuda_pressure, test_cuda_semantics
from tests.cuda.cuda_helpers import COMMON, MiB, NOTES, PRELUDE, ROOT, check_noted, differences, run_noted

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

MODULES = (test_cuda_semantics, test_cuda_pressure)


def short_name(module) -> str:
    """A test module's name within tests/cuda: test_cuda_semantics."""
    return module.__name__.rsplit(".", 1)[-1]


CHILDREN = {f"{short_name(m)}.{name}": code for m in MODULES for name, code in vars(m).items()
            if name.endswith("_CHILD") and isinstance(code, str)}

# What torch factory functions and constructors return, for the methods called on their results.
RETURNS = {
    "torch.empty": torch.Tensor, "torch.full": torch.Tensor, "torch.ones": torch.Tensor, "torch.zeros": torch.Tensor,
    "torch.randn": torch.Tensor, "torch.randint": torch.Tensor, "torch.arange": torch.Tensor, "torch.eye": torch.Tensor,
    "torch.cuda.current_stream": torch.cuda.Stream,
}


def full_source(code: str, install: bool = True) -> str:
    return (PRELUDE if install else COMMON) + NOTES + \
        textwrap.dedent(code)


def dotted(node) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id] + parts[::-1])
    return None


def resolve(name: str):
    """The object a dotted name starting at torch or tmcuda stands for; AttributeError if missing."""
    root, *rest = name.split(".")
    obj = {"torch": torch, "tmcuda": torchmem.runtime.cuda}[root]
    for part in rest:
        obj = getattr(obj, part)
    return obj


def api_problems(code: str) -> list[str]:
    """Names of torch and torchmem.runtime.cuda, methods of what torch made, and keywords of
    Python-level torch functions that the code uses and the installed torch lacks."""
    tree = ast.parse(full_source(code))
    set_parents(tree)
    problems = []
    typed: dict[str, type] = {}  # variable -> the class of what was assigned to it
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            callee = dotted(node.value.func)
            for target in node.targets:
                if isinstance(target, ast.Name) and callee and callee.split(".")[0] == "torch":
                    try:
                        obj = resolve(callee)
                    except AttributeError:
                        continue
                    cls = RETURNS.get(callee, obj if isinstance(obj, type) else None)
                    if cls is not None:
                        typed[target.id] = cls
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and not isinstance(getattr(node, "parent", None), ast.Attribute):
            name = dotted(node)
            if name is None:
                continue
            root = name.split(".")[0]
            if root in ("torch", "tmcuda"):
                try:
                    resolve(name)
                except AttributeError:
                    problems.append(f"{name} does not exist in torch {torch.__version__}")
            elif root in typed and "." in name:
                attr = name.split(".")[1]
                if not hasattr(typed[root], attr):
                    problems.append(f"{root}.{attr}: {typed[root].__qualname__} has no {attr}")
        if isinstance(node, ast.Call):
            name = dotted(node.func)
            if not name or name.split(".")[0] not in ("torch", "tmcuda"):
                continue
            try:
                fn = resolve(name)
                signature = inspect.signature(fn)
            except (AttributeError, TypeError, ValueError):
                continue  # a builtin without a Python signature
            if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
                continue
            try:
                signature.bind_partial(*node.args, **{k.arg: k.value for k in node.keywords})
            except TypeError as e:
                problems.append(f"{name}(...): {e}")
    return problems


def set_parents(tree):
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            child.parent = node


@pytest.mark.parametrize("name", sorted(CHILDREN))
def test_child_code_compiles_and_names_what_exists(name):
    code = CHILDREN[name]
    source = full_source(code)
    compile(source, name, "exec")
    compile(full_source(code, install=False), name, "exec")
    try:
        from pyflakes import api as flakes_api
        from pyflakes import reporter as flakes_reporter
    except ImportError:
        flakes_api = None
    if flakes_api is not None:
        import io

        out = io.StringIO()
        flakes_api.check(source, name, flakes_reporter.Reporter(out, out))
        serious = [line for line in out.getvalue().splitlines()
                   if "imported but unused" not in line and "redefinition of unused" not in line
                   and "is assigned to but never used" not in line]
        assert not serious, "\n".join(serious)
    problems = api_problems(code)
    assert not problems, "\n".join(problems)


def test_the_api_check_catches_what_does_not_exist():
    problems = api_problems("""
        g = torch.cuda.CUDAGraph()
        g.replay_twice()
        x = torch.empty(4, device="cuda")
        x.record_streams(None)
        torch.cuda.memory._record_memory_history(max_entry=10)
        torch.cuda.no_such_thing()
        tmcuda.pool_counts(0)
        """)
    assert any("g.replay_twice" in p for p in problems)
    assert any("x.record_streams" in p for p in problems)
    assert any("_record_memory_history" in p and "max_entry" in p for p in problems)
    assert any("torch.cuda.no_such_thing" in p for p in problems)
    assert any("tmcuda.pool_counts" in p for p in problems)


def noted_keys(code: str) -> set[str]:
    keys = set()
    for node in ast.walk(ast.parse(textwrap.dedent(code))):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("note", "attempt")
                and node.args and isinstance(node.args[0], ast.Constant)):
            keys.add(node.args[0].value)
    return keys


def expected_by_check() -> list[tuple[str, str, dict]]:
    """(test function, child constant name, expected dict) of every check_noted call, from the source."""
    found = []
    for module in MODULES:
        tree = ast.parse(inspect.getsource(module))
        for fn in [n for n in tree.body if isinstance(n, ast.FunctionDef)]:
            for node in ast.walk(fn):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "check_noted":
                    child = node.args[1].id
                    expected = eval(compile(ast.Expression(node.args[2]), module.__file__, "eval"), vars(module))
                    found.append((f"{short_name(module)}.{fn.name}", f"{short_name(module)}.{child}", expected))
    return found


def test_every_expected_key_is_noted_by_its_child():
    checks = expected_by_check()
    assert len(checks) >= 6
    for test, child, expected in checks:
        missing = set(expected) - noted_keys(CHILDREN[child])
        assert not missing, f"{test} expects {sorted(missing)}, which {child} never notes"


GiB = 1 << 30
# What a correct run notes (PyTorch's own allocator's values, torchmem's counts where it has them).
IDEAL = {
    "test_cuda_semantics.GRAPH_CHILD": {
        "capture_violations": 0, "pools_after_capture": 1, "pool_segments": 2, "outputs_in_pool_segments": [True, True],
        "outputs_owned_by_default_pool": [False, False], "outside_in_pool_segments": 0,
        "replays": [[2 * k + 1, 2 * k + 1, 3000 * k + 10 * (2 * k + 1)] for k in range(5)],
        "outside_intact": True, "outside_in_pool_segments_after": 0, "pool_segments_kept": True,
        "pools_after_second_capture": 1, "chained": [11.0, 110.0, 110.0], "pools_while_outputs_live": 1,
        "outputs_after_graphs_deleted": [11.0, 15110.0], "pools_after_outputs_freed": 0,
        "pool_segments_left_after_release": 0, "works_after": float(1 << 20)},
    "test_cuda_semantics.MEMPOOL_CHILD": {
        "owned_by_default_pool": [False, False, True], "in_pool_snapshot": [True, True, False], "pools": 1,
        "use_count": 1, "a2_in_pool_snapshot": True, "values": [6.0 * (1 << 20), 400.0, 5.0 * (1 << 20)],
        "values_after_pool_deleted": [6.0 * (1 << 20), 400.0, float(1 << 20)], "pools_after_its_tensors_freed": 0,
        "pools_at_end": 0, "works_after": float(1 << 20)},
    "test_cuda_semantics.GRAPH_IN_MEMPOOL_CHILD": {
        "graph_with_pool_id": 9.0, "graph_output_in_mempool": True, "graph_inside_use_mem_pool": 9.0,
        "graph_inside_use_mem_pool_captured": True, "works_after": 1000.0, "pools_at_end": 0},
    "test_cuda_semantics.RECORD_STREAM_CHILD": {
        "race": [{"n": n, "reused": False, "y_intact": True, "pending": 1, "allocated_drop": max(512, 4 * n)}
                 for n in (256, 1 << 18, 1 << 22) for _ in range(3)],
        "pending_after_sync": 0, "reserved_after_empty": 16 * MiB},
    "test_cuda_semantics.NATIVE_HISTORY_CHILD": {"total": 140 * GiB, "peaks": [2 * GiB, 3 * GiB]},
    "test_cuda_pressure.PRESSURE_CHILD": {
        "free_at_start": 139 * GiB, "first_oom": ["torch.OutOfMemoryError", True],
        "second_oom": ["torch.OutOfMemoryError", True], "fill_seconds": 3.0, "reserved_share_when_full": 0.999,
        "num_ooms": 2, "segments_when_full": 1, "expandable": True, "reallocated": True, "realloc_seconds": 0.5,
        "values_ok": True, "third_oom": ["torch.OutOfMemoryError", True], "empty_cache_seconds": 1.0,
        "reserved_after_empty": 0, "free_back_share": 0.999, "whole_ok": True, "whole_seconds": 2.0,
        "works_after": True},
}


def ideal(child: str) -> cuda_helpers.Noted:
    noted = cuda_helpers.Noted(IDEAL[child])
    noted.returncode = 0
    return noted


def test_the_ideal_run_covers_every_noted_key():
    for child, code in CHILDREN.items():
        assert set(IDEAL[child]) == noted_keys(code), child


def accepts_none(predicate) -> bool:
    try:
        return predicate(None) is True
    except Exception:
        return False


def test_an_ideal_run_passes_every_check_and_a_wrong_one_names_each_difference():
    for test, child, expected in expected_by_check():
        assert differences(ideal(child), expected) == [], test
        wrong = ideal(child)
        for key in expected:
            wrong[key] = None  # what a child that got nothing right would note
        wrong.returncode = -6
        diff = differences(wrong, expected)
        allowed_none = {k for k, v in expected.items() if callable(v) and accepts_none(v)}
        assert {d.split(":")[0] for d in diff} == set(expected) - allowed_none | {"exit status -6"}, test


# --------------------------------------------------------------------- the helpers, on the CPU


def test_run_noted_returns_what_a_dying_child_noted():
    noted = run_noted("""
        note("installed", INSTALLED)
        note("pools", pool_count())
        attempt("raises", lambda: 1 / 0)
        attempt("returns", lambda: [1, 2])
        os.abort()
        note("never", True)
        """, install=False, timeout=60)
    assert noted["installed"] is False and noted["pools"] is None
    assert noted["raises"].startswith("raised ZeroDivisionError")
    assert noted["returns"] == [1, 2] and "never" not in noted
    assert noted.returncode != 0 and differences(noted, {"returns": [1, 2]}) == [f"exit status {noted.returncode}"]


@pytest.mark.skipif(torch.cuda.is_available() and not cuda_helpers.FAKE_GPU,
                    reason="waits for a timeout; where a GPU is, the GPU checks use run_noted for real")
def test_run_noted_passes_the_settings_to_the_native_allocator_and_keeps_notes_on_timeout():
    noted = run_noted("""
        note("conf", os.environ.get("PYTORCH_CUDA_ALLOC_CONF"))
        note("extra", os.environ.get("EXTRA"))
        time.sleep(300)
        """, conf="expandable_segments:True", install=False, timeout=20, env={"EXTRA": "1"})  # import torch: 2-4 s here
    assert noted.returncode == -1 and "timed out" in noted.stderr
    assert noted["conf"] == "expandable_segments:True" and noted["extra"] == "1"


def test_check_noted_reports_torchmem_and_the_native_control(monkeypatch):
    runs = []

    def fake_run_noted(code, conf="", install=True, timeout=120):
        runs.append(install)
        noted = cuda_helpers.Noted({"a": 1, "b": 2 if install else 3})
        noted.returncode, noted.stderr = 0, "stderr of " + ("torchmem" if install else "native")
        return noted

    monkeypatch.setattr(cuda_helpers, "run_noted", fake_run_noted)
    assert check_noted("ok", "", {"a": 1, "b": 2}) is not None and runs == [True]
    with pytest.raises(AssertionError) as failure:
        check_noted("demo", "", {"a": 1, "b": cuda_helpers.that("3", lambda v: v == 3)})
    message = str(failure.value)
    assert runs == [True, True, False]
    assert message.splitlines()[0] == "demo: 1 check(s) differ under torchmem: b"
    assert "b: got 2, expected 3" in message
    assert "native allocator on the same code: all checks pass" in message
    assert "stderr of torchmem" in message

    def timed_out(code, conf="", install=True, timeout=120):
        runs.append(install)
        noted = cuda_helpers.Noted({"a": 1})
        noted.returncode, noted.stderr = -1, "timed out after 120 s"
        return noted

    monkeypatch.setattr(cuda_helpers, "run_noted", timed_out)
    with pytest.raises(AssertionError, match="not run, torchmem's run timed out"):
        check_noted("slow", "", {"a": 1})
    assert runs == [True, True, False, True]


def test_a_predicate_that_raises_is_a_difference():
    noted = cuda_helpers.Noted({"v": None})
    diff = differences(noted, {"v": cuda_helpers.that("over 1", lambda v: v > 1)})
    assert len(diff) == 1 and "TypeError in the check" in diff[0] and "expected over 1" in diff[0]


# --------------------------------------------------------------------- replay check and benchmark, on the CPU


@pytest.fixture(scope="module")
def recorded_snapshot(tmp_path_factory):
    """A history of torchmem's caching allocator on a simulated 4 GiB device, in PyTorch's format."""
    from tests.support.replay_recording import random_workload, record

    snapshot = record(random_workload(3, 1500, streams=2, empty_cache_every=600), "", capacity=4 * GiB)
    path = tmp_path_factory.mktemp("snap") / "recorded.pickle"
    path.write_bytes(pickle.dumps(snapshot))
    return path


def test_the_replay_check_passes_an_exact_history_and_names_a_wrong_one(recorded_snapshot, tmp_path, monkeypatch):
    assert test_cuda_semantics.replay_problems(recorded_snapshot, 4 * GiB) == []
    problems = test_cuda_semantics.replay_problems(recorded_snapshot, 4 * GiB, peaks=[1, 2])
    assert len(problems) == 2 and problems[0].startswith("peaks (allocated, reserved): recorded [1, 2]")
    assert json.loads(problems[1])["exact"] is True

    snapshot = pickle.loads(recorded_snapshot.read_bytes())
    snapshot["segments"] = snapshot["segments"][1:]  # a final state the trace contradicts
    broken = tmp_path / "broken.pickle"
    broken.write_bytes(pickle.dumps(snapshot))
    problems = test_cuda_semantics.replay_problems(broken, 4 * GiB)
    assert problems and problems[0].startswith("torchmem replay exited 1")

    replay = test_cuda_semantics.sim.replay

    def replay_losing_a_segment(*args, **kwargs):
        result = replay(*args, **kwargs)
        result.segments = result.segments[1:]
        return result

    monkeypatch.setattr(test_cuda_semantics.sim, "replay", replay_losing_a_segment)
    problems = test_cuda_semantics.replay_problems(recorded_snapshot, 4 * GiB)
    assert problems and problems[0].startswith("final segments differ block by block")


def test_bench_replay_comparison_on_a_recorded_history(recorded_snapshot):
    bench = importlib.import_module("bench_cuda")
    replayed = test_cuda_semantics.sim.replay(str(recorded_snapshot), capacity=4 * GiB)
    run = {"workload": "demo", "snapshot": str(recorded_snapshot), "gpu_total_bytes": 4 * GiB,
           "peak_allocated": replayed.peak_allocated, "peak_reserved": replayed.peak_reserved}
    (row,) = bench.replay_comparison([run])
    assert "error" not in row, row
    assert row["exact"] and row["final_layout_match"] and row["peaks_match"] and row["segments_match"]
    table = bench.replay_table([row, {"workload": "gpt2", "error": "boom"}])
    assert "(exact)" in table and "| match |" in table and "| gpt2 | boom |" in table


def test_bench_replays_an_earlier_runs_histories(recorded_snapshot, tmp_path):
    """--replay RESULTS_JSON DIR: the histories a GPU run kept, replayed where no GPU is; looked up by name."""
    bench = importlib.import_module("bench_cuda")
    replayed = test_cuda_semantics.sim.replay(str(recorded_snapshot), capacity=4 * GiB)
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "demo_native_snapshot.pickle").write_bytes(pathlib.Path(recorded_snapshot).read_bytes())
    results = tmp_path / "bench_cuda.json"
    results.write_text(json.dumps({"native_history": [
        {"workload": "demo", "snapshot": "/elsewhere/demo_native_snapshot.pickle", "gpu_total_bytes": 4 * GiB,
         "peak_allocated": replayed.peak_allocated, "peak_reserved": replayed.peak_reserved},
        {"workload": "lost", "snapshot": "/elsewhere/lost_native_snapshot.pickle", "gpu_total_bytes": 4 * GiB}]}))
    runs = bench.earlier_history(str(results), str(kept))
    assert [(r["workload"], r["snapshot"]) for r in runs] == [("demo", str(kept / "demo_native_snapshot.pickle"))]
    (row,) = bench.replay_comparison(runs)
    assert row["exact"] and row["final_layout_match"] and row["peaks_match"], row


def test_bench_gpt2_model_trains_on_the_cpu():
    bench = importlib.import_module("bench_cuda")
    model = bench.gpt2_model(torch, vocab=101, dim=32, layers=2, heads=4, max_len=16)
    idx = torch.randint(0, 101, (2, 9))
    logits = model(idx[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 101), idx[:, 1:].reshape(-1))
    loss.backward()
    assert logits.shape == (2, 8, 101) and model.tok.weight.grad is not None


def test_bench_tables_and_budget():
    bench = importlib.import_module("bench_cuda")

    def run(w, a, rnd, ms, reserved=100 * MiB):
        return {"workload": w, "allocator": a, "round": rnd, "step_ms_median": ms, "peak_allocated": 50 * MiB,
                "peak_reserved": reserved, "num_device_alloc": 3}

    results = [run("gpt2", "native", 1, 10.0), run("gpt2", "torchmem", 1, 11.0, 90 * MiB),
               run("gpt2", "native", 2, 10.0), {"workload": "gpt2", "allocator": "torchmem", "error": "Traceback\nboom"},
               {"workload": "empty_del", "allocator": "native", "error": "timed out after 60 s"},
               run("empty_del", "torchmem", 1, 2.0)]
    table = bench.summarise(results)
    rows = {tuple(c.strip() for c in line.split("|")[1:3]): line for line in table.splitlines()[2:]}
    assert "| 1.100 | 1.100 |" in rows[("gpt2", "torchmem")] and "(1 failed)" in rows[("gpt2", "torchmem")]
    assert "| 90.0 |" in rows[("gpt2", "torchmem")] and "| 100.0 |" in rows[("gpt2", "native")]
    assert "failed: timed out after 60 s" in rows[("empty_del", "native")]
    assert "| nan |" in rows[("empty_del", "torchmem")]

    budget = bench.Budget(100, first_guess=30)
    assert budget.allows("gpt2") and budget.timeout(60) == 60
    budget.done("gpt2", {"wall_s": 97.0})
    assert not budget.allows("gpt2") and budget.allows("empty_del")
    assert bench.Budget(None, 30).allows("x") and bench.Budget(None, 30).timeout(60) == 60


def test_bench_without_a_gpu_measures_nothing(tmp_path):
    import subprocess

    env = dict(os.environ)
    if torch.cuda.is_available():
        if not cuda_helpers.FAKE_GPU:
            pytest.skip("a GPU is here")
        # On the fake GPU: the same interpreter without the fake runtime is a machine without a GPU.
        env = {k: v for k, v in env.items() if not k.startswith(("LD_PRELOAD", "TORCHMEM_FAKEGPU"))}
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "bench_cuda.py"), "--out", str(tmp_path),
                           "--budget", "30", "--rounds", "2"], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0 and "no CUDA GPU here" in proc.stdout, proc.stderr


def test_bench_driver_alternates_records_replays_and_keeps_to_its_budget(tmp_path, monkeypatch):
    bench = importlib.import_module("bench_cuda")
    calls = []

    def fake_spawn(workload, allocator, out, record, timeout, tag="", steps=None):
        calls.append((workload, allocator, record, tag, steps, timeout))
        result = {"workload": workload, "allocator": allocator, "step_ms_median": 10.0 if allocator == "native" else 9.0,
                  "peak_allocated": MiB, "peak_reserved": 2 * MiB, "num_device_alloc": 1, "wall_s": 1.0}
        if record:
            result.update(snapshot=os.path.join(out, f"{workload}.pickle"), gpu_total_bytes=GiB)
        return result

    def fake_replays(history):
        return [{"workload": h["workload"], "placements_matched": 5, "placements": 5, "exact": True,
                 "final_layout_match": True, "native_peak_allocated": MiB, "replay_peak_allocated": MiB,
                 "native_peak_reserved": 2 * MiB, "replay_peak_reserved": 2 * MiB, "native_segments": 1,
                 "replay_segments": 1} for h in history]

    monkeypatch.setattr(bench, "spawn", fake_spawn)
    monkeypatch.setattr(bench, "replay_comparison", fake_replays)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    # The two workloads of a GPU run (the defaults there; the fake GPU's leave out gpt2).
    monkeypatch.setattr(sys, "argv", ["bench_cuda.py", "--out", str(tmp_path), "--rounds", "2", "--timeout", "60",
                                      "--workloads", "empty_del,gpt2"])
    assert bench.main() == 0
    assert [(w, a, r, t) for w, a, r, t, _, _ in calls] == [
        ("empty_del", "native", False, "_round1"), ("empty_del", "torchmem", False, "_round1"),
        ("gpt2", "native", False, "_round1"), ("gpt2", "torchmem", False, "_round1"),
        ("empty_del", "native", True, ""), ("gpt2", "native", True, ""),
        ("empty_del", "native", False, "_round2"), ("empty_del", "torchmem", False, "_round2"),
        ("gpt2", "native", False, "_round2"), ("gpt2", "torchmem", False, "_round2")]
    assert all(steps == (10 if record else None) for _, _, record, _, steps, _ in calls)
    saved = json.loads((tmp_path / "bench_cuda.json").read_text())
    assert len(saved["runs"]) == 8 and len(saved["native_history"]) == 2 and saved["skipped"] == []
    table = (tmp_path / "bench_cuda.md").read_text()
    assert "| gpt2 | torchmem | 2 | 9.000 | 0.900 | 0.900, 0.900 |" in table and "5 of 5 (exact)" in table

    # 100 s for runs of 30 s (a clock that moves 30 s a run): three run, the last with what is left as its
    # timeout, the rest are named as not run.
    calls.clear()
    clock = [0.0]

    def slow_spawn(*args, **kwargs):
        clock[0] += 30
        return dict(fake_spawn(*args, **kwargs), wall_s=30.0)

    monkeypatch.setattr(bench, "spawn", slow_spawn)
    monkeypatch.setattr(bench.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(sys, "argv", ["bench_cuda.py", "--out", str(tmp_path), "--budget", "100", "--timeout", "60",
                                      "--workloads", "empty_del,gpt2"])
    assert bench.main() == 0
    saved = json.loads((tmp_path / "bench_cuda.json").read_text())
    assert [(w, a, t) for w, a, _, t, _, _ in calls] == [
        ("empty_del", "native", "_round1"), ("empty_del", "torchmem", "_round1"), ("gpt2", "native", "_round1")]
    assert [c[-1] for c in calls] == [60, 60, 35]
    assert len(saved["skipped"]) == 7 and "Not run, out of time: gpt2 torchmem round1" in (tmp_path / "bench_cuda.md").read_text()
