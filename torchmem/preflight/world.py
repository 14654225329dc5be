"""Some ranks of an N-rank job, run from one machine (docs/preflight.md, "Any world size").

    torchmem preflight --card h100 --world-size 64 -- torchrun --nnodes 8 --nproc-per-node 8 train.py

The launch command stays as the user types it. When it is torchrun (or
``python -m torch.distributed.run``), its own options are read here and the
script is run without it, one process per chosen rank, with the variables
torchrun would set (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, ...). In
each process, hook.py gives ``init_process_group`` a store that answers
locally, and the NCCL stand-in answers collectives without the other ranks
(Note [Ranks that are not run]).
"""
from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from typing import Sequence

from torchmem.fakegpu import interpreter_of

DEFAULT_PER_NODE = 8                # ranks per node when neither torchrun nor the caller says

# torchrun's options that take no value; every other option does (as `--name value` or `--name=value`).
_FLAGS = {"--standalone", "--no-python", "--no_python", "-m", "--module", "--run-path", "--run_path",
          "--virtual-local-rank", "--virtual_local_rank", "--no-duplicate-stdout", "--rdzv-use-agent-store"}
_LAUNCHERS = ("torch.distributed.run", "torch.distributed.launch")


class WorldError(ValueError):
    """A world size, rank list or launch command that cannot be run."""


@dataclass(frozen=True)
class World:
    """Which ranks of which job run, and the command each runs."""

    size: int                # the job's world size
    per_node: int            # ranks per node: LOCAL_RANK is rank % per_node, and each process sees per_node devices
    ranks: tuple[int, ...]   # the ranks run here, each in its own process
    command: tuple[str, ...]  # what one rank runs: the script, without the launcher

    def environment(self, rank: int) -> dict[str, str]:
        """The variables torchrun sets for `rank` (torch.distributed.elastic's agent)."""
        node, local = divmod(rank, self.per_node)
        return {"RANK": str(rank), "LOCAL_RANK": str(local), "WORLD_SIZE": str(self.size),
                "LOCAL_WORLD_SIZE": str(self.per_node), "GROUP_RANK": str(node),
                "GROUP_WORLD_SIZE": str(-(-self.size // self.per_node)), "ROLE_RANK": str(rank),
                "ROLE_WORLD_SIZE": str(self.size), "ROLE_NAME": "default", "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "torchmem-preflight",
                "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0"}


def parse_ranks(text: str) -> tuple[int, ...]:
    """`0`, `0,7,63` or `0-7` (ranges and lists mix): the ranks, sorted, each once."""
    found: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        first, dash, last = part.partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            raise WorldError(f"--ranks {text!r}: give ranks as 0, 0,7,63 or 0-7")
        low, high = int(first), int(last) if dash else int(first)
        if high < low:
            raise WorldError(f"--ranks {text!r}: {part} runs backwards")
        found.update(range(low, high + 1))
    return tuple(sorted(found))


def plan(command: Sequence[str], size: int, ranks: Sequence[int] = (0,), per_node: int | None = None) -> World:
    """The world for `command`: torchrun's own options read, the ranks checked against the world size."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise WorldError(f"--world-size must be a positive whole number, not {size!r}")
    script, launcher = _without_launcher(list(command))
    if launcher.get("nnodes") and launcher.get("nproc"):
        total = launcher["nnodes"] * launcher["nproc"]
        if total != size:
            raise WorldError(f"--world-size {size} disagrees with torchrun's --nnodes {launcher['nnodes']} x "
                             f"--nproc-per-node {launcher['nproc']} = {total}")
    local = per_node or launcher.get("nproc") or min(size, DEFAULT_PER_NODE)
    if not 1 <= local <= 64:
        raise WorldError(f"{local} ranks per node: the fake GPU has 1 to 64 devices per process")
    bad = [r for r in ranks if not 0 <= r < size]
    if bad or not ranks:
        raise WorldError(f"--ranks: rank {bad[0] if bad else '(none)'} is not in a world of {size} (0 to {size - 1})")
    return World(size, local, tuple(sorted(set(ranks))), tuple(script))


def _without_launcher(command: list[str]) -> tuple[list[str], dict[str, int]]:
    """The command one rank runs, and torchrun's --nnodes and --nproc-per-node when it was torchrun."""
    if not command:
        raise WorldError("no command to run")
    head = os.path.basename(command[0])
    if head == "torchrun":
        python = _interpreter(command[0])
        rest = command[1:]
    elif head.startswith("python") and command[1:3] and command[1] == "-m" and command[2] in _LAUNCHERS:
        python, rest = command[0], command[3:]
    else:
        return command, {}
    found: dict[str, int] = {}
    module = no_python = False
    i = 0
    while i < len(rest) and rest[i].startswith("-"):
        name, eq, value = rest[i].partition("=")
        if name in _FLAGS:
            module = module or name in ("-m", "--module")
            no_python = no_python or name in ("--no-python", "--no_python")
            i += 1
            continue
        if not eq:
            if i + 1 >= len(rest):
                raise WorldError(f"torchrun's {name} needs a value")
            value = rest[i + 1]
            i += 1
        i += 1
        key = name.lstrip("-").replace("_", "-")
        if key in ("nnodes", "nproc-per-node"):
            if not value.isdigit():
                raise WorldError(f"torchrun's {name} {value!r}: preflight needs a fixed count here "
                                 "(an elastic range or 'gpu' cannot say the world size)")
            found["nnodes" if key == "nnodes" else "nproc"] = int(value)
    script = rest[i:]
    if not script:
        raise WorldError("torchrun was given no script to run")
    if no_python:
        return script, found
    return [python, *(["-m"] if module else []), *script], found


def _interpreter(torchrun: str) -> str:
    """The Python that a torchrun script runs under (its #! line), else this one."""
    found = interpreter_of([torchrun])
    return found or shutil.which("python3") or sys.executable
