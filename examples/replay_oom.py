"""Reproduce an out-of-memory on a simulated GPU, and find the setting that avoids it.

    python examples/replay_oom.py [SNAPSHOT] [--plot replay_oom.png]

With SNAPSHOT (written on a GPU by torch.cuda.memory._dump_snapshot(), or by
torchmem.dump_snapshot()) it replays exactly what happened there: the
recorded settings, the memory live when recording began, every allocation at
its recorded address, the OOM with the capacity it implies. Then it asks
advise which setting needs the least memory.

Without SNAPSHOT it replays a synthetic training run (torchmem/replay/workloads.py)
that runs out of memory through fragmentation on 80 GiB, under several
settings.
"""
import argparse

from torchmem.replay import workloads
from torchmem.viz.replays import plot_replays
from torchmem.replay import advise, compare, replay

CONFS = ["", "expandable_segments:True", "max_split_size_mb:512", "roundup_power2_divisions:4"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("snapshot", nargs="?", help="snapshot file (default: a synthetic training run)")
    parser.add_argument("--plot", default="replay_oom.png")
    args = parser.parse_args()
    if args.snapshot:
        exact = replay(args.snapshot)
        print(exact.explain())
        if exact.recorded_oom:
            print("recorded OOM reproduced:", exact.recorded_oom["reproduced"])
        print(f"every allocation at its recorded address: {exact.exact}\n")
        rows = advise(args.snapshot)
        for row in rows:
            print(row.summary())
        results = [exact]
    else:
        results = compare(workloads.fragmenting_training(), CONFS, capacity="80GiB")
        print(results[0].explain(), "\n")
        for r in results:
            print(r.summary())
    plot_replays(results, args.plot)
    print(f"\nwrote {args.plot}")


if __name__ == "__main__":
    main()
