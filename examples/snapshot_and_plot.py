"""Record allocation history while a small model trains, dump a snapshot, draw it.

    python examples/snapshot_and_plot.py [OUT_DIR]

Writes OUT_DIR/snapshot.pickle (PyTorch's snapshot format: the memory_viz
page and torch.cuda._memory_viz read it too), OUT_DIR/timeline.png,
OUT_DIR/segments.png and OUT_DIR/snapshot.html. The same pictures from the
command line:

    torchmem stats OUT_DIR/snapshot.pickle
    torchmem plot OUT_DIR/snapshot.pickle -o timeline.png
    torchmem plot OUT_DIR/snapshot.pickle --segments -o segments.png
    torchmem viz OUT_DIR/snapshot.pickle -o snapshot.html
"""
import os
import sys

import torch

import torchmem
from torchmem.runtime.snapshot import dump_snapshot, load, record_memory_history
from torchmem.viz.html import write_html
from torchmem.viz.png import plot_segments, plot_timeline
from torchmem.viz.totals import format_totals, totals


def train(steps: int = 6):
    """A few AdamW steps; returns what stays alive (model, optimizer) and the last loss."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 2048), torch.nn.GELU(),
        torch.nn.Linear(2048, 10),
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(steps):
        batch = 64 * (1 + step % 3)  # varying batch sizes: blocks of new sizes, some cached ones too small
        x, y = torch.randn(batch, 1024), torch.randint(0, 10, (batch,))
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return model, opt, loss


def main() -> int:
    out = sys.argv[1] if len(sys.argv) > 1 else "snapshot_out"
    os.makedirs(out, exist_ok=True)
    torchmem.install()                              # torchmem serves PyTorch's CPU tensors
    record_memory_history(max_entries=100_000)      # events, and the Python stack of each allocation
    alive = train()                                 # parameters, optimizer state, the last loss stay live
    path = os.path.join(out, "snapshot.pickle")
    dump_snapshot(path)
    record_memory_history(None)

    snapshot = load(path)
    print(format_totals(totals(snapshot), path))
    plot_timeline(snapshot, os.path.join(out, "timeline.png"), "MLP training on CPU, torchmem caching allocator")
    plot_segments(snapshot, os.path.join(out, "segments.png"), "MLP training on CPU")
    write_html(snapshot, os.path.join(out, "snapshot.html"), "MLP training on CPU")
    print(f"wrote {out}/timeline.png, {out}/segments.png, {out}/snapshot.html")
    return 0


if __name__ == "__main__":
    sys.exit(main())
