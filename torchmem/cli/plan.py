"""`torchmem plan FILE`: place the buffers of a MiniMalloc-format CSV (with
optional stream columns), or plan an exported model (``.pt2`` from
``torch.export.save``, run once on its recorded example inputs), optionally as
a K-stage pipeline (``--stages K --in-flight N``)."""
from __future__ import annotations

import json
import sys
from typing import Any

from torchmem.formats.input_files import open_head
from torchmem.formats.trace_types import ArgumentError, TraceError
from torchmem.plan import load_csv, save_csv, solve
from torchmem.plan.buffers import has_streams
from torchmem.plan.fx import analyze, plan_graph
from torchmem.plan.pipeline_plan import pipeline


def run(args) -> int:
    head = open_head(args.file)  # a missing file, a directory, no permission, an empty file: one line each
    if args.file.endswith(".pt2"):
        return _run_model(args)
    if args.stages is not None:
        raise ArgumentError("--stages needs a model graph: a .pt2 file from torch.export.save")
    _check_csv_head(args.file, head)
    return _run_csv(args)


def _check_csv_head(path: str, head: bytes) -> None:
    """A CSV is text: say what a pickle, a .pt2 (zip) or other binary file given instead is."""

    what = ("a pickle (a memory snapshot? torchmem replay and advise read those)" if head[:1] == b"\x80" else
            "a zip archive (an exported model? plan reads it from a file named .pt2)" if head[:2] == b"PK" else
            "not UTF-8 text" if _not_utf8(head) else "")
    if what:
        raise TraceError(f"{path}: {what}, not a CSV of buffers (expected a header id,lower,upper,size)")


def _not_utf8(head: bytes) -> bool:
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc.start < len(head) - 4  # a character cut at the end of the head is not a fault
    return b"\0" in head


def _progress(seconds: float, height: int, lower_bound: int, phase: str) -> None:
    gap = (height - lower_bound) / lower_bound * 100 if lower_bound else 0.0
    print(f"[{seconds:7.2f}s] height {height:,} ({gap:+.3f}% vs bound) by {phase}", file=sys.stderr, flush=True)


def _run_csv(args) -> int:
    buffers = load_csv(args.file)
    plan = solve(buffers, method=args.method, time_limit=args.time_limit, alignment=args.alignment,
                 progress=None if args.quiet else _progress, sharing=args.sharing)
    valid = plan.validate()
    if args.out:
        save_csv(plan, args.out)
    streams = sorted({b.stream for b in buffers} | {r.stream for b in buffers for r in b.reads})
    if args.json:
        out: dict[str, Any] = {
            "file": args.file,
            "buffers": len(buffers),
            "height": plan.height,
            "lower_bound": plan.lower_bound,
            "gap": plan.gap,
            "method": plan.method,
            "optimal": plan.optimal,
            "seconds": round(plan.seconds, 6),
            "valid": valid,
        }
        if has_streams(buffers):
            out["streams"] = streams
            out["sharing"] = plan.sharing
        print(json.dumps(out))
    else:
        print(f"{args.file}: {len(buffers)} buffers" + (f" on streams {streams}" if has_streams(buffers) else ""))
        print(f"  height       {plan.height:,}")
        print(f"  lower bound  {plan.lower_bound:,} ({plan.gap * 100:+.3f}%)")
        print(f"  method       {plan.method}{' (optimal)' if plan.optimal else ''}")
        if plan.sharing:
            print(f"  sharing      {plan.sharing}")
        print(f"  seconds      {plan.seconds:.3f}")
        print(f"  valid        {valid}")
    return 0 if valid else 1


def _load_model(path: str):
    import torch

    try:
        program = torch.export.load(path)
    except Exception as exc:  # torch raises several types for a file that is not an exported program
        raise ValueError(f"{path}: cannot load an exported program ({type(exc).__name__}: {exc})") from None
    inputs = getattr(program, "example_inputs", None)
    if not inputs:
        raise ValueError(f"{path}: the exported program has no example inputs (export it with torch >= 2.4)")
    args, kwargs = inputs
    if kwargs:
        raise ValueError(f"{path}: keyword example inputs are not supported")
    return program.module(), args


def _run_model(args) -> int:
    gm, inputs = _load_model(args.file)
    analysis = analyze(gm, *inputs)
    if args.stages is None:
        gp = plan_graph(None, analysis=analysis, method=args.method, time_limit=args.time_limit,
                        alignment=args.alignment)
        plan = gp.plan
        if args.out:
            save_csv(plan, args.out)
        valid = plan.validate()
        if args.json:
            print(json.dumps({"file": args.file, "nodes": len(analysis.names), "buffers": len(plan.buffers),
                              "height": plan.height, "lower_bound": plan.lower_bound, "naive": gp.naive_bytes,
                              "method": plan.method, "optimal": plan.optimal, "valid": valid}))
        else:
            print(f"{args.file}: {len(analysis.names)} nodes, {len(plan.buffers)} buffers")
            print(f"  height       {plan.height:,}")
            print(f"  lower bound  {plan.lower_bound:,} ({plan.gap * 100:+.3f}%)")
            print(f"  no reuse     {gp.naive_bytes:,}")
            print(f"  valid        {valid}")
        return 0 if valid else 1
    if args.out:
        raise ValueError("--out writes a buffer placement; a pipeline plan has one per stage (use the Python API)")
    p = pipeline(analysis, stages=args.stages, in_flight=args.in_flight, method=args.method,
                 time_limit=args.time_limit, alignment=args.alignment)
    if args.json:
        print(json.dumps({
            "file": args.file, "nodes": len(analysis.names), "stages": len(p.stages), "in_flight": p.in_flight,
            "height": p.height, "lower_bound": p.lower_bound, "slot_bytes": p.slot_bytes,
            "sequential_height": p.sequential.height, "sequential_lower_bound": p.sequential.lower_bound,
            "extra_bytes": p.extra_bytes, "speedup": p.speedup,
            "stage_costs": [s.cost for s in p.stages], "stage_heights": [s.plan.height for s in p.stages],
            "valid": True,
        }))
    else:
        print(f"{args.file}: {len(analysis.names)} nodes")
        print(p.summary())
    return 0
