"""The differential oracle: PyTorch's own allocator on the fake GPU against torchmem's replay.

Random workloads (tests.support.oracle.generate) under every setting
PyTorch's parser accepts run under the native allocator; each native
snapshot is replayed with no hints and compared entry by entry, block by
block and stat by stat. A diverging case must be an open, named deviation
(deviations.py) with a shrunk reproducer; anything else fails.
benchmarks/bench_native_fidelity.py runs thousands.
"""
import copy
import dataclasses
import functools
import json
import os
import pickle
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from tests.support import oracle
from tests.support.deviations import DEVIATIONS, classify

SUITE_SEEDS = range(int(os.environ.get("TORCHMEM_ORACLE_CASES", "200")))
REPRODUCERS = sorted((Path(__file__).parent / "reproducers").glob("*.json"))
FIXED = sorted((Path(__file__).parent / "fixed").glob("*.json"))

# Which settings this torch's parser refuses: torch 2.6 lacks per_process_memory_fraction and
# large_segment_size_mb (2.10 the latter), and wants max_split_size_mb above 20. Asked of PyTorch itself, in a
# child, so this process keeps its own settings; any other refusal fails.
_REFUSED = """
import json, sys, torch
refused = {}
for conf in json.loads(sys.argv[1]):
    try:
        torch.cuda.memory._set_allocator_settings(conf)
    except (RuntimeError, ValueError) as exc:
        if "nrecognized" not in str(exc) and "too small" not in str(exc):
            raise
        refused[conf] = str(exc).splitlines()[0]
print(json.dumps(refused))
"""


@functools.lru_cache(maxsize=None)
def refused_settings() -> dict[str, str]:
    """{setting: PyTorch's message} for each setting of the suite and the shrunk cases that this torch refuses."""
    confs = sorted({*oracle.SETTINGS, *(oracle.load_reproducer(p).conf for p in REPRODUCERS + FIXED)})
    proc = subprocess.run([sys.executable, "-c", _REFUSED, json.dumps(confs)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def skip_refused(conf: str, what: str) -> None:
    if conf in refused_settings():
        pytest.skip(f"{what}: torch {torch.__version__} refuses the setting {conf!r} ({refused_settings()[conf]})")


@pytest.fixture(scope="module")
def suite():
    workloads = [w for w in (oracle.generate(seed) for seed in SUITE_SEEDS) if w.conf not in refused_settings()]
    return workloads, oracle.check(workloads)


def test_the_settings_this_release_refuses_are_left_out_by_name(suite):
    """Never a silent pass: only the workloads of a setting this torch's parser refuses leave the suite, and a
    warning names each such setting with PyTorch's message."""
    workloads, _ = suite
    refused = {conf: why for conf, why in refused_settings().items() if conf in oracle.SETTINGS}
    in_suite = {w.conf for w in workloads}
    assert not in_suite & set(refused)
    assert in_suite | set(refused) == set(oracle.SETTINGS)
    left_out = sum(1 for seed in SUITE_SEEDS if oracle.generate(seed).conf in refused)
    assert len(workloads) == len(SUITE_SEEDS) - left_out
    if tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 11):
        assert not refused, f"torch {torch.__version__} accepts every key of the suite's settings: {refused}"
    for conf, why in sorted(refused.items()):
        warnings.warn(f"torch {torch.__version__} refuses {conf!r} ({why}): its workloads are left out of the suite")


def test_every_setting_is_in_the_suite():
    confs = {oracle.generate(seed).conf for seed in SUITE_SEEDS}
    assert confs == set(oracle.SETTINGS)


def test_suite_replays_exactly_or_as_a_named_deviation(suite):
    workloads, results = suite
    unexplained = []
    counts = {d.name: 0 for d in DEVIATIONS}
    for w, problems in zip(workloads, results):
        if not problems:
            continue
        deviation = classify(w, problems)
        if deviation is None:
            unexplained.append(f"{w.describe()}: {problems}")
        else:
            counts[deviation.name] += 1
    exact = sum(1 for p in results if not p)
    print(f"\noracle: {exact} of {len(results)} exact; open deviations: {counts}")
    assert not unexplained, "new divergences from PyTorch's allocator:\n" + "\n".join(unexplained[:10])
    assert exact >= len(results) // 2  # the deviations are exceptions, not the rule


def test_suite_covers_what_the_issue_names(suite):
    workloads, _ = suite
    ops = [op for w in workloads for op in w.ops]
    kinds = {op[0] for op in ops}
    assert {"a", "f", "u", "h", "c", "e", "o", "g", "m", "gd", "md"} <= kinds
    sizes = [op[2] for op in ops if op[0] == "a"]
    assert any(s <= 1 << 20 for s in sizes) and any((1 << 20) < s < (10 << 20) for s in sizes)
    assert any(s >= 10 << 20 for s in sizes)
    assert any(w.record_at for w in workloads) and any(w.fraction for w in workloads)
    assert {0, 1, 2} <= {op[3] for op in ops if op[0] == "a"}  # one to three streams


def test_oracle_catches_a_replay_that_differs(tmp_path):
    """The comparison can fail: one allocation moved in a native snapshot is reported."""
    w = oracle.generate(1, conf="")
    reports = oracle.run_native([w], tmp_path)
    path = tmp_path / "0.pickle"
    assert oracle.compare(path, reports[0], w) == []
    snapshot = pickle.loads(path.read_bytes())
    trace = snapshot["device_traces"][0]
    allocs = [e for e in trace if e["action"] == "alloc" and e["size"] < (1 << 20)]
    victim = allocs[len(allocs) // 2]
    moved = copy.deepcopy(snapshot)
    for e in moved["device_traces"][0]:
        if e.get("addr") == victim["addr"] and e["action"] in ("alloc", "free_requested", "free_completed"):
            e["addr"] += 512 * 1024 * 1024 * 1024  # nowhere near a segment
    (tmp_path / "moved.pickle").write_bytes(pickle.dumps(moved))
    problems = oracle.compare(tmp_path / "moved.pickle", reports[0], w)
    assert problems, "a moved allocation went unnoticed"


def test_forked_runs_record_what_fresh_interpreters_record(tmp_path):
    """Note [One import of torch for every setting]: a child forked per setting records the same snapshots and
    statistics as a fresh interpreter per setting, a memory fraction's card and an expandable setting included.
    On one stream: PyTorch orders its free blocks by stream pointer first, and where a process's heap put its
    stream objects differs between a forked child and a fresh interpreter (seed 7 on three streams frees another
    segment first on an OOM)."""
    picked = {"", "expandable_segments:True", "per_process_memory_fraction:0.6"} - set(refused_settings())
    workloads = [one_stream(oracle.generate(seed, conf=conf)) for seed, conf in enumerate(sorted(picked), start=7)]
    workloads.append(one_stream(dataclasses.replace(oracle.generate(3, conf=""), fraction=0.25)))
    (tmp_path / "forked").mkdir(), (tmp_path / "fresh").mkdir()
    forked = oracle.run_native(workloads, tmp_path / "forked")
    fresh = oracle.run_native(workloads, tmp_path / "fresh", fork=False)
    assert all("error" not in r for r in forked + fresh), forked + fresh
    assert [r["stats"] for r in forked] == [r["stats"] for r in fresh]
    for i in range(len(workloads)):
        a, b = (pickle.loads((tmp_path / side / f"{i}.pickle").read_bytes()) for side in ("forked", "fresh"))
        assert relative(a) == relative(b)  # the fake address space starts where each process's mmap put it
        assert a.get("allocator_settings") == b.get("allocator_settings")


def one_stream(w: oracle.Workload) -> oracle.Workload:
    """The workload with every allocation on the default stream and no cross-stream ops."""
    ops = [[*op[:3], 0] if op[0] == "a" else [op[0], op[1], 0] if op[0] == "o" else op
           for op in w.ops if op[0] not in ("u", "h", "c")]
    return dataclasses.replace(w, ops=ops)


def relative(snapshot: dict) -> tuple[list, list]:
    """A snapshot's trace entries and segments with addresses taken from its lowest segment's."""
    entries = oracle._entries(snapshot["device_traces"][0])
    base = min([e[1] for e in entries if e[1] is not None and e[0].startswith("segment")] +
               [s["address"] for s in snapshot["segments"]] or [0])
    layout = sorted((s["address"] - base, s["total_size"],
                     tuple((b["address"] - base, b["size"], b["state"]) for b in s["blocks"]))
                    for s in snapshot["segments"])
    return [(e[0], None if e[1] is None else e[1] - base, e[2]) for e in entries], layout


@functools.lru_cache(maxsize=None)
def checked(paths: tuple[Path, ...]) -> dict[Path, list[str]]:
    """oracle.check's problems for each reproducer this torch takes, all run in one native child (a fresh
    interpreter costs each case seconds of importing torch)."""
    workloads = {p: oracle.load_reproducer(p) for p in paths}
    taken = [p for p, w in workloads.items() if w.conf not in refused_settings()]
    return dict(zip(taken, oracle.check([workloads[p] for p in taken])))


@pytest.mark.parametrize("path", REPRODUCERS, ids=[p.stem for p in REPRODUCERS])
def test_reproducer_still_shows_its_deviation(path):
    data = json.loads(path.read_text())
    w = oracle.load_reproducer(path)
    skip_refused(w.conf, path.name)
    problems = checked(tuple(REPRODUCERS))[path]
    made_on = data.get("torch", "2.14.1")
    if not problems and not torch.__version__.startswith(made_on):
        pytest.skip(f"{path.name} was shrunk on torch {made_on}; torch {torch.__version__} replays it exactly")
    assert problems, f"{path.name} now replays exactly: the {data['deviation']} deviation is fixed (or moved); " \
                     "update tests/support/deviations.py and keep this case as a test of the fix"
    found = classify(w, problems)
    assert found is not None and found.name == data["deviation"], problems


@pytest.mark.parametrize("path", FIXED, ids=[p.stem for p in FIXED])
def test_fixed_deviation_stays_fixed(path):
    """Reproducers of deviations since fixed: each replays exactly now, but where this release records no
    pool_id and the case's private-pool allocations land in the default pool (unrecorded-pool)."""
    w = oracle.load_reproducer(path)
    skip_refused(w.conf, path.name)
    problems = checked(tuple(FIXED))[path]
    found = classify(w, problems) if problems else None
    if found is not None and found.name == "unrecorded-pool":
        pytest.skip(f"{path.name}: torch {torch.__version__} writes no pool_id, an open deviation: {problems[0]}")
    assert problems == [], f"{path.name} diverges again: {problems}"


def test_every_deviation_has_a_reproducer():
    named = {json.loads(p.read_text())["deviation"] for p in REPRODUCERS}
    assert named == {d.name for d in DEVIATIONS}
