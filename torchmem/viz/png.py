"""Pictures of a snapshot as PNG files (matplotlib, imported only when drawing)."""
from __future__ import annotations

import os
from typing import Callable

from torchmem.viz.timeline import Timeline, timeline
from torchmem.sizes import fmt_size, size_unit
from torchmem.viz.totals import totals
from torchmem.formats.snapshot_devices import choose_device, device_segments

COLORS = {
    "requested": "#2b6cb0",       # live bytes
    "rounding": "#90cdf4",        # free internal: rounding inside a live block
    "active_pending_free": "#ed8936",
    "inactive": "#e2e8f0",        # free external
    "reserved": "#dd6b20",
    "largest_free": "#2f855a",
    "oom": "#c53030",
    "annotation": "#805ad5",      # torch.cuda.memory._annotate_tensor's entries, marked lightly
}


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - matplotlib is needed for pictures only
        raise RuntimeError("drawing needs matplotlib: pip install matplotlib") from exc
    return plt


def plot_timeline(snapshot: dict, path: str | os.PathLike, title: str = "", device: int | None = None,
                  x: str = "event", progress: Callable[[int], None] | None = None,
                  series: Timeline | None = None) -> Timeline:
    """Allocated and reserved over the history, the gap shaded, the largest free block, OOMs marked."""
    t = series or timeline(snapshot, device, progress=progress)
    if t.events == 0:
        raise ValueError("the snapshot has no history (device_traces is empty): record with "
                         "torchmem.record_memory_history() before dump_snapshot(), or replay with history=N")
    plt = _pyplot()
    scale, unit = size_unit(max(int(t.reserved.max()), int(t.allocated.max()), 1))
    if x == "time":
        x_all = (t.time_us - t.time_us[0]) / 1e6
        x_free = x_all[t.free_index]
        xlabel = "seconds since the first recorded event"
    else:
        x_all, x_free = t.entry, t.free_index - 1
        xlabel = "trace entry (index in the snapshot's device_traces; -1: when recording began)"
    fig, ax = plt.subplots(figsize=(11, 4.6))
    alloc, resv = t.allocated / scale, t.reserved / scale
    ax.fill_between(x_all, alloc, resv, step="post", color=COLORS["reserved"], alpha=0.22, lw=0,
                    label="reserved but not allocated (cache)")
    ax.step(x_all, resv, where="post", color=COLORS["reserved"], lw=1.4, label="reserved")
    ax.step(x_all, alloc, where="post", color=COLORS["requested"], lw=1.4, label="allocated")
    ax.plot(x_free, t.largest_free / scale, color=COLORS["largest_free"], lw=1.1, ls="--",
            label="largest free block")
    top = max(float(resv.max()), float(alloc.max()), 1e-9)
    for k, a in enumerate(t.annotations[:500]):  # light marks; `torchmem stats` lists them
        ax.axvline(x_all[a.entry + 1], color=COLORS["annotation"], lw=0.7, ls=":", alpha=0.5,
                   label="annotation" if k == 0 else None)
    for o in t.ooms:
        xo = x_all[o["index"]]
        ax.axvline(xo, color=COLORS["oom"], lw=1.3)
        ax.annotate(f"OOM at trace entry {o['entry']:,}: {fmt_size(o['size'], 1)} refused\n{fmt_size(o['reserved'], 1)} reserved, "
                    f"{fmt_size(o['allocated'], 1)} allocated\n{fmt_size(o['device_free'], 1)} free on the device",
                    xy=(xo, top * 0.98), xytext=(-6, 0), textcoords="offset points", ha="right", va="top",
                    color=COLORS["oom"], fontsize=8.5,
                    bbox=dict(boxstyle="round,pad=0.3", fc="white", ec=COLORS["oom"], lw=0.6, alpha=0.9))
    if len(t.reserved) and t.reserved[0] > 0:  # recorded mid-run: the state when recording began, rebuilt
        ax.axhline(t.reserved[0] / scale, color="gray", lw=0.8, ls=":")
        ax.annotate(f"when recording began: {fmt_size(int(t.reserved[0]), 1)} reserved, "
                    f"{fmt_size(int(t.allocated[0]), 1)} allocated (rebuilt from the final segments)",
                    xy=(x_all[0], t.reserved[0] / scale), xytext=(4, -4), textcoords="offset points",
                    va="top", fontsize=8, color="gray", bbox=dict(fc="white", ec="none", alpha=0.8, pad=1))
    peak_gap = int((t.reserved - t.allocated).max())
    ax.set_ylim(0, top * 1.12)
    span = float(x_all[-1] - x_all[0]) if len(x_all) > 1 else 1.0
    ax.set_xlim(x_all[0], x_all[0] + span * 1.01)  # room for an OOM at the last event
    ax.set_ylabel(unit)
    ax.set_xlabel(xlabel)
    ax.grid(alpha=0.25)
    ax.legend(loc="upper left", fontsize=8.5, ncol=2, framealpha=0.9)
    heading = (title or "memory over the recorded history") + (f", {t.device_choice}" if t.device_choice else "")
    ax.set_title(f"{heading}\npeak allocated {fmt_size(int(t.allocated.max()), 1)}, peak reserved "
                 f"{fmt_size(int(t.reserved.max()), 1)}, most reserved but unallocated {fmt_size(peak_gap, 1)}; {t.events:,} events"
                 + (f"; {len(t.ooms)} OOM" if t.ooms else ""), fontsize=10, loc="left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return t


def plot_segments(snapshot: dict, path: str | os.PathLike, title: str = "", max_segments: int = 40,
                  device: int | None = None) -> dict:
    """A map of one device's segments (torchmem.formats.snapshot_devices' rule): one row each (largest first),
    blocks coloured by state. Returns the totals, with "device" and "device_choice"."""

    plt = _pyplot()
    from matplotlib.patches import Patch

    choice = choose_device(snapshot, device)
    segs = sorted(device_segments(snapshot, choice.device), key=lambda s: (-s["total_size"], s["address"]))
    shown, hidden = segs[:max_segments], segs[max_segments:]
    tot = totals({"segments": segs})
    rows = max(len(shown), 1)
    fig, ax = plt.subplots(figsize=(11, 1.6 + 0.32 * rows))
    for row, seg in enumerate(shown):
        base, size = seg["address"], seg["total_size"]
        y = rows - 1 - row
        for b in seg["blocks"]:
            x0 = (b["address"] - base) / size
            w = b["size"] / size
            if b["state"] == "active_allocated":
                req = b.get("requested_size", b["size"]) / size
                ax.broken_barh([(x0, req)], (y + 0.1, 0.8), color=COLORS["requested"])
                if w > req:
                    ax.broken_barh([(x0 + req, w - req)], (y + 0.1, 0.8), color=COLORS["rounding"])
            else:
                ax.broken_barh([(x0, w)], (y + 0.1, 0.8), color=COLORS[b["state"]] if b["state"] in COLORS
                               else COLORS["active_pending_free"])
            ax.plot([x0, x0], [y + 0.1, y + 0.9], color="white", lw=0.4)  # block boundary
        free = sum(b["size"] for b in seg["blocks"] if b["state"] == "inactive")
        kind = f"{seg['segment_type']}{', expandable' if seg.get('is_expandable') else ''}"
        ax.text(-0.01, y + 0.5, f"{fmt_size(size, 1)} {kind}", ha="right", va="center", fontsize=8)
        ax.text(1.01, y + 0.5, f"{100 * free / size:.0f}% free, {len(seg['blocks'])} block{'s' if len(seg['blocks']) != 1 else ''}", ha="left",
                va="center", fontsize=8)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, rows)
    ax.set_yticks([])
    ax.set_xticks([0, 0.25, 0.5, 0.75, 1.0])
    ax.set_xticklabels(["0", "¼", "½", "¾", "end"])
    ax.set_xlabel("offset in the segment (each row is scaled to its own segment)")
    for spine in ("top", "right", "left"):
        ax.spines[spine].set_visible(False)
    legend = [Patch(color=COLORS["requested"], label="allocated"),
              Patch(color=COLORS["rounding"], label="rounding (free internal)"),
              Patch(color=COLORS["active_pending_free"], label="free pending"),
              Patch(color=COLORS["inactive"], label="free (external)")]
    ax.legend(handles=legend, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=4, fontsize=8, frameon=False)
    more = (f"; {len(hidden)} smaller segments ({fmt_size(sum(s['total_size'] for s in hidden), 1)}) not shown"
            if hidden else "")
    fig.suptitle(f"{title or 'segments'}, {choice.describe()}\n{tot['segments']} segment{'s' if tot['segments'] != 1 else ''}, {fmt_size(tot['reserved'], 1)} reserved, "
                 f"{fmt_size(tot['allocated'], 1)} allocated, {fmt_size(tot['free_external'], 1)} free in blocks "
                 f"(largest {fmt_size(tot['largest_free_block'], 1)}){more}", fontsize=9.5, x=0.01, ha="left")
    fig.subplots_adjust(left=0.16, right=0.84, top=1 - 0.95 / (1.6 + 0.32 * rows) - 0.02,
                        bottom=0.55 / (1.6 + 0.32 * rows) + 0.02)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return dict(tot, device=choice.device, device_choice=choice.describe())
