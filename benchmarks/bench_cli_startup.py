"""Wall time of the command line's start: `torchmem --help` and `torchmem replay` of a snapshot.

Each TREE is a checkout whose extensions are built in place for the Python given (`make demo` or
`python setup.py build_ext --inplace`). The commands run alternately, tree by tree, ROUNDS times, so a
noisy machine shifts all trees alike; the table gives each tree's median and fastest run, and whether
the command imported torch.

    python benchmarks/bench_cli_startup.py --snapshot FILE [--rounds 9] [--json] TREE [TREE ...]

Run it with the Python whose torch the trees were built against (the CPU tier's .venv).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

# The command's own start: -X importtime is not used, so nothing but the command is timed. Whether torch
# was imported is asked in a separate run.
TORCH_IMPORTED = ("import runpy, sys\nsys.argv = ['torchmem'] + sys.argv[1:]\n"
                  "try:\n    runpy.run_module('torchmem', run_name='__main__')\nexcept SystemExit:\n    pass\n"
                  "print('torch' in sys.modules, file=sys.stderr)\n")


def env_for(tree: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHMEM_")}
    env["PYTHONPATH"] = tree
    return env


def time_once(tree: str, argv: list[str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "torchmem", *argv], env=env_for(tree), cwd=tree, capture_output=True,
                          text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"bench_cli_startup: {tree}: torchmem {' '.join(argv)} exited {proc.returncode}: "
                 f"{proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ''}")
    return elapsed


def imports_torch(tree: str, argv: list[str]) -> bool:
    proc = subprocess.run([sys.executable, "-c", TORCH_IMPORTED, *argv], env=env_for(tree), cwd=tree, capture_output=True,
                          text=True)
    return proc.stderr.strip().splitlines()[-1] == "True"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="+", metavar="TREE")
    parser.add_argument("--snapshot", required=True, help="the snapshot `torchmem replay` reads")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    commands = {"--help": ["--help"], "replay": ["replay", "--no-progress", os.path.abspath(args.snapshot)]}
    times: dict[tuple[str, str], list[float]] = {(t, c): [] for t in args.trees for c in commands}
    for name, argv in commands.items():  # one warm-up each: the page cache holds the files for every round
        for tree in args.trees:
            time_once(tree, argv)
    for _ in range(args.rounds):
        for name, argv in commands.items():
            for tree in args.trees:
                times[(tree, name)].append(time_once(tree, argv))
    rows = [{"tree": tree, "command": name, "median_s": round(statistics.median(times[(tree, name)]), 3),
             "fastest_s": round(min(times[(tree, name)]), 3), "rounds": args.rounds,
             "imports_torch": imports_torch(tree, commands[name])}
            for name in commands for tree in args.trees]
    if args.json:
        print(json.dumps({"machine": platform.node(), "cores": os.cpu_count(), "rows": rows}, indent=1))
        return
    print(f"{'command':<8} {'median s':>9} {'fastest s':>10} {'torch':>6}  tree")
    for row in rows:
        print(f"{row['command']:<8} {row['median_s']:>9.3f} {row['fastest_s']:>10.3f} "
              f"{'yes' if row['imports_torch'] else 'no':>6}  {row['tree']}")


if __name__ == "__main__":
    main()
