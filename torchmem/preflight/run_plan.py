"""What preflight's launcher tells each process it runs: one typed description, in one variable.

The launcher (preflight/__init__.py) writes a ``RunPlan`` as JSON into
``$TORCHMEM_PREFLIGHT_PLAN``; the start-up hook (hook.py) reads it back once,
in every process the command starts. The module uses the standard library
alone: the hook loads it by path, before torch and without torchmem's imports.
The fake GPU's own variables (``TORCHMEM_FAKEGPU_*``) stay apart: its C
runtime reads them.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping

ENV = "TORCHMEM_PREFLIGHT_PLAN"


@dataclass(frozen=True)
class RunPlan:
    """One preflight run, as each of its processes must know it."""

    out: str                        # the folder each process writes its report and snapshot into
    max_entries: int | None = None  # history entries kept per device (None: all)
    outside: int = 0                # bytes taken on each device for the card's memory outside the allocator
    world: int | None = None        # the job's world size, when only some of its ranks run (world.py)
    steps: int | None = None        # end each process after this many optimizer steps (steps_hook.py)
    read_weights: bool = False      # read safetensors checkpoints whole (weights_hook.py)

    def __post_init__(self) -> None:
        checks = {"out": isinstance(self.out, str) and bool(self.out),
                  "max_entries": self.max_entries is None or _count(self.max_entries, 1),
                  "outside": _count(self.outside, 0), "world": self.world is None or _count(self.world, 1),
                  "steps": self.steps is None or _count(self.steps, 1), "read_weights": isinstance(self.read_weights, bool)}
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise ValueError(f"preflight's run plan: bad {', '.join(bad)} in {asdict(self)}")

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> RunPlan:
        """The plan $TORCHMEM_PREFLIGHT_PLAN holds; ValueError, in one line, for anything else."""
        try:
            given = json.loads(text)
        except ValueError:
            raise ValueError(f"${ENV} is not JSON: {text[:80]!r}") from None
        known = {f.name for f in fields(cls)}
        if not isinstance(given, dict) or not set(given) <= known or "out" not in given:
            raise ValueError(f"${ENV} is not a preflight run plan: {text[:80]!r}")
        return cls(**given)


def plan_of(environ: Mapping[str, str]) -> RunPlan | None:
    """The run plan of this process, or None when it does not run under preflight."""
    text = environ.get(ENV)
    return RunPlan.from_json(text) if text else None


def _count(value: Any, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least
