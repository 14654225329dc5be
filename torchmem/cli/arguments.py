"""Arguments and errors of the command line, the Unix way.

- A bad argument (an unknown option, ``--capacity lots``, ``--conf x:y``,
  ``--top -1``, a ``--device`` the file does not have) exits with status 2.
- Bad input (a missing, unreadable, empty, damaged or hostile file, a trace
  that contradicts itself) exits with status 1.
- Either way: one line on stderr, ``torchmem COMMAND: error: ...``, naming
  the file or the option, and never a traceback.

The option types below check an argument when argparse reads it, so the
file is not even opened when an option is wrong.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any, Callable, NoReturn

from torchmem.sizes import parse_bytes
from torchmem.formats.trace_types import ArgumentError, DeviceError, TraceError
from torchmem import _core


class Parser(argparse.ArgumentParser):
    """argparse, with its errors on one line (the usage is one --help away), each
    prefixed ``torchmem COMMAND:`` by the subcommand's own parser, unknown
    arguments too (argparse leaves those to the top-level parser)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def parse_args(self, args: Any = None, namespace: Any = None) -> argparse.Namespace:  # type: ignore[override]
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            self._parser_of(parsed).error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed

    def _parser_of(self, parsed: argparse.Namespace) -> argparse.ArgumentParser:
        """The subcommand's parser that read `parsed`, else this one."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                chosen = action.choices.get(getattr(parsed, action.dest, None) or "")
                if chosen is not None:
                    return chosen
        return self


def size(what: str, allow_zero: bool = False) -> Callable[[str], str]:
    """An option holding a size such as 80GiB: checked here, passed on as given."""

    def check(text: str) -> str:
        try:
            parse_bytes(text, what, allow_zero=allow_zero)
        except (ValueError, TypeError) as exc:
            message = str(exc)
            if "a size such as" in message:  # the core's parser speaks of the allocator config
                message = f"{text!r} is not a size: write it like 80GiB, 512MB, 1.5GB or 4096B"
            raise argparse.ArgumentTypeError(message) from None
        return text

    return check


def conf(text: str) -> str:
    """An option holding allocator settings in PYTORCH_CUDA_ALLOC_CONF's grammar ('' = the defaults)."""

    try:
        _core.parse_config(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def count(minimum: int) -> Callable[[str], int]:
    """An option holding an integer of at least `minimum`."""

    def check(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
        if n < minimum:
            raise argparse.ArgumentTypeError(f"must be {minimum} or more, not {n}")
        return n

    return check


def positive_float(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number: {text!r}") from None
    if not x > 0 or x == float("inf"):
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return x


def one_line(exc: BaseException) -> str:
    """An exception as one line: 'FILE: permission denied' for an OSError from the system."""
    if isinstance(exc, OSError) and exc.strerror and exc.filename is not None:
        text = f"{exc.filename}: {exc.strerror[:1].lower()}{exc.strerror[1:]}"
    else:
        text = str(exc) or type(exc).__name__
    return " ".join(part.strip() for part in text.splitlines() if part.strip())


def run_command(name: str, func: Callable[[Any], Any], args: Any) -> int:
    """Run a command: its status, or 2 / 1 and one line on stderr (see the module docstring)."""
    try:
        return int(func(args) or 0)
    except ArgumentError as exc:
        print(f"torchmem {name}: error: {one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"torchmem {name}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader of stdout went away (| head)
        sys.stderr.close()
        return 1
    except MemoryError:
        print(f"torchmem {name}: error: out of memory", file=sys.stderr)
        return 1
    except (ValueError, TypeError, OSError, RuntimeError) as exc:
        print(f"torchmem {name}: error: {one_line(exc)}", file=sys.stderr)
        return 1
    except Exception as exc:  # a bug in torchmem, not bad input: still no traceback
        print(f"torchmem {name}: internal error: {type(exc).__name__}: {one_line(exc)} "
              "(a bug in torchmem: please report it with the command)", file=sys.stderr)
        return 1


def other_devices(recorded: Any) -> str:
    """'device 0 has 4,496 trace entries (--device 0)' for the devices of a snapshot other than the one read."""
    others = [(d, n) for d, n in recorded.devices if d != recorded.device and n]
    return "; ".join(f"device {d} has {n:,} trace entries (--device {d})" for d, n in others)


def require_trace(trace: Any, path: str, device_given: bool, what: str) -> None:
    """A command that replays history (`what`) refuses a snapshot device without a trace.

    With --device N given and another device holding the trace: DeviceError
    (exit 2), naming the devices that have one; else TraceError (exit 1).
    """

    recorded = trace.recorded
    if recorded is None or recorded.entries:
        return
    others = other_devices(recorded)
    if device_given and others:
        raise DeviceError(f"{path}: device {recorded.device} has no trace entries; {others}")
    raise TraceError(f"{path}: the snapshot has no trace, only its final segments, and {what}: record with "
                     "torch.cuda.memory._record_memory_history() before dumping (torchmem stats shows the segments)")
