"""`torchmem plan FILE.csv`: place the buffers of a MiniMalloc-format CSV."""
from __future__ import annotations

import json
import sys


def register(subparsers) -> None:
    from torchmem.plan.solve import METHODS

    p = subparsers.add_parser("plan", help="plan static memory for buffers in a MiniMalloc CSV (id,lower,upper,size)")
    p.add_argument("file", help="CSV with header id,lower,upper,size (half-open lifetimes [lower, upper))")
    p.add_argument("--method", default="auto", choices=METHODS, help="placement method (default auto)")
    p.add_argument("--time-limit", type=float, default=None, metavar="S",
                   help="seconds for the exact search (default 10)")
    p.add_argument("--alignment", type=int, default=1, help="round offsets and sizes up to a multiple (default 1)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument("--out", metavar="SOLUTION.csv", help="write id,lower,upper,size,offset")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.set_defaults(func=run)


def run(args) -> int:
    from torchmem.plan import load_csv, save_csv, solve

    if args.time_limit is not None and not args.time_limit > 0:
        raise ValueError(f"--time-limit must be > 0, got {args.time_limit}")
    buffers = load_csv(args.file)

    def progress(seconds: float, height: int, lower_bound: int, phase: str) -> None:
        gap = (height - lower_bound) / lower_bound * 100 if lower_bound else 0.0
        print(f"[{seconds:7.2f}s] height {height:,} ({gap:+.3f}% vs bound) by {phase}", file=sys.stderr, flush=True)

    show = not args.quiet
    plan = solve(buffers, method=args.method, time_limit=args.time_limit, alignment=args.alignment,
                 progress=progress if show else None)
    valid = plan.validate()
    if args.out:
        save_csv(plan, args.out)
    if args.json:
        print(json.dumps({
            "file": args.file,
            "buffers": len(buffers),
            "height": plan.height,
            "lower_bound": plan.lower_bound,
            "gap": plan.gap,
            "method": plan.method,
            "optimal": plan.optimal,
            "seconds": round(plan.seconds, 6),
            "valid": valid,
        }))
    else:
        print(f"{args.file}: {len(buffers)} buffers")
        print(f"  height       {plan.height:,}")
        print(f"  lower bound  {plan.lower_bound:,} ({plan.gap * 100:+.3f}%)")
        print(f"  method       {plan.method}{' (optimal)' if plan.optimal else ''}")
        print(f"  seconds      {plan.seconds:.3f}")
        print(f"  valid        {valid}")
    return 0 if valid else 1
