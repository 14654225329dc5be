"""Static memory planner benchmarks: prints markdown tables.

    python benchmarks/bench_planner.py                      # all suites
    python benchmarks/bench_planner.py --suite challenging  # MiniMalloc's 11 crafted instances
    python benchmarks/bench_planner.py --suite idealloc     # real compiler traces
    python benchmarks/bench_planner.py --suite scale        # 100,000 synthetic buffers
    python benchmarks/bench_planner.py --suite bert         # BERT-base inference graph
    python benchmarks/bench_planner.py --suite pipeline     # BERT-base as a 2- and 4-stage pipeline
    python benchmarks/bench_planner.py --suite streams      # 20,000 synthetic buffers on 1, 2, 4 streams

Every plan is validated. Heights are compared with the lower bound (LB) and
with the size-first best-fit greedy in the same run. Times are wall-clock
seconds (time.perf_counter) around each call, conversions included.
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from torchmem.plan import Buffer, load_csv, solve  # noqa: E402

DATA = Path(os.environ.get("TORCHMEM_DSA_DATA", ROOT.parent / "shared" / "data" / "dsa"))
BEST_KNOWN = {"D": 1_038_336, "J": 1_041_408}


def pct(height: int, lb: int) -> str:
    return f"{(height - lb) / lb * 100:+.2f}%" if lb else "n/a"


def timed_solve(buffers, **kwargs):
    reached = {}

    def progress(seconds, height, lower_bound, phase):
        reached.setdefault(height, seconds)

    start, cpu = time.perf_counter(), time.process_time()
    plan = solve(buffers, progress=progress, **kwargs)
    seconds = time.perf_counter() - start
    reached["cpu"] = time.process_time() - cpu
    assert plan.validate(), plan.validation_error()
    return plan, seconds, reached


def challenging(time_limit: float) -> None:
    print(f"### MiniMalloc challenging suite (method auto, time limit {time_limit:g} s)\n")
    print("| instance | buffers | LB | best known | greedy | planned | vs LB | optimal | seconds | best known reached at |")
    print("|---|---:|---:|---:|---:|---:|---:|:-:|---:|---:|")
    for path in sorted((DATA / "minimalloc" / "challenging").glob("*.csv")):
        name = path.name.split(".")[0]
        bs = load_csv(path)
        greedy = solve(bs, method="greedy")
        plan, seconds, reached = timed_solve(bs, time_limit=time_limit)
        best = BEST_KNOWN.get(name, plan.lower_bound)
        at = min((s for h, s in reached.items() if h != "cpu" and h <= best), default=None)
        print(f"| {name} | {len(bs)} | {plan.lower_bound:,} | {best:,} | {greedy.height:,} ({pct(greedy.height, plan.lower_bound)}) "
              f"| {plan.height:,} | {pct(plan.height, plan.lower_bound)} | {'yes' if plan.optimal else 'no'} "
              f"| {seconds:.2f} | {'%.2f s' % at if at is not None else '-'} |", flush=True)
    print()


def idealloc(time_limit: float) -> None:
    print(f"### idealloc real traces (method auto, time limit {time_limit:g} s)\n")
    print("| trace | buffers | LB | greedy | greedy s | portfolio | portfolio s | planned | planned s | method |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for rel in ["somas_tensors/resnet50.csv", "iopddl/G_1.csv", "somas_tensors/pangu_2.6B.csv", "iopddl/S_1.csv",
                "iopddl/Y_1.csv"]:
        bs = load_csv(DATA / "idealloc" / rel)
        greedy, gs, _ = timed_solve(bs, method="greedy")
        port, ps, _ = timed_solve(bs, method="portfolio", time_limit=time_limit)
        plan, seconds, _ = timed_solve(bs, time_limit=time_limit)
        lb = plan.lower_bound
        print(f"| {Path(rel).stem} | {len(bs):,} | {lb:,} | {pct(greedy.height, lb)} | {gs:.2f} | {pct(port.height, lb)} "
              f"| {ps:.2f} | {pct(plan.height, lb)} | {seconds:.2f} | {plan.method}{' (optimal)' if plan.optimal else ''} |",
              flush=True)
    print()


def synthetic(n: int, seed: int = 0) -> list[Buffer]:
    """A trace-like instance: one allocation per step, sizes log-uniform from
    256 B to 64 MiB, most lifetimes 1-64 steps, 2% long-lived (up to 5,000)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        size = int(2 ** rng.uniform(8, 26))
        length = rng.randint(1000, 5000) if rng.random() < 0.02 else rng.randint(1, 64)
        out.append(Buffer(i, i, i + length, size))
    return out


def scale() -> None:
    bs = synthetic(100_000)
    print("### Scale: 100,000 synthetic buffers (one allocation per step; see synthetic())\n")
    print("| method | height vs LB | wall s | CPU s |")
    print("|---|---:|---:|---:|")
    for method in ["naive", "sweep", "greedy", "bottom_up", "portfolio"]:
        plan, seconds, info = timed_solve(bs, method=method, time_limit=30)
        print(f"| {method} | {pct(plan.height, plan.lower_bound)} | {seconds:.2f} | {info['cpu']:.2f} |", flush=True)
    print()


def bert(time_limit: float) -> None:
    sys.path.insert(0, str(ROOT / "examples"))
    from plan_model import bert_analysis, table

    start = time.perf_counter()
    _, analysis = bert_analysis(32, 128, 12)
    print(f"### BERT-base inference (batch 32, sequence 128, hidden 768, 12 layers; "
          f"traced and run once in {time.perf_counter() - start:.1f} s)\n")
    rows = table(analysis, time_limit)
    bound = rows[4][1]
    print("| strategy | MiB | vs bound | note |\n|---|---:|---:|---|")
    for name, size, note in rows:
        print(f"| {name} | {size / 2**20:,.1f} | {size / bound:.3f}x | {note} |")
    print()


def pipeline_suite(time_limit: float, timing_runs: int, in_flight: int) -> None:
    sys.path.insert(0, str(ROOT / "examples"))
    from plan_model import bert_analysis, bert_inputs, pipeline_table

    from torchmem.plan.fx import measure_seconds

    start = time.perf_counter()
    gm, analysis = bert_analysis(32, 128, 12)
    traced = time.perf_counter() - start
    start = time.perf_counter()
    costs = measure_seconds(gm, *bert_inputs(32, 128), runs=timing_runs)
    print(f"### BERT-base inference as a pipeline (batch 32, sequence 128, 12 layers; {len(analysis.names)} nodes; "
          f"traced and run in {traced:.1f} s; node times: median of {timing_runs} runs, {time.perf_counter() - start:.1f} s, "
          f"{torch.get_num_threads()} threads)\n")
    start = time.perf_counter()
    print("\n".join(pipeline_table(analysis, costs, (2, 4), in_flight, time_limit)))
    print(f"\n(planned in {time.perf_counter() - start:.1f} s)\n")
    # The same steady state unrolled over a finite run and planned by the
    # stream planner: copies need not be fixed, but offsets differ per item.
    from torchmem.plan import pipeline

    print("| stages | fixed copies (pipeline) | unrolled run, stream planner | sharing | stream bound | items |")
    print("|---:|---:|---:|---|---:|---:|")
    for k in (2, 4):
        p = pipeline(analysis, stages=k, in_flight=in_flight, cost=costs, time_limit=time_limit, steady_items=k + 4)
        run = solve(p.steady_state.buffers, time_limit=time_limit)
        assert run.validate()
        print(f"| {k} | {p.height / 2**20:,.1f} MiB | {run.height / 2**20:,.1f} MiB | {run.sharing} "
              f"| {run.lower_bound / 2**20:,.1f} MiB | {k + 4} |", flush=True)
    print()


def stream_schedule(n: int, streams: int, seed: int = 0) -> list[Buffer]:
    """A trace-like instance on several streams: one allocation per step on a
    random stream (sizes log-uniform 256 B to 64 MiB, lifetimes 1-64 steps,
    2% up to 5,000); 30% of buffers are also read on another stream 1-32
    steps later, with a sync from the producer before the read and one back
    1-16 steps after it; every 500 steps all streams synchronise pairwise."""
    from torchmem.plan import Sync

    rng = random.Random(seed)
    out = []
    for i in range(n):
        size = int(2 ** rng.uniform(8, 26))
        length = rng.randint(1000, 5000) if rng.random() < 0.02 else rng.randint(1, 64)
        home = rng.randrange(streams)
        reads, syncs = [], []
        if streams > 1 and rng.random() < 0.3:
            other = (home + rng.randint(1, streams - 1)) % streams
            step = i + rng.randint(1, 32)
            reads.append((other, step))
            syncs += [Sync(home, i, other, step), Sync(other, step, home, step + rng.randint(1, 16))]
        if i % 500 == 499:
            syncs += [Sync(a, i, b, i + 1) for a in range(streams) for b in range(streams) if a != b]
        out.append(Buffer(i, i, i + length, size, home, reads, syncs))
    return out


def streams_suite(time_limit: float) -> None:
    from torchmem.plan import lower_bound

    n = 20_000
    print(f"### Several streams: {n:,} synthetic buffers (see stream_schedule()), method auto, "
          f"time limit {time_limit:g} s\n")
    print("| streams | bound without streams | bound with streams | shared | per_stream | auto (wall s) |")
    print("|---:|---:|---:|---:|---:|---:|")
    for streams in (1, 2, 4):
        bs = stream_schedule(n, streams)
        plain = lower_bound([Buffer(b.id, b.lower, b.upper, b.size) for b in bs])
        runs = {sharing: timed_solve(bs, sharing=sharing, time_limit=time_limit)
                for sharing in ("shared", "per_stream", "auto")}
        lb = runs["auto"][0].lower_bound
        auto, seconds, _ = runs["auto"]
        print(f"| {streams} | {plain:,} | {lb:,} ({pct(lb, plain)}) | {pct(runs['shared'][0].height, lb)} "
              f"| {pct(runs['per_stream'][0].height, lb)} | {pct(auto.height, lb)} ({seconds:.2f}) |", flush=True)
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", choices=["all", "challenging", "idealloc", "scale", "bert", "pipeline", "streams"],
                        default="all")
    parser.add_argument("--timing-runs", type=int, default=3, help="pipeline suite: runs to time each node (median)")
    parser.add_argument("--in-flight", type=int, default=2, help="pipeline suite: copies across one stage boundary")
    parser.add_argument("--time-limit", type=float, default=None,
                        help="seconds per solve (default: 10 for challenging/bert, 60 for idealloc)")
    args = parser.parse_args()
    if args.suite in ("all", "challenging"):
        challenging(args.time_limit or 10.0)
    if args.suite in ("all", "idealloc"):
        idealloc(args.time_limit or 60.0)
    if args.suite in ("all", "scale"):
        scale()
    if args.suite in ("all", "bert"):
        bert(args.time_limit or 10.0)
    if args.suite in ("all", "pipeline"):
        pipeline_suite(args.time_limit or 10.0, args.timing_runs, args.in_flight)
    if args.suite in ("all", "streams"):
        streams_suite(args.time_limit or 10.0)


if __name__ == "__main__":
    main()
