"""`torchmem preflight`: run a script on a fake card with PyTorch's real allocator, and say whether it fits."""
from __future__ import annotations

import argparse
import json
import sys


def register(subparsers) -> None:
    from torchmem.cli import arguments
    from torchmem.fakegpu.cards import ALIASES, CARDS

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
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from torchmem.fakegpu import FakeGPUError, card
    from torchmem.preflight import OOM_EXIT, PreflightError, WorldError, check_conf, parse_ranks, run_command
    from torchmem.formats.trace_types import ArgumentError

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise ArgumentError("no command to run: give it after --, e.g. torchmem preflight --card 80GiB -- python train.py")
    try:
        chosen = card(args.card)
    except (ValueError, TypeError) as exc:
        raise ArgumentError(f"--card: {exc}") from None
    if args.devices > 64:
        raise ArgumentError(f"--devices must be 1 to 64, not {args.devices}")
    try:
        check_conf(args.conf)
    except ValueError as exc:
        raise ArgumentError(f"--{exc}") from None
    try:
        ranks = parse_ranks(args.ranks)
    except WorldError as exc:
        raise ArgumentError(str(exc)) from None
    if args.world_size is None and args.ranks != "0":
        raise ArgumentError("--ranks needs --world-size")
    if args.world_size is not None and args.devices != 1:
        raise ArgumentError("--devices does not go with --world-size: each rank sees as many devices as a node has")
    if args.search is not None:
        return _search(args, command)
    if args.cards is not None:
        raise ArgumentError("--cards needs --search (a single run's report lists every card)")
    sys.stdout.flush()
    try:
        report = run_command(command, chosen, args.devices, conf=args.conf, out=args.out, advise=not args.no_advise,
                             max_entries=args.max_entries, world_size=args.world_size, ranks=ranks,
                             stdout_to_stderr=args.json, steps=args.steps, read_weights=args.read_weights)
    except WorldError as exc:
        raise ArgumentError(str(exc)) from None
    except FakeGPUError as exc:
        print(f"torchmem preflight: error: {exc}", file=sys.stderr)
        return 1
    except PreflightError as exc:
        print(f"torchmem preflight: error: {exc}", file=sys.stderr)
        return exc.returncode
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(report.format())
    return 0 if report.fits else OOM_EXIT


def _search(args: argparse.Namespace, command: list[str]) -> int:
    import tempfile

    from torchmem.fakegpu import FakeGPUError
    from torchmem.preflight.search import SearchError, format_limits, parse_cards, parse_space, search
    from torchmem.formats.trace_types import ArgumentError

    if args.world_size is not None or args.devices != 1:
        raise ArgumentError("--search runs one process on one device: leave out --world-size and --devices")
    try:
        space, cards = parse_space(args.search), parse_cards(args.cards)
    except SearchError as exc:
        raise ArgumentError(str(exc)) from None
    if not 0 <= args.margin < 1:
        raise ArgumentError(f"--margin must be at least 0 and below 1, not {args.margin}")
    steps = args.steps or 3
    out = args.out or tempfile.mkdtemp(prefix="torchmem-search-")
    try:
        limits = search(command, space, cards, margin=args.margin, steps=steps, out=out, conf=args.conf)
    except (SearchError, FakeGPUError) as exc:
        print(f"torchmem preflight: error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"search": args.search, "margin": args.margin, "steps": steps, "out": out,
                          "cards": [limit.to_json() for limit in limits]}, indent=2))
    else:
        print(format_limits(limits, space, args.margin, steps))
        print(f"Probes' snapshots and reports: {out}")
    return 0
