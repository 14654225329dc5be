"""Pictures of replays: allocated and reserved over the trace, one panel per setting (matplotlib, imported only when drawing)."""
from __future__ import annotations

from typing import Sequence

from torchmem.sizes import fmt_size, size_unit


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - matplotlib is a dependency of the plots only
        raise RuntimeError("drawing needs matplotlib: pip install matplotlib") from exc
    return plt


def entry_axis(result, events):
    """The x of replay events: the snapshot's trace entry of each (as every command numbers them), else the event index."""
    import numpy as np

    events = np.asarray(events, dtype=np.int64)
    recorded = getattr(result, "recorded", None)
    entries = getattr(recorded, "event_entries", None)
    if entries is None or not len(entries):
        return events, "event (position in the trace)"
    return np.asarray(entries)[np.clip(events, 0, len(entries) - 1)], "trace entry (index in the snapshot's device_traces)"


def plot_replays(results: Sequence, path: str, title: str = "") -> None:
    """Allocated and reserved over the trace, one panel per config, OOM marked; x: the snapshot's trace entries."""

    plt = _pyplot()
    fig, axes = plt.subplots(len(results), 1, figsize=(10, 2.8 * len(results)), sharex=True, squeeze=False)
    peak_all = max(max(r.peak_reserved, r.oom["reserved"] + r.oom["size"] if r.oom else 0) for r in results)
    gib, unit = size_unit(max(peak_all, 1))  # one unit for every panel (they share the axis), chosen by the largest figure
    xlabel = "event"
    for ax, r in zip(axes[:, 0], results):
        t = r.timeline
        if len(t):
            x, xlabel = entry_axis(r, t[:, 0])
            alloc, resv = t[:, 1] / gib, t[:, 2] / gib
            ax.fill_between(x, alloc, resv, color="tab:orange", alpha=0.35, step="post", label="reserved but free")
            ax.step(x, resv, where="post", color="tab:orange", label="reserved")
            ax.step(x, alloc, where="post", color="tab:blue", label="allocated")
        ax.axhline(r.capacity / gib, color="black", lw=0.8, ls="--", label="capacity")
        start = getattr(r, "start", None)
        if start is not None and start.segments:
            ax.axhline(start.reserved / gib, color="tab:gray", lw=0.8, ls=":", label="reserved when recording began")
            ax.annotate(f"rebuilt start: {fmt_size(start.reserved, 1)} in {len(start.segments)} segments, "
                        f"{start.live_blocks} live blocks", xy=(0, start.reserved / gib), xytext=(4, -4),
                        textcoords="offset points", va="top", fontsize=8, color="dimgray",
                        bbox=dict(fc="white", ec="none", alpha=0.8, pad=1))
        if r.oom:
            xo = int(entry_axis(r, [r.oom["index"]])[0][0])
            ax.axvline(xo, color="red", lw=1.2)
            ax.annotate(
                f"OOM at trace entry {xo:,}: {fmt_size(r.oom['size'], 1)} refused\n"
                f"reserved {fmt_size(r.oom['reserved'], 1)}, allocated {fmt_size(r.oom['allocated'], 1)}",
                xy=(xo, r.oom["reserved"] / gib), xytext=(-10, -10), textcoords="offset points",
                ha="right", va="top", color="red", fontsize=9,
            )
        status = "completed" if r.completed else "out of memory"
        ax.set_title(f"{r.conf or 'default config'}: {status}", fontsize=10, loc="left")
        ax.set_ylabel(unit)
        peak = max(r.peak_reserved, r.oom["reserved"] + r.oom["size"] if r.oom else 0) / gib
        top = r.capacity / gib if r.capacity / gib < 2 * peak else 1.3 * peak  # a far capacity stays off the chart
        if top < r.capacity / gib:
            ax.set_title(f"capacity {fmt_size(r.capacity, 1)}, above the chart", fontsize=9, loc="right")
        ax.set_ylim(0, top * 1.08)
    axes[0, 0].legend(loc="lower right", fontsize=8, ncol=4)
    axes[-1, 0].set_xlabel(xlabel)
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
