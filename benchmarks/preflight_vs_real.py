"""Preflight against real-GPU recordings published with their scripts, event by event.

    python benchmarks/preflight_vs_real.py --sources DIR --out OUT [--cases FILE] [--only NAME ...]
    python benchmarks/preflight_vs_real.py --checkout DIR --real SNAPSHOT --torch 2.6.0 --out OUT \\
        [--workdir SUB] [--pythonpath SUB ...] [--card a100] -- python -m pkg.script ARGS...

A case is a public repository at a commit: a script, the torch version its
lockfile names, and a snapshot (``_record_memory_history`` pickle) the same
script wrote on a real GPU. Cases are listed in
benchmarks/preflight_vs_real_cases.json; their sources are bare git
directories under --sources (``OWNER+NAME/repo``), from which only the
paths the script needs are exported. The repositories' code and snapshots
stay out of this project.

For each case the script runs unmodified under ``torchmem preflight`` on
the interpreter whose torch matches the lockfile (``.venv-cuda-VERSION``,
else ``.venv-cuda``; the table says which ran). A small sitecustomize notes
where the script itself starts recording (the trace length at its own
``_record_memory_history`` call) and where it dumps its snapshot, so that
both traces cover the same window. torchmem.preflight.compare then
compares them event by event; OUT/NAME.json holds the details,
OUT/preflight_vs_real.md the table.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tarfile
import io
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CASES = ROOT / "benchmarks" / "preflight_vs_real_cases.json"
MARKS_ENV = "TORCHMEM_HARNESS_MARKS"

# Written into OUT/marks/sitecustomize.py; preflight's own start-up hook chains to it.
MARKS = r'''
import importlib.abc, importlib.machinery, json, os, sys

_LOG = os.environ.get("TORCHMEM_HARNESS_MARKS")


def _note(entry):
    with open(_LOG, "a") as f:
        f.write(json.dumps(entry) + "\n")


def _entries(torch):
    if not torch.cuda.is_initialized():
        return 0
    return len(torch.cuda.memory._snapshot()["device_traces"][torch.cuda.current_device()])


def _wrap(module):
    record, dump = module._record_memory_history, module._dump_snapshot

    def _record_memory_history(*args, **kwargs):
        import torch
        frame = sys._getframe(1)
        if frame.f_code.co_name == "script_record_memory_history":  # preflight's wrapper of the script's call
            frame = frame.f_back
        caller = frame.f_code.co_filename
        if "preflight" not in caller:
            enabled = args[0] if args else kwargs.get("enabled", "all")
            enabled = enabled is not None and enabled is not False
            ring = kwargs.get("max_entries")
            entries = _entries(torch)
            cleared = bool(enabled and ring and entries >= ring)
            if cleared:
                # A ring of `ring` entries over a longer trace overwrites it in place (CUDACachingAllocator):
                # start from an empty history, as the script's own call does on a GPU.
                record(enabled=None)
                entries = 0
            _note({"call": "record", "enabled": enabled, "entries": entries, "caller": caller, "max_entries": ring,
                   "cleared": cleared})
        return record(*args, **kwargs)

    def _dump_snapshot(filename="dump_snapshot.pickle"):
        caller = sys._getframe(1).f_code.co_filename
        if "preflight" not in caller:
            # no _snapshot() here: it would add a "snapshot" entry to a full ring, dropping the window's oldest one
            _note({"call": "dump", "path": os.path.abspath(filename), "caller": caller})
        return dump(filename)

    module._record_memory_history = _record_memory_history
    module._dump_snapshot = _dump_snapshot


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != "torch.cuda.memory":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        original = spec.loader.exec_module

        def exec_module(module):
            original(module)
            _wrap(module)

        spec.loader.exec_module = exec_module
        return spec


if _LOG:
    sys.meta_path.insert(0, _Finder())
'''


class _Reused(Exception):
    """--reuse: the case's earlier run is compared again."""


def interpreter(torch_version: str) -> Path:
    """The venv whose torch is the lockfile's, else the default CUDA one."""
    exact = ROOT / f".venv-cuda-{torch_version}" / "bin" / "python"
    return exact if exact.is_file() else ROOT / ".venv-cuda" / "bin" / "python"


def export(bare: Path, commit: str, paths: list[str], dest: Path) -> None:
    """The case's paths at `commit`, from a bare git directory, into dest (no work tree needed)."""
    data = subprocess.run(["git", "-C", str(bare), "archive", "--format=tar", commit, "--", *paths],
                          capture_output=True, check=False)
    if data.returncode != 0:
        raise SystemExit(f"git archive {commit} in {bare}: {data.stderr.decode().strip()}")
    with tarfile.open(fileobj=io.BytesIO(data.stdout)) as tar:
        tar.extractall(dest, filter="data")


def blob(bare: Path, commit: str, path: str, dest: Path) -> None:
    data = subprocess.run(["git", "-C", str(bare), "cat-file", "blob", f"{commit}:{path}"], capture_output=True)
    if data.returncode != 0:
        raise SystemExit(f"{path} at {commit} in {bare}: {data.stderr.decode().strip() or 'not there'}")
    dest.write_bytes(data.stdout)


def read_marks(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def real_peaks(real_path: Path) -> tuple[int, int] | None:
    """Peaks of a recording that starts mid-run, by torchmem's exact replay of it (start state rebuilt)."""
    from torchmem.replay import replay

    result = replay(str(real_path))
    fidelity = result.fidelity or {}
    if not result.completed or fidelity.get("placements_differed", 1) != 0:
        return None
    return result.peak_allocated, result.peak_reserved


def run_case(case: dict[str, Any], checkout: Path, real_path: Path, out: Path, python: Path,
             reuse: bool = False) -> dict[str, Any]:
    from torchmem.preflight import PreflightError, run_command
    from torchmem.preflight.compare import Peaks, compare
    from torchmem.formats.traces import load_snapshot
    from torchmem.formats.trace_types import TraceError

    name = case["name"]
    folder = out / name
    marks_dir = folder / "marks"
    marks_dir.mkdir(parents=True, exist_ok=True)
    (marks_dir / "sitecustomize.py").write_text(MARKS)
    for dist, version in case.get("installed", {}).items():  # what `uv run` would have installed from the checkout
        info = marks_dir / f"{dist.replace('-', '_')}-{version}.dist-info"
        info.mkdir(exist_ok=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    log = folder / "marks.jsonl"
    if not (reuse and log.is_file()):
        log.unlink(missing_ok=True)
    workdir = checkout / case.get("workdir", ".")
    for sub in case.get("mkdir", []):
        (checkout / sub).mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    extra = [str(marks_dir), *(str(checkout / p) for p in case.get("pythonpath", []))]
    env["PYTHONPATH"] = os.pathsep.join([*extra, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env[MARKS_ENV] = str(log)
    command = [str(python) if c == "{python}" else c for c in case["command"]]
    here = os.getcwd()
    os.chdir(workdir)
    error = None
    report = None
    try:
        if reuse and log.is_file():
            raise _Reused
        report = run_command(command, card=case.get("card", "a100"), out=folder / "preflight", advise=False,
                             env=env, capture_output=True, timeout=case.get("timeout", 1800))
    except PreflightError as exc:
        error = str(exc)
    except _Reused:
        report = None
    finally:
        os.chdir(here)
    marks = read_marks(log)
    starts = [m for m in marks if m["call"] == "record" and m["enabled"]]
    dumps = [m for m in marks if m["call"] == "dump"]
    start = starts[0]["entries"] if starts else 0
    result: dict[str, Any] = {"name": name, "repo": case.get("repo"), "commit": case.get("commit"),
                              "script": case.get("script"), "command": " ".join(case["command"][1:]),
                              "torch_real": case.get("torch"), "error": error, "start_entry": start}
    own = Path(dumps[0]["path"]) if dumps else None
    if own is not None and own.is_file():
        other_path, result["snapshot"] = own, "the script's own dump"
    else:
        pids = sorted((folder / "preflight").glob("pid*.pickle"))
        if not pids:
            result["error"] = error or "no snapshot was written"
            return result
        other_path, result["snapshot"] = pids[0], "preflight's dump at exit (the script's own was not written)"
    previous = out / f"{name}.json"
    if report is None and previous.is_file():
        old = json.loads(previous.read_text())
        for key in ("torch_run", "capability", "memory_stats_peaks"):
            if key in old:
                result[key] = old[key]
    if report is not None and report.processes:
        p = report.processes[0]
        result["torch_run"] = p.get("torch")
        result["capability"] = p.get("capability")
        d = (p.get("devices") or [{}])[0]
        result["memory_stats_peaks"] = [d.get("peak_allocated"), d.get("peak_reserved")]
    try:
        real = load_snapshot(str(real_path))
        other = load_snapshot(str(other_path))
    except (OSError, TraceError) as exc:
        result["error"] = f"cannot read a snapshot: {exc}"
        return result
    ring = starts[0].get("max_entries") if starts else None
    if ring and len(other["device_traces"][0]) >= ring:
        # the script's max_entries keeps the last `ring` entries on both sides: the windows end together
        start = result["start_entry"] = 0
        result["window"] = f"the last {ring:,} entries before the dump (the script's max_entries)"
    elif starts and starts[0].get("cleared"):
        result["window"] = "from the script's own call (preflight's earlier history cleared there)"
    comparison = compare(real, other, other_start=start, shift=None if "window" in result and ring else 0)
    if start == 0 and comparison.peaks_other.approximate:
        exact = real_peaks(other_path)
        if exact is not None:
            comparison.peaks_other = Peaks(exact[0], exact[1], 0)
            comparison.notes.append("preflight peaks from torchmem's replay of its window (its start state rebuilt)")
    if comparison.peaks_real.approximate:
        exact = real_peaks(real_path)
        if exact is not None:
            comparison.notes.append(f"real peaks from torchmem's replay of the recording (its start state rebuilt; "
                                    f"the trace alone leaves {comparison.peaks_real.approximate} block sizes inferred)")
            comparison.peaks_real = Peaks(exact[0], exact[1], 0)
    result.update(comparison.to_json())
    return result


def row(r: dict[str, Any]) -> str:
    def mib(n: int) -> str:
        return f"{n / 2**20:,.1f}"

    if r.get("error") and "peak_reserved" not in r:
        return f"| {r['name']} | {r['repo']}@{str(r['commit'])[:12]} | {r['torch_real']} / {r.get('torch_run', '?')} | " \
               f"failed: {r['error'][:200]} | | |"
    def show(e: dict[str, Any] | None) -> str:
        if e is None:
            return "(end)"
        return f"{e['action']} {e['size']:,}" + (f" @{e['offset']:,}" if e["offset"] is not None else "")

    def where(d: dict[str, Any] | None) -> str:
        if d is None:
            return "none"
        return f"event {d['position']:,} ({d['field']}): real {show(d['real'])}, preflight {show(d['preflight'])}"

    first, request = r["first"], r.get("first_request")
    text = "none: every event agrees" if first is None else f"{where(first)} of {r['events_real']:,}"
    if first is not None and first["field"] == "offset":
        text += f"; requests: {where(request)}"
    pa, pr = r["peak_allocated"], r["peak_reserved"]
    return (f"| {r['name']} | {r['repo']}@{str(r['commit'])[:12]} | {r['torch_real']} / {r.get('torch_run', '?')} | "
            f"{text} | {mib(pa[0])} / {mib(pa[1])} ({r['peak_allocated_difference']:+.2%}) | "
            f"{mib(pr[0])} / {mib(pr[1])} ({r['peak_reserved_difference']:+.2%}) |")


HEADER = ("| case | repository @ commit | torch real / run | first divergence | peak allocated MiB real / preflight "
          "(diff) | peak reserved MiB real / preflight (diff) |\n|---|---|---|---|---|---|")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--sources", type=Path, help="folder of bare git directories, OWNER+NAME/repo")
    parser.add_argument("--cases", type=Path, default=CASES)
    parser.add_argument("--only", nargs="*", help="case names to run")
    parser.add_argument("--reuse", action="store_true", help="compare the cases' earlier runs in OUT again")
    parser.add_argument("--python", type=Path, help="interpreter for every case (default: by the lockfile's torch)")
    parser.add_argument("--checkout", type=Path, help="one case: a checkout of the repository")
    parser.add_argument("--real", type=Path, help="one case: the snapshot recorded on the real GPU")
    parser.add_argument("--torch", default="2.14.1", help="one case: the torch version its lockfile names")
    parser.add_argument("--workdir", default=".")
    parser.add_argument("--pythonpath", nargs="*", default=[])
    parser.add_argument("--card", default="a100")
    parser.add_argument("command", nargs="*", help="one case: the command, after --")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    if args.checkout is not None:
        if args.real is None or not args.command:
            parser.error("--checkout needs --real and a command after --")
        case = {"name": "case", "torch": args.torch, "workdir": args.workdir, "pythonpath": args.pythonpath,
                "card": args.card, "command": ["{python}" if c == "python" else c for c in args.command],
                "repo": str(args.checkout), "commit": "-"}
        python = args.python or interpreter(args.torch)
        results.append(run_case(case, args.checkout.resolve(), args.real.resolve(), args.out.resolve(), python))
    else:
        if args.sources is None:
            parser.error("give --sources (with the cases file) or --checkout")
        try:
            cases = json.loads(args.cases.read_text())
        except (OSError, ValueError) as exc:
            raise SystemExit(f"{args.cases}: cannot read the cases: {exc}") from None
        unknown = set(args.only or ()) - {c["name"] for c in cases}
        if unknown:
            raise SystemExit(f"--only: no case named {', '.join(sorted(unknown))} in {args.cases}")
        for case in cases:
            if args.only and case["name"] not in args.only:
                continue
            bare = args.sources / case["repo"].replace("/", "+") / "repo"
            if not bare.is_dir():
                raise SystemExit(f"{bare}: no git directory of {case['repo']} there (fetch it, or give --sources)")
            checkout = (args.out / case["name"] / "checkout").resolve()
            checkout.mkdir(parents=True, exist_ok=True)
            export(bare, case["commit"], case["paths"], checkout)
            real = (args.out / case["name"] / "real.pickle").resolve()
            blob(bare, case["snapshot_commit"] if "snapshot_commit" in case else case["commit"], case["snapshot"], real)
            python = (args.python.absolute() if args.python else interpreter(case["torch"]))
            print(f"{case['name']}: {python}", flush=True)
            r = run_case(case, checkout, real, args.out.resolve(), python, reuse=args.reuse)
            results.append(r)
            (args.out / f"{case['name']}.json").write_text(json.dumps(r, indent=1))
            print(row(r), flush=True)
    table = "\n".join([HEADER, *(row(r) for r in results)])
    (args.out / "preflight_vs_real.md").write_text(table + "\n")
    (args.out / "preflight_vs_real.json").write_text(json.dumps(results, indent=1))
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
