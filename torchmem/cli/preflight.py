"""`torchmem preflight`: run a script on a fake card with PyTorch's real allocator, and say whether it fits."""
from __future__ import annotations

import argparse
import json
import sys

from torchmem.fakegpu import FakeGPUError, card
from torchmem.formats.trace_types import ArgumentError
from torchmem.preflight import OOM_EXIT, PreflightError, WorldError, check_conf, parse_ranks, run_command
from torchmem.preflight.search import SearchError, format_limits, parse_cards, parse_space, search


def run(args: argparse.Namespace) -> int:
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
