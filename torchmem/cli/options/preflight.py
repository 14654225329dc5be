"""The arguments of `torchmem preflight`; the command itself is torchmem/cli/preflight.py."""
from __future__ import annotations

import argparse

from torchmem.cli import arguments
from torchmem.fakegpu.cards import ALIASES, CARDS


def register(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = subparsers.add_parser(
        "preflight",
        help="run a training script on a fake GPU of any size and say whether it fits",
        description="Run COMMAND on the fake GPU (PyTorch's CUDA build and its own caching allocator; device memory "
        "in host memory; kernels skipped, so values computed on the device are garbage). Each process records its "
        "allocator history from the start and writes its native snapshot at exit or at its first uncaught "
        "out-of-memory error. Prints, per device, the peak allocated, the peak reserved and whether and where it "
        "ran out of memory, then torchmem advise's table. A named card is the real card: its total_memory, and the "
        "memory its CUDA context and libraries hold outside PyTorch's allocator, taken before the script runs; the "
        "run fits when peak reserved plus that memory stays within total_memory. A bare size assumes nothing "
        "outside the allocator. Exit status: 0 when it fits, 3 when it does not (out of memory, or over the card "
        "with the outside memory), the command's own status when it failed for another reason, 2 for bad "
        "arguments (docs/preflight.md).",
    )
    p.add_argument("--card", default="80GiB",
                   help=f"the card: {', '.join(sorted(CARDS))} (also {', '.join(sorted(ALIASES))}), or a bare size "
                        "(80GiB, 24GB, ...: nothing assumed outside the allocator) (default 80GiB)")
    p.add_argument("--devices", type=arguments.count(1), default=1, help="devices per process, 1 to 64 (default 1)")
    p.add_argument("--world-size", type=arguments.count(1), default=None,
                   help="run only some ranks of a job of this many ranks, from this machine; a torchrun launcher "
                        "in COMMAND is read for its node layout (docs/preflight.md)")
    p.add_argument("--ranks", default="0", help="with --world-size: which ranks run, e.g. 0, 0,63 or 0-7 (default 0)")
    p.add_argument("--conf", default=None, type=arguments.conf,
                   help="PYTORCH_CUDA_ALLOC_CONF for the run (default: the environment's)")
    p.add_argument("--out", default=None, help="folder for the snapshots and reports (default: a new temporary one)")
    p.add_argument("--max-entries", type=arguments.count(1), default=None,
                   help="history entries kept per device (default: all)")
    p.add_argument("--steps", type=arguments.count(1), default=None,
                   help="end each process after this many optimizer steps, and give each step's peaks "
                        "(torch.optim's steps, DeepSpeed's engine steps)")
    p.add_argument("--search", default=None, metavar="NAME=LO..HI",
                   help="find the largest integer {NAME} in COMMAND (or environment variable NAME) that fits each card "
                        "of --cards, by bisection over probes of --steps steps (default 3)")
    p.add_argument("--cards", default=None, help="with --search: catalog names and sizes, comma-separated "
                                                 "(default: the whole catalog)")
    p.add_argument("--margin", type=float, default=0.05,
                   help="with --search: the share of each card left free (default 0.05)")
    p.add_argument("--read-weights", action="store_true",
                   help="read safetensors checkpoints whole (default: their headers alone; the values are garbage "
                        "on the fake GPU anyway)")
    p.add_argument("--no-advise", action="store_true", help="skip advise's table")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object; the command's own output goes to stderr")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- the command to run, e.g. -- python train.py ARGS")
