"""Reproduce a fragmentation out-of-memory on a simulated 80 GiB GPU and try fixes.

    python examples/replay_oom.py [TRACE] [--capacity 80GiB]

Without TRACE it replays a synthetic training run (see torchmem/workloads.py);
with one it reads a snapshot pickle from torch.cuda.memory._dump_snapshot()
or JSON lines of {"op": "alloc"|"free", "id": N, "size": BYTES}.
"""
import argparse

from torchmem import sim, workloads
from torchmem.plots import plot_replays

CONFS = ["", "expandable_segments:True", "max_split_size_mb:512", "roundup_power2_divisions:4"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace", nargs="?", help="trace file (default: a synthetic training run)")
    parser.add_argument("--capacity", default="80GiB")
    parser.add_argument("--plot", default="replay_oom.png")
    args = parser.parse_args()
    trace = args.trace or workloads.fragmenting_training()
    results = sim.compare(trace, CONFS, capacity=args.capacity)
    print(results[0].explain(), "\n")
    for r in results:
        print(r.summary())
    plot_replays(results, args.plot)
    print(f"\nwrote {args.plot}")


if __name__ == "__main__":
    main()
