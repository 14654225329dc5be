"""Ranks side by side: one row per snapshot (one per rank of a distributed job).

Each row is a pure function of one snapshot dict (PyTorch's format, or
torchmem's with the ``torchmem_oom`` key dump_on_oom() adds):

- ``allocated``, ``reserved``, ``reserved_but_free`` (free blocks inside
  segments: reserved minus allocated blocks) and ``largest_free_block``,
  counted as torch.cuda._memory_viz counts them (see totals.py), over the
  device the row describes: the one given, else the one with an ``oom``
  entry, else the one with the most trace entries (torchmem.formats.snapshot_devices);
- ``oom``: the last ``oom`` entry of that device's trace (request, the
  device's free bytes, its time, its place in the trace), or None;
- ``top_sites``: the allocation sites holding the most bytes in live
  blocks at the end; a block's site is the innermost frame of its stack in
  the program's own code (not in torch, torchmem, the standard library or
  installed packages), else its innermost Python frame.

The rank is the ``torchmem_oom`` key's, else ``rank<N>`` in the file name,
else the file's position among those given.
"""
from __future__ import annotations

import datetime
import os
import re
from typing import Any, Iterable

from torchmem.sizes import fmt_size
from torchmem.viz.totals import totals
from torchmem.formats.snapshot_devices import choose_device

_RANK_IN_NAME = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)
_LIBRARY_DIRS = {"site-packages", "dist-packages", "torch"}


def is_library_frame(filename: str) -> bool:
    """Whether a frame is in torch, torchmem, the standard library or an installed package."""
    if filename.startswith("<"):
        return filename.startswith("<frozen")  # <string>, <stdin>, a notebook cell: the program's own
    if not filename.endswith(".py"):
        return True  # C++ frames (PyTorch records them on CUDA)
    parts = re.split(r"[\\/]", filename)
    if _LIBRARY_DIRS & set(parts[:-1]):
        return True
    if any(re.fullmatch(r"python3(\.\d+)?", p) for p in parts[:-1]) and "lib" in parts:
        return True  # the standard library: .../lib/python3.11/...
    # torchmem's own modules: a "torchmem" directory holding __init__-level modules or subpackages.
    if "torchmem" in parts[:-1]:
        after = parts[parts.index("torchmem") + 1:]
        return bool(after) and (len(after) == 1 or after[0] in {"cli", "formats", "plan", "replay", "runtime", "viz"})
    return False


def site_of(frames: list[dict]) -> dict | None:
    """The frame that names where a block was allocated (see the module docstring); None without frames."""
    if not frames:
        return None
    for f in frames:
        if not is_library_frame(str(f.get("filename", ""))):
            return f
    for f in frames:
        if str(f.get("filename", "")).endswith(".py"):
            return f  # all in libraries: the innermost Python frame
    return frames[0]


def user_frames(frames: list[dict]) -> list[dict]:
    """The stack from its allocation site (site_of) outwards: the frames below it (torch's C++ unwinder,
    the caching allocator, library code) left out. `viz` lists these and `ranks` names their first."""
    site = site_of(frames)
    if site is None:
        return []
    return frames[next(i for i, f in enumerate(frames) if f is site):]


def site_label(frame: dict | None) -> str:
    if frame is None:
        return "(no stack recorded)"
    return f"{os.path.basename(str(frame.get('filename', '?')))}:{frame.get('line', '?')} {frame.get('name', '?')}"


def top_sites(segments: Iterable[dict], limit: int = 5) -> list[dict]:
    """Allocation sites by bytes in live blocks (requested sizes), most first."""
    sites: dict[tuple, dict] = {}
    for seg in segments:
        for b in seg.get("blocks", []):
            if b.get("state") != "active_allocated":
                continue
            frame = site_of(b.get("frames") or [])
            key = (frame.get("filename"), frame.get("line"), frame.get("name")) if frame else None
            entry = sites.setdefault(key, {"site": site_label(frame), "filename": key[0] if key else None,
                                           "line": key[1] if key else None, "name": key[2] if key else None,
                                           "bytes": 0, "blocks": 0})
            entry["bytes"] += int(b.get("requested_size") or b.get("size", 0))
            entry["blocks"] += 1
    return sorted(sites.values(), key=lambda s: (-s["bytes"], s["site"]))[:limit]


def rank_of(snapshot: dict, path: str, position: int) -> tuple[int, str]:
    """(rank, where it came from: "snapshot", "file name" or "position")."""
    meta = snapshot.get("torchmem_oom")
    if isinstance(meta, dict) and isinstance(meta.get("rank"), int):
        return meta["rank"], "snapshot"
    m = _RANK_IN_NAME.search(os.path.basename(path))
    if m:
        return int(m.group(1)), "file name"
    return position, "position"


def rank_row(snapshot: dict, path: str, position: int = 0, top: int = 5, device: int | None = None) -> dict[str, Any]:
    """One row of the table (see the module docstring); `device` as every command picks it (torchmem.formats.snapshot_devices)."""

    choice = choose_device(snapshot, device, path)
    device = choice.device
    segments = [s for s in snapshot.get("segments", []) if s.get("device", device) == device]
    t = totals({"segments": segments})
    traces = snapshot.get("device_traces") or []
    trace = traces[device] if device < len(traces) else []
    oom = None
    for i in range(len(trace) - 1, -1, -1):
        e = trace[i]
        if e.get("action") == "oom":
            oom = {"size": e.get("size"), "device_free": e.get("device_free"), "time_us": e.get("time_us"),
                   "entry": i, "entries": len(trace)}
            break
    rank, source = rank_of(snapshot, path, position)
    return {
        "rank": rank, "rank_from": source, "file": path, "device": device, "device_choice": choice.describe(),
        "allocated": t["allocated"], "reserved": t["reserved"], "reserved_but_free": t["free_external"],
        "largest_free_block": t["largest_free_block"], "oom": oom, "top_sites": top_sites(segments, top),
    }


def _when(oom: dict) -> str:
    parts = []
    us = oom.get("time_us")
    if isinstance(us, (int, float)) and us > 10**15:  # microseconds since the epoch, as PyTorch records
        parts.append(datetime.datetime.fromtimestamp(us / 1e6).strftime("%Y-%m-%d %H:%M:%S"))
    parts.append(f"trace entry {oom['entry']:,} of {oom['entries']:,}")
    return ", ".join(parts)


def format_rows(rows: list[dict]) -> str:
    """The rows as one aligned table, then each rank's top sites."""
    header = ["rank", "device", "allocated", "reserved", "reserved but free", "largest free", "OOM request", "OOM when",
              "top site (bytes live)"]
    table = []
    for r in rows:
        oom = r["oom"]
        first = r["top_sites"][0] if r["top_sites"] else None
        table.append([str(r["rank"]), str(r["device"]), fmt_size(r["allocated"], 1), fmt_size(r["reserved"], 1),
                      fmt_size(r["reserved_but_free"], 1), fmt_size(r["largest_free_block"], 1),
                      fmt_size(oom["size"], 1) if oom else "-", _when(oom) if oom else "-",
                      f"{first['site']} ({fmt_size(first['bytes'], 1)})" if first else "-"])
    widths = [max(len(h), *(len(row[i]) for row in table)) if table else len(h) for i, h in enumerate(header)]
    right = {0, 1, 2, 3, 4, 5, 6}

    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    out = [line(header), line(["-" * w for w in widths])] + [line(row) for row in table]
    ooms = [r for r in rows if r["oom"]]
    out.append("")
    out.append(f"{len(ooms)} of {len(rows)} rank{'s' if len(rows) != 1 else ''} ran out of memory"
               + (": " + ", ".join(str(r["rank"]) for r in ooms) if ooms else "") + ".")
    for r in rows:
        if not r["top_sites"]:
            continue
        out.append("")
        out.append(f"rank {r['rank']} ({r['file']}), {r.get('device_choice') or 'device ' + str(r['device'])}: "
                   "top allocation sites by bytes live at the end")
        for s in r["top_sites"]:
            out.append(f"  {fmt_size(s['bytes'], 1):>10}  {s['blocks']:>6,} block{'s' if s['blocks'] != 1 else ' '}  {s['site']}")
    for r in ooms:
        path = r["file"]
        out.append("")
        out.append(f"rank {r['rank']}: torchmem replay {path}   (why)   torchmem advise {path}   (which setting avoids it)")
    return "\n".join(out)
