"""GPU benchmark: PyTorch's native CUDA caching allocator against torchmem.

Workloads, each run in its own interpreter per allocator (PyTorch allows one
allocator swap per process):
  empty_del  torch.empty / del over mixed sizes (512 B .. 64 MiB, a window of
             live tensors), the allocator's own cost;
  size_classes  torch.empty / del at once, cycling through one size of each
             class (512 B, 64 KiB, 1 MiB small pool; 4 MiB, 9 MiB in 20 MiB
             segments; 30 MiB, 100 MiB large): the cached hot path alone;
  empty_del_rs  empty_del where every other tensor is used on a side stream
             (record_stream) before it is freed: an event per such free,
             queried at later allocations;
  gpt2       a GPT-2-sized (124M: 12 layers, hidden 768) training step in
             bf16 autocast, batch 8, with a different sequence length each
             step (128 .. 1024), the case that fragments; built from torch.nn.
Native and torchmem runs alternate, --rounds times (default 2), each in a
fresh interpreter. Each run reports step time (median), peak allocated and
peak reserved; the summary gives the median over rounds, the torchmem /
native step-time ratio and each round's ratio. The native allocator's history
on the same workloads (--record-steps steps) is recorded with
torch.cuda.memory._record_memory_history, dumped (_dump_snapshot) next to the
results and replayed exactly through torchmem's simulator (`torchmem replay`'s
engine): every allocation at its native address, the final segments block by
block. --budget stops starting runs that would not end in time.

On the fake GPU (python -m torchmem.fakegpu -- python benchmarks/bench_cuda.py)
kernels are skipped, so a step's time is the CPU's: PyTorch's dispatch and the
allocator, native's or torchmem's. gpt2 needs cuBLAS and is left out there.

    python benchmarks/bench_cuda.py --out out/bench_cuda        # all, about 2 minutes on an H200
    python benchmarks/bench_cuda.py --replay bench_cuda.json DIR  # replay an earlier run's histories, no GPU
    python benchmarks/bench_cuda.py --child gpt2 native --json r.json   # one run
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKLOADS = ("empty_del", "size_classes", "empty_del_rs", "gpt2")
FAKE_GPU = os.environ.get("TORCHMEM_FAKEGPU") == "1"
FAKE_GPU_WORKLOADS = ("empty_del", "size_classes", "empty_del_rs")  # gpt2 needs cuBLAS
# A step's time: wall (perf_counter), or the main thread's CPU time, which a
# shared machine's other work does not inflate; on the fake GPU every step is
# CPU work, so that is the default there. $TORCHMEM_BENCH_CLOCK overrides.
CLOCK = os.environ.get("TORCHMEM_BENCH_CLOCK") or ("cpu" if FAKE_GPU else "wall")
ALLOCATORS = ("native", "torchmem")


# ---------------------------------------------------------------- workloads (child side)


def empty_del(torch, steps: int = 30, ops_per_step: int = 2000, seed: int = 0):
    """Yields once per step; each step allocates and frees ops_per_step tensors."""
    import random

    rng = random.Random(seed)
    live: list = []
    for _ in range(steps):
        for _ in range(ops_per_step):
            if live and (len(live) >= 64 or rng.random() < 0.45):
                live.pop(rng.randrange(len(live)))
            else:
                size = int(2 ** rng.uniform(9, 26))  # 512 B .. 64 MiB, log-uniform
                live.append(torch.empty(size, dtype=torch.uint8, device="cuda"))
        yield
    live.clear()


def size_classes(torch, steps: int = 30, ops_per_step: int = 2000):
    """Yields once per step; each step allocates and at once frees ops_per_step tensors."""
    sizes = (512, 64 << 10, 1 << 20, 4 << 20, 9 << 20, 30 << 20, 100 << 20)
    for _ in range(steps):
        for i in range(ops_per_step):
            t = torch.empty(sizes[i % len(sizes)], dtype=torch.uint8, device="cuda")
            del t
        yield


def empty_del_rs(torch, steps: int = 30, ops_per_step: int = 2000, seed: int = 0):
    """empty_del with every other tensor recorded on a side stream before its free."""
    import random

    rng = random.Random(seed)
    side = torch.cuda.Stream()
    live: list = []
    for _ in range(steps):
        for i in range(ops_per_step):
            if live and (len(live) >= 64 or rng.random() < 0.45):
                live.pop(rng.randrange(len(live)))
            else:
                size = int(2 ** rng.uniform(9, 26))
                t = torch.empty(size, dtype=torch.uint8, device="cuda")
                if i % 2:
                    t.record_stream(side)
                live.append(t)
        yield
    live.clear()


def gpt2_model(torch, vocab=50257, dim=768, layers=12, heads=12, max_len=1024):
    nn = torch.nn
    F = torch.nn.functional

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(dim)
            self.qkv = nn.Linear(dim, 3 * dim)
            self.proj = nn.Linear(dim, dim)
            self.ln2 = nn.LayerNorm(dim)
            self.fc = nn.Linear(dim, 4 * dim)
            self.out = nn.Linear(4 * dim, dim)

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
            q, k, v = (z.view(b, t, heads, c // heads).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
            return x + self.out(F.gelu(self.fc(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(vocab, dim)
            self.pos = nn.Embedding(max_len, dim)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln = nn.LayerNorm(dim)
            self.head = nn.Linear(dim, vocab, bias=False)
            self.head.weight = self.tok.weight

        def forward(self, idx):
            x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
            for block in self.blocks:
                x = block(x)
            return self.head(self.ln(x))

    return GPT()


def gpt2(torch, steps: int = 30, batch: int = 8, seed: int = 0):
    import random

    rng = random.Random(seed)
    torch.manual_seed(seed)
    model = gpt2_model(torch).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    for _ in range(steps):
        t = rng.choice((128, 256, 384, 512, 640, 768, 896, 1024))
        idx = torch.randint(0, 50257, (batch, t + 1), device="cuda")
        inputs, targets = idx[:, :-1], idx[:, 1:]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(inputs)
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        del logits, loss, idx, inputs, targets
        yield


def run_child(workload: str, allocator: str, record: str | None, warmup: int, steps: int | None = None) -> dict:
    note = ""
    if allocator == "torchmem":
        import torchmem
        from torchmem.runtime import cuda as tmcuda
        from torchmem.runtime.devices import cuda_installed

        torchmem.install()  # before anything touches CUDA
        if not cuda_installed():
            tmcuda.install_cuda()
            note = "torchmem.install() did not install on CUDA; installed with torchmem.runtime.cuda.install_cuda()"
    import torch

    if record:
        torch.cuda.memory._record_memory_history(max_entries=1_000_000, stacks="python")
    steps = {"empty_del": empty_del, "size_classes": size_classes, "empty_del_rs": empty_del_rs,
             "gpt2": gpt2}[workload](torch, **({"steps": steps} if steps else {}))
    times, cpu_times = [], []  # wall; the thread's CPU time (time.thread_time)
    for i, _ in enumerate(iter(lambda: None, 0)):
        torch.cuda.synchronize()
        start, start_cpu = time.perf_counter(), time.thread_time()
        try:
            next(steps)
        except StopIteration:
            break
        torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - start)
            cpu_times.append(time.thread_time() - start_cpu)
        if i == warmup - 1 and not record:  # a recorded run keeps whole-run peaks, as its trace does
            torch.cuda.reset_peak_memory_stats()
    stats = torch.cuda.memory_stats()
    result = {
        "workload": workload,
        "allocator": allocator,
        "steps": len(times),
        "step_ms_median": 1000 * statistics.median(cpu_times if CLOCK == "cpu" else times),
        "clock": CLOCK,
        "step_wall_ms_median": 1000 * statistics.median(times),
        "step_cpu_ms_median": 1000 * statistics.median(cpu_times),
        "step_ms_mean": 1000 * statistics.fmean(times),
        "total_s": sum(times),
        "peak_allocated": stats.get("allocated_bytes.all.peak", 0),
        "peak_reserved": stats.get("reserved_bytes.all.peak", 0),
        "num_device_alloc": stats.get("num_device_alloc", 0),
        "num_alloc_retries": stats.get("num_alloc_retries", 0),
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0),
        "backend": torch.cuda.get_allocator_backend(),
        "note": note,
    }
    if record:
        result["gpu_total_bytes"] = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.memory._dump_snapshot(record)
        torch.cuda.memory._record_memory_history(enabled=None)
        result["snapshot"] = record
    return result


# ---------------------------------------------------------------- driver


def spawn(workload: str, allocator: str, out: str, record: bool, timeout: int, tag: str = "",
          steps: int | None = None) -> dict:
    name = f"{workload}_{allocator}{'_history' if record else ''}{tag}"
    path = os.path.join(out, f"{name}.json")
    cmd = [sys.executable, os.path.abspath(__file__), "--child", workload, allocator, "--json", path]
    if record:
        cmd += ["--record", os.path.join(out, f"{workload}_{allocator}_snapshot.pickle")]
    if steps:
        cmd += ["--steps", str(steps)]
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"workload": workload, "allocator": allocator, "error": f"timed out after {timeout} s",
                "wall_s": time.perf_counter() - t0}
    with open(os.path.join(out, f"{name}.log"), "w") as f:
        f.write(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        return {"workload": workload, "allocator": allocator, "error": proc.stderr[-1500:],
                "wall_s": time.perf_counter() - t0}
    with open(path) as f:
        result = json.load(f)
    result["wall_s"] = time.perf_counter() - t0
    return result


def replay_comparison(history: list[dict]) -> list[dict]:
    """Each recorded native run replayed exactly through torchmem's simulator
    (the same caching allocator on a simulated device of the GPU's size, the
    snapshot's settings, start state and recorded addresses): does every
    allocation land at its native address, and do the peaks and the final
    segments, block by block, match the native allocator's?"""
    try:
        import pickle

        from torchmem import replay as sim
        from torchmem.formats.snapshot_format import block_state
    except Exception as e:  # a build without the replayer, or without numpy
        return [{"error": f"replay unavailable: {type(e).__name__}: {e}"}]
    rows = []
    for run in history:
        if "error" in run or "snapshot" not in run:
            continue
        row = {"workload": run["workload"]}
        try:
            result = sim.replay(run["snapshot"], capacity=run["gpu_total_bytes"])
            with open(run["snapshot"], "rb") as f:
                native_snapshot = pickle.load(f)
            device = result.recorded.device if result.recorded else 0
            native = [s for s in native_snapshot["segments"] if s.get("device", device) == device]
            native_segments = sorted(s["total_size"] for s in native)
            replay_segments = sorted(s["total_size"] for s in result.segments)

            def layout(segments: list[dict]) -> list:
                return sorted((s["address"], s["total_size"], tuple(
                    (b["address"], b["size"], block_state(b)) for b in s["blocks"])) for s in segments)

            fidelity = result.fidelity or {}
            row.update(
                native_peak_allocated=run["peak_allocated"],
                replay_peak_allocated=result.peak_allocated,
                native_peak_reserved=run["peak_reserved"],
                replay_peak_reserved=result.peak_reserved,
                native_segments=len(native_segments),
                replay_segments=len(replay_segments),
                segments_match=native_segments == replay_segments,
                peaks_match=(run["peak_allocated"], run["peak_reserved"]) == (result.peak_allocated, result.peak_reserved),
                completed=result.completed,
                skipped_events=result.skipped,
                placements_matched=fidelity.get("placements_matched", 0),
                placements=fidelity.get("placements_matched", 0) + fidelity.get("placements_differed", 0),
                exact=result.exact,
                final_layout_match=result.completed and layout(native) == layout(result.segments),
            )
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {e}"
        rows.append(row)
    return rows


def earlier_history(results_json: str, snapshot_dir: str) -> list[dict]:
    """An earlier run's recorded native runs, their snapshots looked up in `snapshot_dir` by name."""
    with open(results_json) as f:
        history = json.load(f)["native_history"]
    runs = []
    for run in history:
        if "snapshot" in run:
            path = os.path.join(snapshot_dir, os.path.basename(run["snapshot"]))
            if os.path.exists(path):
                runs.append(dict(run, snapshot=path))
    return runs


def replay_table(rows: list[dict]) -> str:
    lines = [
        "",
        "Native history replayed through torchmem's simulator:",
        "",
        "| workload | allocations at their native address | final segments block by block | peak allocated MiB native / replay | peak reserved MiB native / replay | segments native / replay |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r.get('workload', '-')} | {r['error']} | | | | |")
            continue
        lines.append(
            f"| {r['workload']} | {r['placements_matched']:,} of {r['placements']:,}{' (exact)' if r['exact'] else ''} | "
            f"{'match' if r['final_layout_match'] else 'differ'} | "
            f"{mib(r['native_peak_allocated'])} / {mib(r['replay_peak_allocated'])} | "
            f"{mib(r['native_peak_reserved'])} / {mib(r['replay_peak_reserved'])} | "
            f"{r['native_segments']} / {r['replay_segments']} |"
        )
    return "\n".join(lines)


def mib(n) -> str:
    return f"{n / 2**20:,.1f}"


def summarise(results: list[dict]) -> str:
    """One row per workload and allocator: medians over the rounds, the ratio of the
    medians, each round's ratio (runs alternate, native first), peaks."""
    lines = [
        f"| workload | allocator | runs | step ms (median, {'CPU' if CLOCK == 'cpu' else 'wall'}) | ratio vs native | ratio per round | peak allocated MiB | peak reserved MiB | device allocs |",
        "|---|---|---:|---:|---:|---|---:|---:|---:|",
    ]
    for w in dict.fromkeys(r["workload"] for r in results):
        runs = {a: [r for r in results if r["workload"] == w and r["allocator"] == a] for a in ALLOCATORS}
        ok = {a: [r for r in rs if "error" not in r] for a, rs in runs.items()}
        median = {a: statistics.median(r["step_ms_median"] for r in rs) for a, rs in ok.items() if rs}
        for a in ALLOCATORS:
            failed = [r for r in runs[a] if "error" in r]
            if not ok[a]:
                if failed:
                    last = failed[-1]["error"].strip().splitlines()
                    lines.append(f"| {w} | {a} | {len(runs[a])} | failed: {last[-1][:200] if last else '?'} | | | | | |")
                continue
            ratio = median[a] / median["native"] if "native" in median else float("nan")
            native_by_round = {r.get("round"): r for r in ok["native"]}
            per_round = [t["step_ms_median"] / native_by_round[t.get("round")]["step_ms_median"]
                         for t in ok["torchmem"] if t.get("round") in native_by_round]
            last = ok[a][-1]
            lines.append(
                f"| {w} | {a} | {len(ok[a])}{f' ({len(failed)} failed)' if failed else ''} | {median[a]:.3f} | "
                f"{ratio:.3f} | {', '.join(f'{x:.3f}' for x in per_round) if a == 'torchmem' else ''} | "
                f"{mib(max(r['peak_allocated'] for r in ok[a]))} | {mib(max(r['peak_reserved'] for r in ok[a]))} | "
                f"{last['num_device_alloc']} |"
            )
    return "\n".join(lines)


class Budget:
    """Seconds left for the runs; a run starts only when its expected time (the
    longest earlier run of its workload, else `first_guess`) fits."""

    def __init__(self, seconds: float | None, first_guess: float):
        self.end = None if seconds is None else time.perf_counter() + seconds
        self.first_guess = first_guess
        self.took: dict[str, float] = {}

    def left(self) -> float:
        return float("inf") if self.end is None else self.end - time.perf_counter()

    def allows(self, workload: str) -> bool:
        return self.left() >= self.took.get(workload, self.first_guess) + 5

    def timeout(self, per_run: int) -> int:
        return int(max(5, min(per_run, self.left() - 5)))

    def done(self, workload: str, result: dict) -> None:
        self.took[workload] = max(self.took.get(workload, 0.0), result.get("wall_s", 0.0))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.environ.get("OUT") or os.path.join(ROOT, "out", "bench_cuda"))
    p.add_argument("--child", nargs=2, metavar=("WORKLOAD", "ALLOCATOR"))
    p.add_argument("--json", help="child: where to write the result")
    p.add_argument("--record", help="child: record history and dump the snapshot here")
    p.add_argument("--steps", type=int, default=None, help="steps of each timed run (default: the workload's)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--timeout", type=int, default=150, help="seconds per run")
    p.add_argument("--rounds", type=int, default=2, help="native / torchmem pairs per workload, alternating")
    p.add_argument("--record-steps", type=int, default=10, help="steps of each recorded native run")
    p.add_argument("--budget", type=float, default=None, help="seconds for everything; runs that would not fit are skipped")
    p.add_argument("--workloads", default=",".join(FAKE_GPU_WORKLOADS if FAKE_GPU else WORKLOADS))
    p.add_argument("--clock", choices=("wall", "cpu"), default=None,
                   help="a step's time: wall, or the thread's CPU time (default: cpu on the fake GPU, else wall)")
    p.add_argument("--no-history", action="store_true", help="skip the recorded native runs and their replays")
    p.add_argument("--replay", nargs=2, metavar=("RESULTS_JSON", "SNAPSHOT_DIR"),
                   help="only replay the native histories of an earlier run (its bench_cuda.json, its snapshots)")
    args = p.parse_args()

    if args.replay:
        print(replay_table(replay_comparison(earlier_history(*args.replay))))
        return 0

    if args.clock:
        os.environ["TORCHMEM_BENCH_CLOCK"] = args.clock  # the children read it
        globals()["CLOCK"] = args.clock
    if args.child:
        workload, allocator = args.child
        result = run_child(workload, allocator, args.record, args.warmup, args.steps)
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
        print(json.dumps(result))
        return 0

    import torch

    if not torch.cuda.is_available():
        print("bench_cuda: no CUDA GPU here; nothing to measure")
        return 0
    os.makedirs(args.out, exist_ok=True)
    workloads = args.workloads.split(",")
    results: list[dict] = []
    history: list[dict] = []
    replays: list[dict] = []
    skipped: list[str] = []
    budget = Budget(args.budget, first_guess=min(args.timeout, 30))

    def save() -> str:
        # Written after every run, so a run cut short still leaves what it measured.
        table = summarise(results) + ("\n" + replay_table(replays) if replays else "")
        if skipped:
            table += "\n\nNot run, out of time: " + ", ".join(skipped)
        with open(os.path.join(args.out, "bench_cuda.json"), "w") as f:
            json.dump({"runs": results, "native_history": history, "replay": replays, "skipped": skipped}, f, indent=1)
        with open(os.path.join(args.out, "bench_cuda.md"), "w") as f:
            f.write(table + "\n")
        return table

    def run(workload: str, allocator: str, record: bool = False, tag: str = "") -> dict | None:
        label = f"{workload} {allocator}{' (history)' if record else ''}{tag.replace('_', ' ')}"
        if not budget.allows(workload + ("_history" if record else "")):
            skipped.append(label)
            print(f"bench_cuda: skipped {label}: {budget.left():.0f} s left", flush=True)
            return None
        r = spawn(workload, allocator, args.out, record, budget.timeout(args.timeout), tag,
                  steps=args.record_steps if record else args.steps)
        budget.done(workload + ("_history" if record else ""), r)
        shown = {k: v for k, v in r.items() if k != "error"} | ({"error": r["error"][-300:]} if "error" in r else {})
        print(json.dumps(shown), flush=True)
        return r

    # Round 1, then the native histories and their replays (a correctness check), then the other rounds.
    for rnd in range(1, args.rounds + 1):
        for w in workloads:
            for a in ALLOCATORS:  # alternating: native, torchmem, native, torchmem, ...
                r = run(w, a, tag=f"_round{rnd}")
                if r is not None:
                    results.append(dict(r, round=rnd))
                    save()
        if rnd == 1 and not args.no_history:
            for w in workloads:
                r = run(w, "native", record=True)
                if r is not None:
                    history.append(r)
                    save()
            replays = replay_comparison(history)
            save()
    print(save())
    failed = [r for r in results if "error" in r]
    inexact = [r for r in replays if "error" in r or not (r["exact"] and r["final_layout_match"])]
    return 1 if failed or inexact else 0


if __name__ == "__main__":
    sys.exit(main())
