"""The `torchmem` command line: one module per subcommand, and one for its arguments.

Each name in COMMANDS has ``torchmem/cli/options/NAME.py``, whose
``register(subparsers)`` adds the subparser, and ``torchmem/cli/NAME.py``,
whose ``run(args)`` runs it and returns an exit status. Only the command that
runs is imported. Bad arguments exit with status 2, bad input with 1, each
with one line on stderr (arguments.py).
"""
from __future__ import annotations

import argparse
import importlib

from torchmem.cli.arguments import Parser, run_command

COMMANDS = ["demo", "replay", "advise", "ranks", "plan", "stats", "plot", "viz", "preflight"]


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="torchmem", description="Memory toolkit for PyTorch.")
    # dest is not "command": a subcommand may have an argument of that name (preflight's -- COMMAND)
    subparsers = parser.add_subparsers(dest="subcommand", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"torchmem.cli.options.{name}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.subcommand is None:
        parser.error(f"a command is needed: {', '.join(COMMANDS)}")
    command = importlib.import_module(f"torchmem.cli.{args.subcommand}")
    return run_command(args.subcommand, command.run, args)
