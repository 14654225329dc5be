"""The arguments of `torchmem demo`; the command itself is torchmem/cli/demo.py."""
from __future__ import annotations

import argparse

from torchmem.cli import arguments


def register(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = subparsers.add_parser("demo", help="install torchmem on the CPU, train a small model, show memory")
    p.add_argument("--steps", type=arguments.count(1), default=8, help="training steps (default 8)")
    p.add_argument("--out", default="out", help="folder for pictures (default ./out)")
