"""The differential oracle: PyTorch's own allocator, on the fake GPU, against torchmem's replay.

A generator makes random workloads (sizes across the small pool, 1-10 MiB and
large; one to three streams with record_stream and held-back events;
empty_cache; memory fractions; caught out-of-memory errors; CUDA graphs and
torch.cuda.MemPool; runs recorded from mid-way; histories whose ring wraps;
memory held outside PyTorch, as a real GPU's CUDA context holds it) under
every setting PyTorch's parser accepts. Each runs under
PyTorch's native allocator on the fake GPU (tests.support.oracle_child),
which writes a native snapshot; torchmem's replay of that snapshot, given no
hints, must then reproduce it:

- the recorded trace entry by entry (alloc, free_completed,
  segment_alloc/free/map/unmap, oom): the same action, address and size, so
  every allocation lands at its native address, segments come in the same
  sizes and order, and every OOM at its entry;
- the final segments block by block;
- for runs whose snapshot holds the whole run, the statistics PyTorch reported.

A diverging case is shrunk (ops removed while it still diverges) to a short
reproducer. `check()` runs workloads and returns their problems; the tests
(tests/fakegpu/test_native_oracle.py) and benchmarks/bench_native_fidelity.py
use it. Run it on a process that can start the fake GPU (its libraries built).
"""
from __future__ import annotations

import json
import os
import pickle
import random
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterable

from torchmem import fakegpu
from torchmem.formats.snapshot_format import block_state

ROOT = str(Path(__file__).resolve().parents[2])  # the checkout: the oracle child runs as tests.support.oracle_child

MiB = 1 << 20
GiB = 1 << 30

# Every key PyTorch's parser accepts that changes the allocator's decisions,
# alone and in pairs. garbage_collection_threshold acts only with a memory fraction.
SETTINGS: tuple[str, ...] = (
    "",
    "expandable_segments:True",
    "max_split_size_mb:40",
    "max_split_size_mb:200",
    "max_split_size_mb:100,max_non_split_rounding_mb:40",
    "roundup_power2_divisions:4",
    "roundup_power2_divisions:1",
    "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]",
    "garbage_collection_threshold:0.6",
    "per_process_memory_fraction:0.6",
    "large_segment_size_mb:40",
    "expandable_segments:True,roundup_power2_divisions:2",
    "expandable_segments:True,max_split_size_mb:100",
    "max_split_size_mb:60,garbage_collection_threshold:0.7",
    "roundup_power2_divisions:8,max_split_size_mb:120",
    "expandable_segments:True,garbage_collection_threshold:0.5",
)

TRACE_ACTIONS = ("alloc", "free_completed", "segment_alloc", "segment_free", "segment_map",
                 "segment_unmap", "oom")


@dataclass
class Workload:
    """One oracle case. Ops are documented in tests/support/oracle_child.py."""

    seed: int
    conf: str
    card: int
    ops: list = field(default_factory=list)
    fraction: float | None = None
    record_at: int = 0  # 0: recorded from the start; else the op where recording begins
    # Python stacks on every trace entry (PyTorch's default context="all"); else none (context=None):
    # odd seeds record them, so the replay's rules for either kind of snapshot are held to PyTorch.
    stacks: bool = False
    held: int = 0  # bytes of the card held outside PyTorch's allocator, as a real GPU's CUDA context holds them
    max_entries: int = 0  # the history's ring (_record_memory_history's max_entries); 0: a million, no wrap

    @property
    def from_start(self) -> bool:
        """Whether the snapshot may hold the whole run: recorded from the first op, into a ring that never wraps."""
        return not self.record_at and not self.max_entries

    def describe(self) -> str:
        parts = [f"seed {self.seed}", f"conf {self.conf or '(defaults)'}", f"card {self.card / GiB:g} GiB",
                 f"{len(self.ops)} ops"]
        if self.fraction:
            parts.append(f"fraction {self.fraction:g}")
        if self.record_at:
            parts.append(f"recorded from op {self.record_at}")
        if self.stacks:
            parts.append("with stacks")
        if self.held:
            parts.append(f"{self.held / MiB:g} MiB held by others")
        if self.max_entries:
            parts.append(f"a ring of {self.max_entries} entries")
        return ", ".join(parts)


def _size(rng: random.Random, card: int) -> int:
    kind = rng.random()
    if kind < 0.45:
        return rng.randint(1, MiB)
    if kind < 0.8:
        return rng.randint(MiB + 1, 10 * MiB)
    return rng.randint(10 * MiB, max(10 * MiB + 1, min(card // 6, GiB)))


def generate(seed: int, conf: str | None = None) -> Workload:
    """A random workload; `conf` picks the setting (default: drawn from SETTINGS)."""
    rng = random.Random(seed)
    conf = rng.choice(SETTINGS) if conf is None else conf
    card = rng.choice([1, 2, 4, 8]) * GiB
    fraction = round(rng.uniform(0.5, 0.95), 2) if ("garbage_collection" in conf or rng.random() < 0.15) else None
    streams = rng.choice([1, 1, 2, 3])
    ops: list = []
    live: list[int] = []
    held: set[int] = set()
    next_id = 0
    for _ in range(rng.randint(40, 220)):
        r = rng.random()
        if r < 0.5 or not live:
            ops.append(["a", next_id, _size(rng, card), rng.randrange(streams)])
            live.append(next_id)
            next_id += 1
        elif r < 0.85:
            ops.append(["f", live.pop(rng.randrange(len(live)))])
        elif r < 0.9 and streams > 1:
            ops.append(["u", rng.choice(live), rng.randrange(1, streams)])
        elif r < 0.93 and streams > 1:
            s = rng.randrange(1, streams)
            ops.append(["c", s] if s in held else ["h", s])
            held.symmetric_difference_update({s})
        elif r < 0.96:
            ops.append(["e"])
        else:
            ops.append(["o", int(card * rng.uniform(0.3, 1.2)), rng.randrange(streams)])
    if rng.random() < 0.1:  # CUDA graphs and torch.cuda.MemPool: private pools
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(len(ops) + 1)
            kind = rng.choice(["g", "m"])
            ops.insert(at, [kind, [_size(rng, card // 4) for _ in range(rng.randint(1, 4))]])
            if rng.random() < 0.5:
                ops.insert(rng.randrange(at + 1, len(ops) + 1), [kind + "d"])
    record_at = rng.randrange(1, len(ops) // 2) if rng.random() < 0.2 else 0
    # Drawn apart, so that the draws above stay what they were for every seed.
    extra = random.Random(seed ^ 0x5EED)
    held = extra.randint(1, card // (32 * MiB)) * 2 * MiB if extra.random() < 0.5 else 0
    max_entries = extra.randint(30, 200) if extra.random() < 0.1 else 0
    return Workload(seed, conf, card, ops, fraction, record_at, stacks=seed % 2 == 1, held=held,
                    max_entries=max_entries)


# ------------------------------------------------------------------ running natively


def run_native(workloads: list[Workload], out_dir: str | os.PathLike[str], timeout: float = 600,
               fork: bool = True) -> list[dict]:
    """Runs workloads under PyTorch's allocator on the fake GPU, one process per setting (forked from one
    interpreter where this torch allows: Note [One import of torch for every setting] in oracle_child).

    Writes out_dir/<i>.pickle (the native snapshot of workloads[i]) and returns
    what PyTorch reported for each ({"stats", "oom_caught", "torch"}, or
    {"error": ...} when its process failed). fork=False starts a fresh
    interpreter per setting.
    """
    out = Path(out_dir)
    # PyTorch reads the settings once, and takes a memory fraction's limit from the card's size
    # at start-up: a workload with a fraction runs in a process started on its own card.
    by_conf: dict[tuple[str, int | None], list[int]] = {}
    for i, w in enumerate(workloads):
        by_conf.setdefault((w.conf, w.card if w.fraction or "fraction" in w.conf else None), []).append(i)
    reports: list[dict] = [{} for _ in workloads]
    with tempfile.TemporaryDirectory(prefix="torchmem-oracle-") as tmp:
        groups = []
        for g, ((conf, _), indices) in enumerate(by_conf.items()):
            folder = Path(tmp) / str(g)
            folder.mkdir()
            (folder / "workloads.json").write_text(json.dumps([asdict(workloads[i]) for i in indices]))
            groups.append({"conf": conf, "card": max(workloads[i].card for i in indices),
                           "spec": str(folder / "workloads.json"), "out": str(folder), "indices": indices})
        (Path(tmp) / "groups.json").write_text(json.dumps(groups))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
        env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        env.pop("PYTORCH_ALLOC_CONF", None)
        forked = fork
        if fork:
            proc = fakegpu.run([sys.executable, "-m", "tests.support.oracle_child", "--groups",
                                str(Path(tmp) / "groups.json")], card=max(group["card"] for group in groups),
                               env=env, capture_output=True, text=True, timeout=timeout * len(groups))
            forked = proc.returncode != NO_FORK
        for group in groups:
            if not forked:  # this torch reads its settings before a fork: a process per group
                group_env = dict(env, PYTORCH_CUDA_ALLOC_CONF=group["conf"])
                proc = fakegpu.run([sys.executable, "-m", "tests.support.oracle_child", group["spec"],
                                    group["out"]], card=group["card"], env=group_env, capture_output=True,
                                   text=True, timeout=timeout)
            for k, i in enumerate(group["indices"]):
                report_file, snapshot_file = Path(group["out"]) / f"{k}.json", Path(group["out"]) / f"{k}.pickle"
                if report_file.exists():
                    reports[i] = json.loads(report_file.read_text())
                    os.replace(snapshot_file, out / f"{i}.pickle")
                else:
                    reports[i] = {"error": f"native run exited {proc.returncode}: {proc.stderr[-2000:]}"}
    return reports


NO_FORK = 4  # oracle_child's exit status that says: fork one process per group instead


# ------------------------------------------------------------------ comparing


def _entries(trace: Iterable[dict]) -> list[tuple]:
    return [(e["action"], None if e["action"] == "oom" else e.get("addr"), e["size"])
            for e in trace if e["action"] in TRACE_ACTIONS]


def _layout(segments: Iterable[dict]) -> list[tuple]:
    return sorted((s["address"], s["total_size"], tuple((b["address"], b["size"], block_state(b)) for b in s["blocks"]))
                  for s in segments)


def compare(snapshot_path: str | os.PathLike[str], report: dict, workload: Workload) -> list[str]:
    """What torchmem's replay of the native snapshot does not reproduce; empty when exact."""
    from torchmem import snapshot_from_replay
    from torchmem.replay.runner import replay

    if "error" in report:
        return [report["error"]]
    with open(snapshot_path, "rb") as f:
        native = pickle.load(f)
    trace = native["device_traces"][0]
    try:
        result = replay(os.fspath(snapshot_path), history=len(trace) + 1000)
    except Exception as exc:  # the replay must not raise on a native snapshot
        return [f"replay raised {type(exc).__name__}: {exc}"]
    problems = []
    recorded, replayed = _entries(trace), _entries(snapshot_from_replay(result)["device_traces"][0])
    # An OOM followed by no allocation is the run's last (the replay stops
    # there, with the state at the failure, as for a program that died of it):
    # the trace is compared up to it, and the final segments are not.
    stopped_at_oom = bool(result.oom and result.oom.get("recorded"))
    if stopped_at_oom:
        last_oom = max(i for i, e in enumerate(recorded) if e[0] == "oom")
        if all(e[0] != "alloc" for e in recorded[last_oom:]):
            recorded = recorded[:last_oom + 1]
    if recorded != replayed:
        at = next((i for i, (a, b) in enumerate(zip(recorded, replayed)) if a != b), min(len(recorded), len(replayed)))
        problems.append(f"trace differs at entry {at} of {len(recorded)}: native "
                        f"{recorded[at] if at < len(recorded) else 'ends'}, replay "
                        f"{replayed[at] if at < len(replayed) else 'ends'}")
    if not stopped_at_oom and _layout(native["segments"]) != _layout(result.segments):
        problems.append(f"final segments differ ({len(native['segments'])} native, {len(result.segments)} replayed)")
    if workload.from_start and not stopped_at_oom:
        stats = report["stats"]
        ours = {"allocated_bytes.all.peak": result.peak_allocated, "reserved_bytes.all.peak": result.peak_reserved}
        ours.update({k: v for k, v in (result.stats or {}).items() if k in stats and k not in ours})
        differ = {k: (stats[k], ours[k]) for k in ours if stats.get(k) is not None and stats[k] != ours[k]}
        if differ:
            problems.append("statistics differ (native, replay): " + ", ".join(f"{k} {a} vs {b}"
                                                                             for k, (a, b) in differ.items()))
    # What the replay's notes say where it guessed (tests.support.deviations reads these lines).
    if problems and any("rebuilt as fixed segments" in note for note in result.notes):
        problems.append("rebuilt a start range as fixed segments (the replay's notes say why)")
    guessed_runs = [n for n in result.notes if "the snapshot cannot tell" in n]
    if problems and guessed_runs:  # the replay's note on runs of releases it cannot settle (retries.unsettled_runs)
        problems.append(f"guessed retries from {guessed_runs[0].split(':')[0]}")
    if problems and result.start_age_guess_entry is not None:
        # Where the replay first chose between start segments whose ages the snapshot lacks, counted as `at` is.
        guessed_at = sum(1 for e in trace[:result.start_age_guess_entry] if e["action"] in TRACE_ACTIONS)
        problems.append(f"guessed start segments' ages at entry {guessed_at} ({result.start_age_guesses} times)")
    return problems


def check(workloads: list[Workload], progress: Callable[[int], None] | None = None) -> list[list[str]]:
    """Problems of each workload (an empty list where the replay is exact)."""
    with tempfile.TemporaryDirectory(prefix="torchmem-oracle-") as tmp:
        reports = run_native(workloads, tmp)
        results = []
        for i, (w, report) in enumerate(zip(workloads, reports)):
            results.append(compare(Path(tmp) / f"{i}.pickle", report, w))
            if progress:
                progress(i + 1)
        return results


# ------------------------------------------------------------------ shrinking


def _without(w: Workload, start: int, stop: int) -> Workload:
    ops = w.ops[:start] + w.ops[stop:]
    record_at = 0 if not w.record_at else max(1, min(len(ops) - 1, w.record_at - max(0, min(stop, w.record_at) - start)))
    return replace(w, ops=ops, record_at=record_at)


def problem_kind(problem: str) -> str:
    """"trace", "final", "statistics", "replay", "native", "rebuilt" or "guessed": what a problem is about."""
    return problem.split()[0]


def shrink(workload: Workload, rounds: int = 12, kind: str | None = None,
           keep: Callable[[Workload, list[str]], bool] | None = None) -> Workload:
    """A shorter workload that still diverges (delta debugging over its ops).

    With `kind` (see problem_kind), only candidates with a problem of that kind
    count; with `keep`, only those for which keep(candidate, problems) holds.
    """
    current = workload
    chunks = 2
    for _ in range(rounds):
        n = len(current.ops)
        if n <= 1:
            break
        size = max(1, n // chunks)
        candidates = [_without(current, s, s + size) for s in range(0, n, size)]
        results = check(candidates)
        failing = [c for c, problems in zip(candidates, results)
                   if problems and (kind is None or any(problem_kind(p) == kind for p in problems))
                   and (keep is None or keep(c, problems))]
        if failing:
            current = min(failing, key=lambda c: len(c.ops))
            chunks = max(2, chunks - 1)
        elif size == 1:
            break
        else:
            chunks = min(n, chunks * 2)
    return current


def write_reproducer(workload: Workload, problems: list[str], folder: str | os.PathLike[str],
                     deviation: str) -> Path:
    """Writes a shrunk case as a JSON fixture: the workload, the deviation it shows and what diverged."""
    path = Path(folder) / f"{deviation}.json"
    data = {"deviation": deviation, "problems": problems, "workload": asdict(workload)}
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path


def load_reproducer(path: str | os.PathLike[str]) -> Workload:
    data = json.loads(Path(path).read_text())
    return Workload(**data["workload"])
