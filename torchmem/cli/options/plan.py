"""The arguments of `torchmem plan`; the command itself is torchmem/cli/plan.py."""
from __future__ import annotations

import argparse

from torchmem.cli import arguments
from torchmem.plan.solve import METHODS, SHARINGS


def register(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = subparsers.add_parser("plan", help="plan static memory for buffers in a MiniMalloc CSV (id,lower,upper,size) "
                                           "or for an exported model (.pt2), optionally pipelined")
    p.add_argument("file", help="CSV with header id,lower,upper,size[,stream,reads,syncs] (half-open lifetimes "
                                "[lower, upper)), or a .pt2 file from torch.export.save with example inputs")
    p.add_argument("--method", default="auto", choices=METHODS, help="placement method (default auto)")
    p.add_argument("--time-limit", type=arguments.positive_float, default=None, metavar="S",
                   help="seconds for the exact search (default 10)")
    p.add_argument("--alignment", type=arguments.count(1), default=1, help="round offsets and sizes up to a multiple (default 1)")
    p.add_argument("--sharing", default="auto", choices=SHARINGS,
                   help="with streams: one shared slab, a region per stream, or the lower of both (default auto)")
    p.add_argument("--stages", type=arguments.count(1), default=None, metavar="K",
                   help="(.pt2) plan a K-stage pipeline, stages cut by measured node time")
    p.add_argument("--in-flight", type=arguments.count(1), default=2, metavar="N",
                   help="(.pt2 with --stages) copies of a tensor crossing one stage boundary (default 2)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument("--out", metavar="SOLUTION.csv", help="write id,lower,upper,size,offset[,stream,reads,syncs]")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
