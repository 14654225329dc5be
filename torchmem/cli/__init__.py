"""The `torchmem` command line: one module per subcommand.

Each module in COMMANDS defines ``register(subparsers)``, which adds its
subparser and sets ``func`` to a callable taking the parsed arguments and
returning an exit status. Bad arguments exit with status 2, bad input with
1, each with one line on stderr (arguments.py).
"""
from __future__ import annotations

import argparse
import importlib

COMMANDS = ["demo", "replay", "advise", "ranks", "plan", "stats", "plot", "viz", "preflight"]


def build_parser() -> argparse.ArgumentParser:
    from torchmem.cli.arguments import Parser

    parser = Parser(prog="torchmem", description="Memory toolkit for PyTorch.")
    # dest is not "command": a subcommand may have an argument of that name (preflight's -- COMMAND)
    subparsers = parser.add_subparsers(dest="subcommand", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"torchmem.cli.{name}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.error(f"a command is needed: {', '.join(COMMANDS)}")
    from torchmem.cli.arguments import run_command

    return run_command(args.subcommand, args.func, args)
