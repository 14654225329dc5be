"""The one line preflight says when the command was killed by SIGKILL: most often the host ran out of memory.

Preflight's card is fake, so a SIGKILL is this machine's doing, not the card's: the kernel's
out-of-memory killer, a job scheduler's memory limit, or a user. The line says how far the run got:
how long it ran, the host memory its processes peaked at, and which of them had used the GPU.
"""
from __future__ import annotations

import resource
import signal
from typing import Any

# SIGKILL as subprocess reports it (-9), and as a shell that ran the command reports it (128 + 9).
KILLED = (-signal.SIGKILL, 128 + signal.SIGKILL)


def children_peak_rss() -> int:
    """The largest resident set, in bytes, of any child process this one has waited for."""
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # Linux reports KiB


def killed_message(shown: str, returncode: int, seconds: float, processes: list[dict[str, Any]]) -> str:
    """`shown` was killed: when, at what host memory, and whether it had reached the GPU."""
    reached = (f"{len(processes)} process(es) had used the GPU and reported" if processes else
               "no process reported its GPU use (a process killed this way writes no report)")
    return (f"`{shown}` was killed by SIGKILL (exit status {returncode}) after {seconds:.0f} s, with its largest "
            f"process at {children_peak_rss() / 2**30:.1f} GiB of host memory: most likely this machine ran out "
            f"of host memory, not the fake card; {reached}")
