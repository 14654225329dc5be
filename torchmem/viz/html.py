"""A self-contained HTML page for a snapshot: inline SVG and CSS, no script, no network.

PyTorch's trace_plot page loads its script from a CDN; this one opens from a
file on a machine with no network. Hovering a block or a point shows its
details (SVG <title> elements, which every browser shows as a tooltip).
"""
from __future__ import annotations

import html
import os
from collections import defaultdict
from typing import Callable

import numpy as np

from torchmem.formats.snapshot_devices import DeviceChoice, choose_device, device_segments
from torchmem.viz.png import COLORS
from torchmem.viz.ranks import user_frames
from torchmem.viz.timeline import Timeline, timeline
from torchmem.sizes import fmt_size
from torchmem.viz.totals import totals

MAX_POINTS = 1500
MAX_ANNOTATIONS = 500  # marked and listed; the rest are counted
MAX_SEGMENTS = 60
MAX_BLOCKS_PER_SEGMENT = 400

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px auto;max-width:1100px;color:#1a202c;padding:0 16px}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:28px 0 8px;border-bottom:1px solid #e2e8f0;padding-bottom:4px}
.sub{color:#4a5568;margin:0 0 16px}
.cards{display:flex;flex-wrap:wrap;gap:10px}
.card{border:1px solid #e2e8f0;border-radius:6px;padding:8px 12px;min-width:130px}
.card b{display:block;font-size:18px} .card span{color:#4a5568;font-size:12px}
.bad{border-color:#c53030;color:#c53030}
table{border-collapse:collapse;width:100%;font-size:13px} td,th{border-bottom:1px solid #edf2f7;padding:4px 6px;text-align:left;vertical-align:top}
th{background:#f7fafc} td.n{text-align:right;white-space:nowrap;font-variant-numeric:tabular-nums}
code{font:12px ui-monospace,Menlo,Consolas,monospace}
.legend span{display:inline-block;margin-right:14px;font-size:12px}
.legend i{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:-2px;border-radius:2px}
svg text{font:11px system-ui,sans-serif;fill:#4a5568}
.note{color:#4a5568;font-size:12px}
"""


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _short(filename: str) -> str:
    """Installed packages by their import path (.../site-packages/torch/nn/x.py -> torch/nn/x.py),
    files under the current directory relative to it."""
    for marker in ("/site-packages/", "/dist-packages/"):
        if marker in filename:
            return filename.split(marker, 1)[1]
    here = os.getcwd() + os.sep
    return filename[len(here):] if filename.startswith(here) else filename


def _frames_text(frames: list, limit: int = 8) -> str:
    lines = [f"{_short(str(f.get('filename', '?')))}:{f.get('line', '?')} {f.get('name', '?')}" for f in frames[:limit]]
    if len(frames) > limit:
        lines.append(f"... {len(frames) - limit} more frames")
    return "\n".join(lines)


def _legend(items: list[tuple[str, str]]) -> str:
    return '<div class="legend">' + "".join(f'<span><i style="background:{c}"></i>{_e(n)}</span>' for n, c in items) + "</div>"


def _downsample(x: np.ndarray, ys: list[np.ndarray], points: int) -> tuple[np.ndarray, list[np.ndarray]]:
    if len(x) <= points:
        return x, ys
    edges = np.linspace(0, len(x), points + 1, dtype=np.int64)
    starts = edges[:-1]
    return x[starts], [np.maximum.reduceat(y, starts) for y in ys]


def _nice_ticks(top: float, units: tuple = (1, 1024, 2**20, 2**30, 2**40)) -> list[float]:
    """0 and multiples of 1, 2 or 5 times a power of ten (of the byte unit that fits) up to `top`."""
    if top <= 0:
        return [0.0]
    unit = max(u for u in units if u <= max(top, 1))
    raw = top / unit / 5
    power = 10 ** np.floor(np.log10(raw)) if raw > 0 else 1
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw) * unit
    return [k * step for k in range(int(top // step) + 1)]


def _settings_text(settings: dict) -> str:
    parts = []
    for key, value in settings.items():
        if key in ("capacity", "in_use_by_others") and isinstance(value, int):
            value = fmt_size(value, 1)
        elif key == "conf" and not value:
            value = "(default)"
        parts.append(f"{key}: {value}")
    return ", ".join(parts)


def _timeline_svg(t: Timeline) -> str:
    w, h, left, right, top, bottom = 1060, 320, 70, 12, 12, 36
    x, (alloc, resv) = _downsample(t.index.astype(np.float64), [t.allocated, t.reserved], MAX_POINTS)
    ymax = max(float(resv.max()), float(alloc.max()), 1.0) * 1.08
    xmax = max(float(t.index[-1]), 1.0)

    def px(v):
        return left + (np.asarray(v, dtype=np.float64) / xmax) * (w - left - right)

    def py(v):
        return top + (1 - np.asarray(v, dtype=np.float64) / ymax) * (h - top - bottom)

    def step_points(xs, ys):
        pts = []
        for i in range(len(xs)):
            if i:
                pts.append(f"{xs[i]:.1f},{ys[i - 1]:.1f}")
            pts.append(f"{xs[i]:.1f},{ys[i]:.1f}")
        return pts

    X, A, R = px(x), py(alloc), py(resv)
    upper, lower = step_points(X, R), step_points(X, A)
    parts = [f'<svg viewBox="0 0 {w} {h}" width="100%" role="img" aria-label="allocated and reserved over time">']
    for v in _nice_ticks(ymax / 1.08):  # grid and y labels
        y = py(v)
        parts.append(f'<line x1="{left}" x2="{w - right}" y1="{y:.1f}" y2="{y:.1f}" stroke="#edf2f7"/>'
                     f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{_e(fmt_size(v, 1))}</text>')
    for v in _nice_ticks(max(xmax - 1, 1.0), units=(1,)):  # labelled by trace entry: point v + 1 is after entry v
        anchor = "end" if px(v + 1) > w - right - 20 else "middle"
        parts.append(f'<text x="{px(v + 1):.1f}" y="{h - 16}" text-anchor="{anchor}">{int(v):,}</text>')
    parts.append(f'<text x="{(left + w) / 2:.0f}" y="{h - 2}" text-anchor="middle">'
                 "trace entry (index in the snapshot's device_traces)</text>")
    parts.append(f'<polygon points="{" ".join(upper + lower[::-1])}" fill="{COLORS["reserved"]}" fill-opacity="0.22">'
                 f'<title>reserved but not allocated: at most {_e(fmt_size(int((t.reserved - t.allocated).max()), 1))}</title></polygon>')
    parts.append(f'<polyline points="{" ".join(upper)}" fill="none" stroke="{COLORS["reserved"]}" stroke-width="1.5"/>')
    parts.append(f'<polyline points="{" ".join(lower)}" fill="none" stroke="{COLORS["requested"]}" stroke-width="1.5"/>')
    if len(t.free_index):
        fp = " ".join(f"{a:.1f},{b:.1f}" for a, b in zip(px(t.free_index), py(t.largest_free)))
        parts.append(f'<polyline points="{fp}" fill="none" stroke="{COLORS["largest_free"]}" stroke-width="1.2" stroke-dasharray="5,3"/>')
        every = max(1, len(t.free_index) // 80)
        for i, v in zip(t.free_index[::every], t.largest_free[::every]):
            parts.append(f'<circle cx="{px(i):.1f}" cy="{py(v):.1f}" r="3" fill="{COLORS["largest_free"]}" fill-opacity="0.35">'
                         f'<title>{"when recording began" if i == 0 else f"after trace entry {int(i) - 1:,}"}: allocated {_e(fmt_size(int(t.allocated[i]), 1))}, reserved '
                         f'{_e(fmt_size(int(t.reserved[i]), 1))}, largest free block {_e(fmt_size(int(v), 1))}</title></circle>')
    for a in t.annotations[:MAX_ANNOTATIONS]:  # light marks, as memory_viz shows them beside the blocks
        xa = px(a.entry + 1)
        parts.append(f'<line class="annotation" x1="{xa:.1f}" x2="{xa:.1f}" y1="{top}" y2="{h - bottom}" '
                     f'stroke="{COLORS["annotation"]}" stroke-width="1" stroke-opacity="0.45" stroke-dasharray="2,3">'
                     f'<title>annotation at trace entry {a.entry:,}: {_e(a.text)}'
                     f'{f" ({_e(fmt_size(a.size, 1))} block)" if a.size is not None else ""}</title></line>')
    for o in t.ooms:
        xo = px(o["index"])
        parts.append(f'<line x1="{xo:.1f}" x2="{xo:.1f}" y1="{top}" y2="{h - bottom}" stroke="{COLORS["oom"]}" stroke-width="2">'
                     f'<title>OOM at trace entry {o["entry"]:,}: {_e(fmt_size(o["size"], 1))} refused; {_e(fmt_size(o["reserved"], 1))} reserved, '
                     f'{_e(fmt_size(o["allocated"], 1))} allocated, {_e(fmt_size(o["device_free"], 1))} free on the device</title></line>'
                     f'<text x="{xo - 4:.1f}" y="{top + 12}" text-anchor="end" style="fill:{COLORS["oom"]};font-weight:600">'
                     f'OOM: {_e(fmt_size(o["size"], 1))} refused</text>')
    parts.append("</svg>")
    return "".join(parts)


def _segments_svg(segments: list[dict], ctx: dict) -> str:
    segs = sorted(segments, key=lambda s: (-s["total_size"], s["address"]))[:MAX_SEGMENTS]
    row, w, left, right = 22, 1060, 150, 150
    h = row * len(segs) + 8
    parts = [f'<svg viewBox="0 0 {w} {h}" width="100%" role="img" aria-label="segments and their blocks">']
    for r, seg in enumerate(segs):
        y = 4 + r * row
        size = seg["total_size"]
        span = w - left - right
        blocks = seg["blocks"]
        free = sum(b["size"] for b in blocks if b["state"] == "inactive")
        kind = seg["segment_type"] + (", expandable" if seg.get("is_expandable") else "")
        parts.append(f'<text x="{left - 6}" y="{y + 14}" text-anchor="end">{_e(fmt_size(size, 1))} {_e(kind)}</text>'
                     f'<rect x="{left}" y="{y}" width="{span}" height="{row - 4}" fill="{COLORS["inactive"]}">'
                     f'<title>segment at 0x{seg["address"]:x}: {_e(fmt_size(size, 1))}, {len(blocks)} blocks, '
                     f'{_e(fmt_size(free, 1))} free</title></rect>')
        if len(blocks) > MAX_BLOCKS_PER_SEGMENT:  # draw the largest blocks only
            blocks = sorted(blocks, key=lambda b: -b["size"])[:MAX_BLOCKS_PER_SEGMENT]
            ctx["truncated"] += 1
        for b in blocks:
            if b["state"] == "inactive":
                continue
            x0 = left + (b["address"] - seg["address"]) / size * span
            bw = max(b["size"] / size * span, 0.6)
            req = b.get("requested_size", b["size"])
            color = COLORS["requested"] if b["state"] == "active_allocated" else COLORS["active_pending_free"]
            tip = (f"{b['state']}: {fmt_size(b['size'], 1)} block at 0x{b['address']:x}, requested {fmt_size(req, 1)}"
                   + (f"\n{_frames_text(b.get('frames') or [])}" if b.get("frames") else ""))
            parts.append(f'<rect x="{x0:.2f}" y="{y}" width="{bw:.2f}" height="{row - 4}" fill="{color}" '
                         f'stroke="white" stroke-width="0.5"><title>{_e(tip)}</title></rect>')
            if b["state"] == "active_allocated" and req < b["size"] and b["size"] / size * span > 2:
                rx = x0 + req / size * span
                parts.append(f'<rect x="{rx:.2f}" y="{y}" width="{x0 + bw - rx:.2f}" height="{row - 4}" '
                             f'fill="{COLORS["rounding"]}"><title>{_e(fmt_size(b["size"] - req, 1))} of rounding</title></rect>')
        parts.append(f'<text x="{w - right + 6}" y="{y + 14}">{100 * free / size:.0f}% free, {len(seg["blocks"])} block{"s" if len(seg["blocks"]) != 1 else ""}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _sites_table(segments: list[dict], limit: int = 25) -> str:
    """Live bytes by allocation site: each block's stack from its site outwards, as `ranks` finds the site
    (torchmem.viz.ranks.user_frames: torch's C++ unwinder, the caching allocator and library frames left out)."""
    sites: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for seg in segments:
        for b in seg["blocks"]:
            if b["state"] == "inactive":
                continue
            frames = user_frames(b.get("frames") or [])
            key = _frames_text(frames, 4) if frames else "(no stack recorded)"
            sites[key][0] += b.get("requested_size", b["size"])
            sites[key][1] += 1
    if not sites:
        return '<p class="note">No live allocations.</p>'
    rows = sorted(sites.items(), key=lambda kv: -kv[1][0])[:limit]
    body = "".join(f'<tr><td class="n">{_e(fmt_size(n, 1))}</td><td class="n">{c:,}</td><td><code>{_e(k).replace(chr(10), "<br>")}</code></td></tr>'
                   for k, (n, c) in rows)
    return f'<table><tr><th>bytes</th><th>blocks</th><th>where allocated (the allocation site first, then its callers)</th></tr>{body}</table>'


def _card(label: str, value: str, bad: bool = False) -> str:
    """One summary card: a value over its label (red for ``bad``)."""
    return f'<div class="card{" bad" if bad else ""}"><b>{_e(value)}</b><span>{_e(label)}</span></div>'


def _cards(tot: dict, t: Timeline | None, ooms: list[dict]) -> list[str]:
    """The summary cards: the totals, the history's peak reserved and the OOMs where there are any."""
    cards = [_card("reserved", fmt_size(tot["reserved"], 1)), _card("allocated", fmt_size(tot["allocated"], 1)),
             _card("free internal (rounding)", fmt_size(tot["free_internal"], 1)),
             _card("free external (free blocks)", fmt_size(tot["free_external"], 1)),
             _card("largest free block", fmt_size(tot["largest_free_block"], 1)),
             _card("segments", f"{tot['segments']:,}")]
    if t is not None:
        cards.append(_card("peak reserved (history)", fmt_size(int(t.reserved.max()), 1)))
    if ooms:
        cards.append(_card("out of memory", f"{len(ooms)} OOM", bad=True))
    return cards


def _page_top(title: str, choice: DeviceChoice, settings: dict, tot: dict, cards: list[str]) -> list[str]:
    """The page's head and its first lines: the title, the device, the settings, the cards and the totals."""
    return ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>{_e(title)}</title>", f"<style>{CSS}</style></head><body>",
            f"<h1>{_e(title)}</h1>",
            f'<p class="sub" id="device">{_e(choice.describe()[0].upper() + choice.describe()[1:])}'
            f'{"; others with torchmem viz --device N" if choice.devices > 1 else ""}.</p>',
            f'<p class="sub">{_e(_settings_text(settings) or "PyTorch memory snapshot")}</p>',
            f'<div class="cards">{"".join(cards)}</div>',
            f'<p class="note">allocated + free internal + free external = reserved '
            f'({tot["allocated"]:,} + {tot["free_internal"]:,} + {tot["free_external"]:,} = {tot["reserved"]:,} bytes).</p>']


def _over_time_section(t: Timeline | None, ooms: list[dict]) -> list[str]:
    """The "Over time" section: the legend, the timeline and its notes, or a note that there is no history."""
    out = ["<h2>Over time</h2>"]
    if t is not None:
        out.append(_legend([("allocated", COLORS["requested"]), ("reserved", COLORS["reserved"]),
                            ("reserved but not allocated", "rgba(221,107,32,0.3)"),
                            ("largest free block (sampled)", COLORS["largest_free"])]
                           + ([("OOM", COLORS["oom"])] if ooms else [])
                           + ([("annotation", COLORS["annotation"])] if t.annotations else [])))
        out.append(_timeline_svg(t))
        for note in t.notes:
            out.append(f'<p class="note">Note: {_e(note)}.</p>')
    else:
        out.append('<p class="note">No history in this snapshot: record with torchmem.record_memory_history() '
                   "(or torch.cuda.memory._record_memory_history()) before dumping it.</p>")
    return out


def _segments_section(segments: list[dict], tot: dict) -> list[str]:
    """The "Segments" section: the legend, the segments drawn, and a note on how they are drawn."""
    ctx = {"truncated": 0}
    out = [f"<h2>Segments (the {min(MAX_SEGMENTS, tot['segments'])} largest of {tot['segments']:,})</h2>"]
    out.append(_legend([("allocated", COLORS["requested"]), ("rounding (free internal)", COLORS["rounding"]),
                        ("free pending", COLORS["active_pending_free"]), ("free (external)", COLORS["inactive"])]))
    out.append(_segments_svg(segments, ctx) if segments else '<p class="note">No segments.</p>')
    out.append('<p class="note">Each row is one segment scaled to its own size; hover a block for its size and stack.'
               + (f" {ctx['truncated']} segments have more blocks than drawn (the largest are shown)." if ctx["truncated"] else "")
               + "</p>")
    return out


def _ooms_table(ooms: list[dict]) -> list[str]:
    """The "Out-of-memory events" section: one row per OOM."""
    out = ['<h2 id="ooms">Out-of-memory events</h2><table><tr><th>trace entry</th><th>requested</th><th>allocated</th>'
           "<th>reserved</th><th>free on the device</th></tr>"]
    out.extend(f'<tr><td class="n">{o["entry"]:,}</td><td class="n">{_e(fmt_size(o["size"], 1))}</td>'
               f'<td class="n">{_e(fmt_size(o["allocated"], 1))}</td><td class="n">{_e(fmt_size(o["reserved"], 1))}</td>'
               f'<td class="n">{_e(fmt_size(o["device_free"], 1))}</td></tr>' for o in ooms)
    out.append("</table>")
    return out


def _annotations_table(annotations: list) -> list[str]:
    """The "Annotations" section: the first MAX_ANNOTATIONS annotations, one row each."""
    out = [f'<h2 id="annotations">Annotations ({len(annotations):,})</h2><table><tr><th>trace entry</th>'
           "<th>annotation</th><th>block</th><th>address</th></tr>"]
    out.extend(f'<tr><td class="n">{a.entry:,}</td><td>{_e(a.text)}</td>'
               f'<td class="n">{_e(fmt_size(a.size, 1)) if a.size is not None else ""}</td>'
               f'<td class="n">{f"0x{a.addr:x}" if a.addr is not None else ""}</td></tr>'
               for a in annotations[:MAX_ANNOTATIONS])
    out.append("</table>")
    if len(annotations) > MAX_ANNOTATIONS:
        out.append(f'<p class="note">The first {MAX_ANNOTATIONS:,} are shown.</p>')
    return out


def render_html(snapshot: dict, title: str = "memory snapshot", device: int | None = None,
                progress: Callable[[int], None] | None = None) -> str:
    """The page as a string: one device of the snapshot (`device`, else the one with the OOM, else the one
    with the most history: torchmem.formats.snapshot_devices)."""
    choice = choose_device(snapshot, device)
    segments = device_segments(snapshot, choice.device)
    tot = totals({"segments": segments})
    traces = snapshot.get("device_traces") or []
    has_history = choice.device < len(traces) and bool(traces[choice.device])
    t = timeline(snapshot, choice.device, progress=progress) if has_history else None
    ooms = t.ooms if t else []
    settings = snapshot.get("allocator_settings") or {}
    out = _page_top(title, choice, settings, tot, _cards(tot, t, ooms))
    out.extend(_over_time_section(t, ooms))
    out.extend(_segments_section(segments, tot))
    out.append("<h2>Live memory by allocation site</h2>")
    out.append(_sites_table(segments))
    if ooms:
        out.extend(_ooms_table(ooms))
    if t is not None and t.annotations:
        out.extend(_annotations_table(t.annotations))
    out.append('<p class="note">Made by torchmem viz. This page needs no network.</p></body></html>')
    return "\n".join(out)


def write_html(snapshot: dict, path: str | os.PathLike, title: str = "memory snapshot", device: int | None = None,
               progress: Callable[[int], None] | None = None) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(render_html(snapshot, title, device, progress))
