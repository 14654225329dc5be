"""Cached malloc+free in torchmem's core vs glibc and tcmalloc, on several size mixes, same sizes, same run.

    python benchmarks/bench_malloc.py [--runs 10] [--repeats 7] [--instructions] [--json F] [--binary B]

Builds benchmarks/bench_malloc.cpp against csrc/core and runs it --runs
times (each a fresh process: glibc's own time differs between processes);
each run times --repeats rounds of every workload, the allocators side by
side in one process (bench_malloc.cpp: the mixes bert, gpt2, eleven,
uniform, hot; workloads pair on every mix, pair2t and window on bert).
Prints, per workload and mix, the median ns per operation of each allocator
and the ratios torchmem / glibc and tcmalloc / glibc: in a run, the median
of the per-repeat ratios; over runs, the median of the runs' (every run's
ratio is in --json). --instructions also counts the instructions of a pair
on every mix with valgrind's callgrind (the pairs of count_pairs() after a
warm-up, per pair). tcmalloc is measured when libtcmalloc_minimal.so.4 can
be opened (Debian: libtcmalloc-minimal4).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _build import build  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
GPT2_SIZES = os.path.join(HERE, "gpt2_step_sizes.json")
MIXES = ("bert", "gpt2", "eleven", "uniform", "hot")
ALLOCATORS = ("glibc", "torchmem", "tcmalloc")


def one_run(binary: str, repeats: int) -> dict:
    """{(workload, mix): {allocator: [ns per repeat]}} of one process."""
    out = subprocess.run([binary, GPT2_SIZES, str(repeats)], check=True, capture_output=True, text=True).stdout
    table: dict = {}
    for line in out.splitlines():
        r = json.loads(line)
        table.setdefault((r["workload"], r["mix"]), {}).setdefault(r["allocator"], []).append(r["ns"])
    return table


def instructions(binary: str, mix: str, allocator: str, pairs: int = 200_000) -> float | None:
    """Instructions per pair on `mix`, by callgrind (None when valgrind is missing)."""
    if not shutil.which("valgrind"):
        return None
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "callgrind.out")
        run = subprocess.run(["valgrind", "--tool=callgrind", "--collect-atstart=no", "--toggle-collect=*count_pairs*",
                              f"--callgrind-out-file={out}", binary, GPT2_SIZES, "count", mix, allocator, str(pairs)],
                             capture_output=True, text=True)
        if run.returncode != 0:
            return None
        with open(out) as f:
            m = re.search(r"^summary:\s+(\d+)", f.read(), re.M)
        return int(m.group(1)) / pairs if m else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=1, help="processes to run (default 1)")
    parser.add_argument("--repeats", type=int, default=7, help="rounds per process (default 7)")
    parser.add_argument("--instructions", action="store_true", help="count instructions per pair with callgrind")
    parser.add_argument("--json", help="write every run's medians and ratios here")
    parser.add_argument("--binary", help="a bench_malloc driver built elsewhere (another commit's core: "
                                         "g++ -O2 -std=c++17 -pthread -I<tree>/csrc bench_malloc.cpp <core sources> -ldl)")
    args = parser.parse_args()
    if args.runs < 1 or args.repeats < 1:
        parser.error("--runs and --repeats must be positive")
    if not os.path.exists(GPT2_SIZES):
        parser.error(f"{GPT2_SIZES} is missing (benchmarks/record_gpt2_sizes.py writes it)")
    if args.binary and not os.access(args.binary, os.X_OK):
        parser.error(f"--binary {args.binary} is not an executable file")
    binary = args.binary or build(os.path.join(HERE, "bench_malloc.cpp"), "bench_malloc", ["-ldl"])
    runs = []  # per run: {(workload, mix): {allocator: (median ns, median ratio to glibc)}}
    for _ in range(args.runs):
        summary = {}
        for key, ns in one_run(binary, args.repeats).items():
            g = ns["glibc"]
            summary[key] = {a: (statistics.median(v), statistics.median(x / y for x, y in zip(v, g)))
                            for a, v in ns.items()}
        runs.append(summary)
    has_tc = any("tcmalloc" in v for v in runs[0].values())
    shown = [a for a in ALLOCATORS if a != "tcmalloc" or has_tc]
    print(f"{args.runs} run(s) of {args.repeats} repeats; ns: median over runs of each run's median; "
          "ratios to glibc: median over runs of each run's median per-repeat ratio"
          + ("" if has_tc else " (tcmalloc not found)"))
    counts = {}
    if args.instructions:
        counts = {(m, a): instructions(binary, m, a) for m in MIXES for a in shown}
    head = f"{'workload':<8} {'mix':<8}" + "".join(f" {a + ' ns':>12}" for a in shown)
    head += "".join(f" {a + '/glibc':>15}" for a in shown if a != "glibc")
    if counts:
        head += "".join(f" {a + ' instr':>15}" for a in shown)
    print(head)
    for key in runs[0]:
        line = f"{key[0]:<8} {key[1]:<8}"
        line += "".join(f" {statistics.median(r[key][a][0] for r in runs):>12.1f}" for a in shown)
        line += "".join(f" {statistics.median(r[key][a][1] for r in runs):>15.2f}" for a in shown if a != "glibc")
        if counts and key[0] == "pair":
            line += "".join(f" {counts[(key[1], a)]:>15.0f}" if counts[(key[1], a)] else f" {'-':>15}" for a in shown)
        print(line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": [{f"{w}/{m}": v for (w, m), v in r.items()} for r in runs],
                       "instructions": {f"{m}/{a}": c for (m, a), c in counts.items()}}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
