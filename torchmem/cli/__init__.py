"""The `torchmem` command line: one module per subcommand.

Each module in COMMANDS defines ``register(subparsers)``, which adds its
subparser and sets ``func`` to a callable taking the parsed arguments and
returning an exit status.
"""
from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = ["demo", "replay", "advise", "ranks", "plan", "stats", "plot", "viz"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="torchmem", description="Memory toolkit for PyTorch.")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"torchmem.cli.{name}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except (ValueError, TypeError, OSError, RuntimeError) as exc:
        print(f"torchmem {args.command}: error: {exc}", file=sys.stderr)
        return 1
