"""A snapshot of a million trace entries: how long each command takes and how much memory it peaks at.

    .venv/bin/python benchmarks/bench_big_snapshot.py                    # 1,000,000 entries, 60 frames each
    .venv/bin/python benchmarks/bench_big_snapshot.py --entries 100000   # a quicker look

The snapshot is generated on torchmem's simulated device (a training loop:
weights, then steps of activations of log-normal sizes freed in reverse,
recorded by the allocator's history, written by build_snapshot in PyTorch's
format) and given PyTorch-like stacks: every trace entry and block has its
own frames list of --frames shared frame dicts, as the snapshots
torch.cuda.memory._dump_snapshot() writes (py_symbolize shares the frame
dicts, not the lists). The file is written once to --dir and reused.

Each command runs as its own process, as a user runs it; its wall time and
peak resident memory (wait4's ru_maxrss) are measured: `torchmem replay`,
`torchmem advise`, `torchmem ranks` of 8 copies, `torchmem viz`. The
reference for memory is the unpickled snapshot: the resident memory a
process gains by pickle.load of the file. Prints one JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import pickle
import random
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def generate(path: str, entries: int, frames: int, seed: int = 0) -> dict:
    from torchmem import _core
    from torchmem.formats.snapshot_format import build_snapshot

    rng = random.Random(seed)
    a = _core.CachingAllocator(_core.SimDevice(80 << 30), "")
    _core.enable_history(a, entries + 10)
    keep = [a.allocate(rng.choice([4 << 20, 16 << 20, 64 << 20])) for _ in range(200)]
    made = len(keep)
    while made * 3 < entries + 1000:  # three entries a tensor, and some segment entries: then trimmed
        acts = [a.allocate(min(int(rng.lognormvariate(14, 2.5)) + 512, 2 << 30)) for _ in range(rng.randrange(20, 80))]
        made += len(acts)
        for p in reversed(acts):
            a.deallocate(p)
    history = _core.history_entries(a)  # the ring keeps the last `entries + 10`; trim to exactly `entries`
    history = history[len(history) - entries:] if len(history) > entries else history
    snap = build_snapshot(a.segments(), history)
    shared = [{"name": f"function_{i}", "filename": f"/src/model/layer_{i % 37}.py", "line": 10 + i % 400}
              for i in range(2000)]
    sites = [[shared[rng.randrange(len(shared))] for _ in range(frames)] for _ in range(300)]
    for e in snap["device_traces"][0]:
        e["frames"] = list(sites[rng.randrange(len(sites))])
    for seg in snap["segments"]:
        for b in seg["blocks"]:
            b["frames"] = list(sites[rng.randrange(len(sites))])
    with open(path, "wb") as f:
        pickle.dump(snap, f)
    return {"entries": len(snap["device_traces"][0]), "segments": len(snap["segments"])}


# Runs a module or a snippet as __main__ and writes the process's own peak RSS (VmHWM, which exec resets,
# unlike wait4's ru_maxrss, which keeps the parent's) to the file named by TORCHMEM_BENCH_PEAK at exit.
PEAK_WRAPPER = """
import atexit, os, runpy, sys
def _peak():
    with open("/proc/self/status") as f:
        kib = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    with open(os.environ["TORCHMEM_BENCH_PEAK"], "w") as f:
        f.write(str(kib))
atexit.register(_peak)
target, sys.argv = sys.argv[1], sys.argv[1:]
if target == "-c":
    code, sys.argv = sys.argv[1], sys.argv[1:]
    exec(compile(code, "<bench>", "exec"), {"__name__": "__main__"})
else:
    runpy.run_module(target, run_name="__main__")
"""


def measure(argv: list[str], peak_file: str) -> dict:
    """Run `python -m MODULE ...` or `python -c CODE ...` in its own process: wall and CPU seconds, peak RSS."""
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", PEAK_WRAPPER] + argv, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=ROOT, TORCHMEM_BENCH_PEAK=peak_file))
    err = proc.stderr.read().decode()[-400:] if proc.stderr else ""
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    with open(peak_file) as f:
        peak_kib = int(f.read())
    out = {"seconds": round(seconds, 2), "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 2),
           "peak_rss_mib": round(peak_kib / 1024, 1), "status": os.waitstatus_to_exitcode(status)}
    if out["status"]:
        out["stderr"] = err
    return out


UNPICKLED = """
import pickle, resource, sys
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()
before = rss()
with open(sys.argv[1], "rb") as f:
    snap = pickle.load(f)
print((rss() - before) / 2**20)
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=1_000_000)
    ap.add_argument("--frames", type=int, default=60, help="frames per entry (default 60)")
    ap.add_argument("--dir", default="/tmp/torchmem-big-snapshot")
    ap.add_argument("--only", nargs="+", default=["replay", "advise", "ranks", "viz"])
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    path = os.path.join(args.dir, f"big_{args.entries}_{args.frames}.pickle")
    result: dict = {"entries": args.entries, "frames_per_entry": args.frames}
    if not os.path.exists(path):
        start = time.perf_counter()
        result["generated"] = generate(path, args.entries, args.frames)
        result["generate_seconds"] = round(time.perf_counter() - start, 1)
    result["file_mib"] = round(os.path.getsize(path) / 2**20, 1)
    unpickled = subprocess.run([sys.executable, "-c", UNPICKLED, path], capture_output=True, text=True, check=True)
    result["unpickled_mib"] = round(float(unpickled.stdout), 1)
    peak = os.path.join(args.dir, "peak.txt")
    result["pickle_load"] = measure(["-c", "import pickle,sys; pickle.load(open(sys.argv[1],'rb'))", path], peak)
    tm = ["torchmem"]
    runs = {
        "replay": tm + ["replay", path, "--no-progress"],
        "advise": tm + ["advise", path, "--no-progress"],
        "viz": tm + ["viz", path, "-o", os.path.join(args.dir, "big.html"), "--no-progress"],
    }
    if "ranks" in args.only:
        copies = []
        for i in range(8):
            copy = os.path.join(args.dir, f"big_{args.entries}_{args.frames}_rank{i}.pickle")
            if not os.path.exists(copy):
                shutil.copyfile(path, copy)
            copies.append(copy)
        runs["ranks"] = tm + ["ranks", *copies, "--no-progress"]
    for name in args.only:
        result[name] = measure(runs[name], peak)
        result[name]["peak_over_unpickled"] = round(result[name]["peak_rss_mib"] / result["unpickled_mib"], 2)
        print(name, result[name], file=sys.stderr, flush=True)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
