"""Totals of a snapshot, as torch.cuda._memory_viz.segsum counts them.

``allocated`` is the bytes requested by live allocations; ``free_internal``
is what rounding added to them (block size minus requested size);
``free_external`` is the bytes of blocks that are not allocated (inactive, or
waiting for their free to complete). The three add up to ``reserved``.
"""
from __future__ import annotations

from typing import Any

from torchmem.sizes import fmt_size


def totals(snapshot: dict) -> dict[str, Any]:
    """Totals over all segments, and per pool ("small", "large")."""
    out = _zero()
    pools = {"small": _zero(), "large": _zero()}
    for seg in snapshot["segments"]:
        for t in (out, pools[seg["segment_type"]]):
            _add_segment(t, seg)
    out["pools"] = pools
    return out


def _zero() -> dict[str, Any]:
    return {
        "segments": 0, "blocks": 0, "active_blocks": 0, "reserved": 0, "allocated": 0, "free_internal": 0,
        "free_external": 0, "active_pending_free": 0, "largest_free_block": 0, "expandable_segments": 0,
    }


def _add_segment(t: dict, seg: dict) -> None:
    t["segments"] += 1
    t["expandable_segments"] += bool(seg.get("is_expandable"))
    t["reserved"] += seg["total_size"]
    for b in seg["blocks"]:
        t["blocks"] += 1
        if b["state"] == "active_allocated":
            requested = b.get("requested_size", b["size"])
            t["active_blocks"] += 1
            t["allocated"] += requested
            t["free_internal"] += b["size"] - requested
        else:
            t["free_external"] += b["size"]
            if b["state"] != "inactive":
                t["active_pending_free"] += b["size"]
            else:
                t["largest_free_block"] = max(t["largest_free_block"], b["size"])


def format_totals(t: dict, name: str = "") -> str:
    """The totals as aligned text, with the check that the parts add up."""
    reserved = t["reserved"]

    def pct(n: int) -> str:
        return f"{100 * n / reserved:5.1f}%" if reserved else "     -"

    lines = [f"{name}" if name else "snapshot",
             f"  segments            {t['segments']:>12,}  ({t['expandable_segments']} expandable)",
             f"  blocks              {t['blocks']:>12,}  ({t['active_blocks']} allocated)",
             f"  reserved            {fmt_size(reserved, 1):>12}  {reserved:>16,} B",
             f"  allocated           {fmt_size(t['allocated'], 1):>12}  {t['allocated']:>16,} B  {pct(t['allocated'])}",
             f"  free internal       {fmt_size(t['free_internal'], 1):>12}  {t['free_internal']:>16,} B  {pct(t['free_internal'])}  (rounding inside allocated blocks)",
             f"  free external       {fmt_size(t['free_external'], 1):>12}  {t['free_external']:>16,} B  {pct(t['free_external'])}  (free blocks in segments)",
             f"  largest free block  {fmt_size(t['largest_free_block'], 1):>12}  {t['largest_free_block']:>16,} B"]
    if t["active_pending_free"]:
        lines.append(f"  pending free        {fmt_size(t['active_pending_free'], 1):>12}  (counted in free external)")
    for pool in ("large", "small"):
        p = t["pools"][pool]
        if p["segments"]:
            lines.append(f"  {pool} pool: {p['segments']} segment{'s' if p['segments'] != 1 else ''}, {fmt_size(p['reserved'], 1)} reserved, "
                         f"{fmt_size(p['allocated'], 1)} allocated, {fmt_size(p['free_external'], 1)} free external")
    ok = t["allocated"] + t["free_internal"] + t["free_external"] == reserved
    lines.append(f"  allocated + free internal + free external {'=' if ok else '!='} reserved")
    return "\n".join(lines)
