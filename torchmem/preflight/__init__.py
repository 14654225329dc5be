"""Preflight: run an unmodified script on a fake card of any size, with PyTorch's real allocator (docs/preflight.md).

    torchmem preflight --card 80GiB -- python train.py --batch 32

The command runs on the fake GPU (torchmem.fakegpu): PyTorch's CUDA build and
its own caching allocator, device memory in host memory, kernels skipped.
Every process records its allocator history from the start and writes its
native snapshot at exit or at its first uncaught out-of-memory error
(hook.py); the report says, per process and device, the peak allocated, the
peak reserved, and whether and where the run ran out of memory on that card,
then shows ``torchmem advise``'s table for the snapshot.

From Python (notebooks, tests)::

    from torchmem import preflight
    report = preflight.run(train_step, 32, card="80GiB")   # a module-level function, in a fresh interpreter
    report = preflight.run_command(["python", "train.py"], card="h100")
    report.fits, report.devices[0].peak_reserved, report.advice
"""
from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from torchmem.fakegpu import Card, FakeGPUError, card as parse_card, environment, interpreter_of, torch_build
from torchmem.preflight.fakegpu_log import cause
from torchmem.preflight.killed import KILLED, killed_message
from torchmem.preflight.run_plan import ENV as PLAN_ENV, RunPlan
from torchmem.preflight.verdict import Verdict, verdict
from torchmem.preflight.world import World, WorldError, parse_ranks, plan
from torchmem.preflight.cards_table import card_fits
from torchmem.preflight.report import format_report, merged_sites, warnings_for
from torchmem.replay import advise, load_trace

__all__ = ["DeviceResult", "PreflightError", "Report", "Verdict", "World", "WorldError", "check_conf", "environment_for",
           "parse_ranks", "plan", "run", "run_command", "verdict"]

STARTUP = Path(__file__).resolve().parent / "startup"
ROOT = Path(__file__).resolve().parents[2]
OOM_EXIT = 3  # the command-line's exit status when the run ran out of memory


class PreflightError(RuntimeError):
    """Preflight could not run the command, or the command failed for its own reasons (not memory)."""

    def __init__(self, message: str, returncode: int = 1):
        super().__init__(message)
        self.returncode = returncode


@dataclass
class DeviceResult:
    """One device of one process: PyTorch's own statistics at the end of the run (or at its OOM)."""

    process: str                 # rank{RANK} under torchrun, else pid{PID}
    device: int
    peak_allocated: int
    peak_reserved: int
    total: int                   # the card's memory
    num_ooms: int
    num_alloc_retries: int
    snapshot: str
    oom: dict[str, Any] | None   # the uncaught OOM on this device: message, tried, where
    outside: int = 0             # memory outside PyTorch's allocator counted against the card
    nccl: int = 0                # of which NCCL's own buffers (the most the NCCL stand-in held at once)

    @property
    def verdict(self) -> Verdict:
        """Peak reserved plus the outside memory against the card's total (verdict.py)."""
        return verdict(self.peak_reserved, self.outside, self.total)

    def to_json(self) -> dict[str, Any]:
        v = self.verdict
        return {**self.__dict__, "needed": v.needed, "headroom": v.headroom, "fits": v.fits and self.oom is None}


@dataclass(frozen=True)
class Report:
    """What a preflight found, built whole once the run has ended (never changed after).

    `fits`: every process ended without an uncaught OOM, and on every device
    the peak reserved plus the memory outside the allocator stays within the
    card's total_memory (verdict.py).
    """

    command: list[str]
    card: Card
    devices_per_process: int
    conf: str | None
    out: str
    returncode: int
    processes: list[dict[str, Any]]
    advice: list[Any] | None = None            # torchmem.replay.Advice rows, best first
    advised: tuple[str, int] | None = None     # the (process, device) advise read
    advice_missing: str | None = None          # why there is no advise table, when there is none
    value: Any = None                          # run(fn)'s return value
    cards: list[Any] | None = None             # cards_table.CardFit rows: the catalog's cards, smallest first
    warnings: list[str] = field(default_factory=list)
    captured: tuple[str, str] | None = None    # (stdout, stderr) of the command, with capture_output

    @property
    def devices(self) -> list[DeviceResult]:
        out = []
        for p in self.processes:
            oom = p.get("oom") if p.get("status") == "oom" else None
            oom_device = oom.get("device") if oom else None
            used = p.get("devices", [])
            for d in used:
                hit = oom is not None and (oom_device == d["device"] or (oom_device is None and d is used[-1]))
                out.append(DeviceResult(p["name"], d["device"], d["peak_allocated"], d["peak_reserved"], d["total"],
                                        d["num_ooms"], d["num_alloc_retries"], p.get("snapshot") or "",
                                        oom if hit else None, d.get("outside", self.card.outside_bytes),
                                        d.get("nccl", 0)))
        return out

    @property
    def fits(self) -> bool:
        return (self.returncode == 0 and not any(p.get("status") == "oom" for p in self.processes)
                and all(d.verdict.fits for d in self.devices))

    @property
    def ooms(self) -> list[DeviceResult]:
        return [d for d in self.devices if d.oom is not None]

    def to_json(self) -> dict[str, Any]:
        return {
            "command": self.command, "card": {"name": self.card.name, "key": self.card.key,
                                              "memory": self.card.memory, "capability": self.card.capability,
                                              "multiprocessors": self.card.multiprocessors,
                                              "outside": self.card.outside_bytes,
                                              "outside_known": self.card.outside is not None,
                                              "total_source": self.card.total_source,
                                              "outside_source": self.card.outside_source},
            "devices_per_process": self.devices_per_process, "conf": self.conf, "out": self.out,
            "returncode": self.returncode, "fits": self.fits,
            "devices": [d.to_json() for d in self.devices],
            "processes": [{k: v for k, v in p.items() if k != "devices"} for p in self.processes],
            "advised": list(self.advised) if self.advised else None,
            "advice": [a.to_json() for a in self.advice] if self.advice is not None else None,
            "advice_missing": self.advice_missing,
            "cards": [c.to_json() for c in self.cards] if self.cards is not None else None,
            "warnings": self.warnings,
        }

    def format(self) -> str:
        return format_report(self)


def environment_for(card: str | int | Card = "80GiB", devices: int = 1, *, conf: str | None = None,
                    out: str | os.PathLike[str], max_entries: int | None = None,
                    base: Mapping[str, str] | None = None,
                    command: Sequence[str] | None = None, steps: int | None = None,
                    read_weights: bool = False, world: int | None = None) -> dict[str, str]:
    """The environment of a command run under preflight: the fake GPU's (the set of the CUDA major of the
    torch that `command`'s Python runs), plus the start-up hook and its RunPlan (run_plan.py). A CPU build
    of torch there is refused. With `steps`, each process ends after that many optimizer steps
    (steps_hook.py). Without `read_weights`, safetensors checkpoints load their shapes, not their bytes
    (weights_hook.py). `world`: the job's world size, when only some of its ranks run (world.py)."""
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
        raise ValueError(f"steps must be a whole number of at least 1, not {steps!r}")
    python = interpreter_of(command, (base or os.environ).get("PATH")) if command else None
    build = torch_build(python) if python else None  # a command that is not found is named by the run
    if build is not None and build.version is not None and build.cuda is None:
        raise FakeGPUError(f"torch {build.version} in {build.python} is a CPU build: preflight runs a CUDA build "
                           "of torch (CUDA 12 or 13) on the fake GPU, so install one there")
    given_log = (base if base is not None else os.environ).get("TORCHMEM_FAKEGPU_LOG")
    log = given_log or Path(out) / "fakegpu.log"  # failed and missing calls (fakegpu_log.py)
    env = environment(card, devices, base=base, command=command, log=os.path.abspath(os.fspath(log)))
    env["TORCHMEM_FAKEGPU_DATA"] = "0"  # device memory holds no data (fakegpu/cudart/contents.c)
    paths = [str(STARTUP), str(ROOT) if (ROOT / "torchmem").is_dir() else "", env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    env[PLAN_ENV] = RunPlan(out=os.path.abspath(os.fspath(out)), max_entries=max_entries,
                            outside=parse_card(card).outside_bytes, world=world, steps=steps,
                            read_weights=read_weights).to_json()
    if conf is not None:
        env["PYTORCH_CUDA_ALLOC_CONF"] = conf
    return env


def check_conf(conf: str | None) -> None:
    """Refuses a conf that is not PyTorch's (torchmem's policy: settings), with one line."""
    if conf is None:
        return
    if not isinstance(conf, str):
        raise TypeError(f"conf must be a string in PYTORCH_CUDA_ALLOC_CONF's grammar, not {type(conf).__name__}")
    if "policy:" in conf.replace(" ", ""):
        raise ValueError(f"conf {conf!r}: preflight runs PyTorch's own allocator, which takes PYTORCH_CUDA_ALLOC_CONF "
                         "settings only (torchmem's policy:stitch is replayed by torchmem advise)")


def run_command(command: Sequence[str], card: str | int | Card = "80GiB", devices: int = 1, *,
                conf: str | None = None, out: str | os.PathLike[str] | None = None, advise: bool = True,
                max_entries: int | None = None, env: Mapping[str, str] | None = None,
                capture_output: bool = False, timeout: float | None = None, label: str | None = None,
                world_size: int | None = None, ranks: Sequence[int] = (0,), stdout_to_stderr: bool = False,
                steps: int | None = None, read_weights: bool = False, card_table: bool = True) -> Report:
    """Runs a command under preflight and reads what its processes wrote.

    With `world_size`, only `ranks` of a job of that many ranks run, one
    process each, in turn (world.py): a torchrun launcher in `command` is read
    for its node layout and replaced, and each process sees as many devices
    as a node has.

    With `steps`, each process ends after its `steps`-th optimizer step, and
    each process's report holds every step's peaks (steps_hook.py).
    With `read_weights`, checkpoints are read whole, not as shapes alone.
    Without `card_table`, the report has no catalog cards (`cards` is None).

    With `stdout_to_stderr` (and no `capture_output`), the command's standard
    output goes to this process's standard error, leaving standard output to
    the caller (`torchmem preflight --json`).

    Raises PreflightError when the command cannot start, or fails for its own
    reasons (an exception other than an OOM, a non-zero exit status): its
    message is one line, its returncode the command's.
    """
    command = [os.fspath(c) for c in command]
    if not command:
        raise ValueError("no command to run: give it after --, e.g. -- python train.py")
    shown = label or " ".join(command)
    chosen = parse_card(card)
    check_conf(conf)
    world = plan(command, world_size, ranks) if world_size is not None else None
    run_as = list(world.command) if world else command
    devices = world.per_node if world else devices
    folder = _fresh_folder(out)
    full = environment_for(chosen, devices, conf=conf, out=folder, max_entries=max_entries, base=env,
                           command=run_as, steps=steps, read_weights=read_weights,
                           world=world.size if world else None)
    program = shutil.which(run_as[0], path=full.get("PATH"))
    if program is None:
        raise PreflightError(f"{run_as[0]}: command not found", 127)
    started = time.monotonic()
    returncode, captured = _run_ranks([program, *run_as[1:]], full, world, shown, timeout, capture_output,
                                      stdout_to_stderr)
    observed = Report(command, chosen, devices, conf, str(folder), returncode, _read(folder),
                      captured=captured if capture_output else None)
    _refuse_failed_run(observed, shown, full.get("TORCHMEM_FAKEGPU_LOG"), started)
    return replace(observed, warnings=warnings_for(observed), **_replay_fields(observed, advise, card_table))


def _fresh_folder(out: str | os.PathLike[str] | None) -> Path:
    """The run's folder (a new temporary one when none is given), without an earlier run's reports and logs."""
    folder = Path(out) if out is not None else Path(tempfile.mkdtemp(prefix="torchmem-preflight-"))
    folder.mkdir(parents=True, exist_ok=True)
    for stale in [*folder.glob("rank*.*"), *folder.glob("pid*.*"), *folder.glob("fakegpu.log")]:
        stale.unlink()
    return folder


def _run_ranks(argv: list[str], full: dict[str, str], world: World | None, shown: str, timeout: float | None,
               capture_output: bool, stdout_to_stderr: bool) -> tuple[int, tuple[str, str]]:
    """Runs the command once per rank that runs here (once without a world): the first non-zero exit
    status, and the output captured from all of them."""
    returncode, captured = 0, ("", "")
    for i, rank in enumerate(world.ranks if world else [None]):
        rank_env = full if world is None else {**full, **world.environment(rank)}
        if world is not None and len(world.ranks) > 1:
            print(f"torchmem preflight: rank {rank} of {world.size} ({i + 1} of {len(world.ranks)} run here)",
                  file=sys.stderr, flush=True)
        try:
            redirect = _stdout_to_stderr() if stdout_to_stderr and not capture_output else {}
            proc = subprocess.run(argv, env=rank_env, capture_output=capture_output, text=True,
                                  timeout=timeout, **redirect)
            if redirect.get("stdout") is subprocess.PIPE:
                sys.stderr.write(proc.stdout)
        except subprocess.TimeoutExpired:
            raise PreflightError(f"`{shown}` did not finish in {timeout} s", 124) from None
        returncode = returncode or proc.returncode
        if capture_output:
            captured = (captured[0] + proc.stdout, captured[1] + proc.stderr)
    return returncode, captured


def _refuse_failed_run(report: Report, shown: str, fakegpu_log: str | None, started: float) -> None:
    """PreflightError when the command failed for its own reasons (not memory), was killed, or never used
    the GPU; its message is one line, its returncode the command's."""
    processes, returncode, folder = report.processes, report.returncode, Path(report.out)
    failed = [p for p in processes if p.get("status") == "error"]
    if failed:
        why = cause(fakegpu_log, failed[0]["pid"], failed[0]["error"])
        raise PreflightError(f"`{shown}` failed: {failed[0]['error']}{'; ' + why if why else ''} "
                             f"(exit status {returncode}; "
                             f"traceback in {folder / (failed[0]['name'] + '.traceback.txt')})",
                             returncode or 1)
    if returncode in KILLED:
        raise PreflightError(killed_message(shown, returncode, time.monotonic() - started, processes), returncode)
    if returncode != 0 and not report.ooms:
        raise PreflightError(f"`{shown}` exited with status {returncode}"
                             + ("" if processes else " before it used the GPU"), returncode)
    if not processes:
        raise PreflightError(f"`{shown}` never used the GPU: nothing to report (is torch the CUDA "
                             "build in that interpreter?)", 1)


def _stdout_to_stderr() -> dict[str, Any]:
    """subprocess.run's stdout for a command whose output goes to our stderr: its file, or a pipe copied there
    afterwards when stderr has no file (a test's captured stream)."""
    try:
        return {"stdout": sys.stderr.fileno()}
    except (AttributeError, OSError, ValueError):
        return {"stdout": subprocess.PIPE}


def _read(folder: Path) -> list[dict[str, Any]]:
    processes = []
    for path in sorted(folder.glob("*.json")):
        if path.name.startswith(("rank", "pid")):
            with open(path) as f:
                processes.append(json.load(f))
    # By rank, each rank's own report before its children's (Note [One report per rank]), then by pid.
    processes.sort(key=lambda p: (p.get("rank") is None, int(p["rank"]) if p.get("rank") else p["pid"],
                                  p.get("name") != f"rank{p.get('rank')}", p["pid"]))
    return processes


def _replay_fields(report: Report, with_advise: bool, card_table: bool = True) -> dict[str, Any]:
    """The report's advise and catalog fields (advice, advised, advice_missing, cards; cards_table.py), read
    from the device that ran out of memory, else the one that reserved the most."""
    candidates = report.ooms or sorted(report.devices, key=lambda d: -d.peak_reserved)
    missing = None if with_advise else "advise was not asked for (--no-advise, or advise=False)"
    if not candidates:
        return {"advice_missing": missing or "no process allocated device memory, so there is no history to replay"}
    chosen = candidates[0]
    if not chosen.snapshot:
        return {"advice_missing": missing or f"{chosen.process} wrote no snapshot"}
    trace = load_trace(chosen.snapshot, device=chosen.device)
    if trace.recorded is not None and not trace.recorded.entries:
        return {"advice_missing": missing or (f"{chosen.snapshot} holds no history for device {chosen.device}: "
                                              "its recording was stopped or never started")}
    advice = advise(trace, report.card.usable) if with_advise else None
    cards = card_fits(trace, report.card, advice, bool(merged_sites(report.processes, "sized"))) if card_table else None
    return {"advised": (chosen.process, chosen.device), "advice": advice, "advice_missing": missing, "cards": cards}


_CHILD = """
import pickle, sys
with open(sys.argv[1], "rb") as f:
    fn, args, kwargs = pickle.load(f)
value = fn(*args, **kwargs)
with open(sys.argv[1], "wb") as f:
    pickle.dump(value, f)
"""


def run(fn: Callable[..., Any], *args: Any, card: str | int | Card = "80GiB", devices: int = 1,
        conf: str | None = None, out: str | os.PathLike[str] | None = None, advise: bool = True,
        timeout: float | None = 600, env: Mapping[str, str] | None = None, **kwargs: Any) -> Report:
    """Preflight of fn(*args, **kwargs), called in a fresh interpreter on a fake card.

    fn must be importable by name (a module-level function) and its
    arguments and result picklable; the result is `report.value` (None when
    the run ran out of memory). The child's output is captured, not shown.
    """
    if not callable(fn):
        raise TypeError(f"fn must be a module-level function, not {type(fn).__name__}")
    with tempfile.TemporaryDirectory(prefix="torchmem-preflight-call-") as tmp:
        exchange = Path(tmp) / "call.pickle"
        try:
            exchange.write_bytes(pickle.dumps((fn, args, kwargs)))
        except (pickle.PicklingError, AttributeError, TypeError) as exc:
            raise TypeError(f"{getattr(fn, '__qualname__', fn)} and its arguments must be picklable "
                            f"(a module-level function): {exc}") from None
        label = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', fn)}(...)"
        report = run_command([sys.executable, "-c", _CHILD, str(exchange)], card, devices, conf=conf, out=out,
                             advise=advise, env=env, capture_output=True, timeout=timeout, label=label)
        value = pickle.loads(exchange.read_bytes()) if report.fits else None
    return replace(report, value=value, command=[label])


__all__ += ["FakeGPUError", "OOM_EXIT"]
