"""python -m torchmem.fakegpu [--card SIZE|NAME] [--devices N] [--hold] [--log FILE] -- COMMAND...

Runs COMMAND on the fake GPU (docs/fakegpu.md); its exit status is the
command's. The stand-ins are those of the CUDA major of the torch that
COMMAND's Python runs (COMMAND itself, or its script's #! interpreter; else
this interpreter). Exit status 2 for bad arguments, 1 when the fake GPU (or
the set for that CUDA major) is not built.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys

from torchmem.fakegpu import CARDS, FakeGPUError, card, environment


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(
        prog="python -m torchmem.fakegpu",
        description="Run a command on a fake GPU: PyTorch's CUDA build and its real caching allocator, device "
                    "memory in host memory, kernels skipped (values computed on the device are garbage).")
    parser.add_argument("--card", default="80GiB",
                        help=f"the card's memory (80GiB, 24GB, ...) or a card: {', '.join(sorted(CARDS))} "
                             "(default 80GiB)")
    parser.add_argument("--devices", type=int, default=1, help="number of devices, 1 to 64 (default 1)")
    parser.add_argument("--hold", action="store_true", help="hold every stream's work until synchronised")
    parser.add_argument("--log", help="file that gets a line for every call the fake GPU does not implement")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- the command to run")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --, e.g. -- python train.py")
    try:
        chosen = card(args.card)
        env = environment(chosen, args.devices, hold=args.hold, log=args.log, command=command)
    except ValueError as exc:
        parser.error(str(exc))
    except FakeGPUError as exc:
        print(f"torchmem.fakegpu: {exc}", file=sys.stderr)
        return 1
    program = shutil.which(command[0], path=env.get("PATH"))
    if program is None:
        print(f"torchmem.fakegpu: {command[0]}: command not found", file=sys.stderr)
        return 127
    sys.stdout.flush()
    os.execve(program, command, env)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
