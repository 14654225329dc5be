"""What a snapshot's trace says beside memory: annotations and user metadata (torch 2.14.1 and later).

`torch.cuda.memory._annotate_tensor(t, text)` writes an `annotate` entry: the
address and size of t's live block, and `text` as its `user_metadata`. It
changes no memory. `torch.cuda.memory._set_memory_metadata(text)` stamps
`text` as the `user_metadata` of every later entry of the calling thread.
PyTorch's memory_viz shows both; `torchmem stats` lists them and `torchmem viz`
marks annotations on its timeline. Replay leaves annotate entries out.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from torchmem.sizes import fmt_size


@dataclass(frozen=True)
class Annotation:
    """One annotate entry of a device's trace."""

    entry: int             # its index in the device's trace
    time_us: int | float   # its time_us (0 where it has none)
    addr: int | None       # the annotated block's address
    size: int | None       # the annotated block's size
    text: str              # its user_metadata


@dataclass(frozen=True)
class MetadataValue:
    """One user_metadata value stamped on trace entries by _set_memory_metadata."""

    text: str
    entries: int      # how many entries (other than annotate) carry it
    first_entry: int  # the first of them


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def annotation_entries(entries: list) -> list[Annotation]:
    """The annotate entries of one device's trace, in trace order."""
    found = []
    for i, e in enumerate(entries):
        if isinstance(e, dict) and e.get("action") == "annotate":
            t = e.get("time_us", 0)
            found.append(Annotation(i, t if isinstance(t, (int, float)) and not isinstance(t, bool) else 0,
                                    _int(e.get("addr")), _int(e.get("size")), str(e.get("user_metadata", ""))))
    return found


def metadata_values(entries: list) -> list[MetadataValue]:
    """Each non-empty user_metadata value of the trace's other entries, in order of first use."""
    counts: dict[str, list[int]] = {}
    for i, e in enumerate(entries):
        if isinstance(e, dict) and e.get("action") != "annotate":
            text = e.get("user_metadata")
            if isinstance(text, str) and text:
                counts.setdefault(text, [0, i])[0] += 1
    return [MetadataValue(text, n, first) for text, (n, first) in counts.items()]


def device_entries(snapshot: dict, device: int) -> list:
    traces = snapshot.get("device_traces") or []
    trace = traces[device] if 0 <= device < len(traces) else []
    return trace if isinstance(trace, list) else []


def as_json(snapshot: dict, device: int) -> dict:
    """{"annotations": [...], "user_metadata": [...]} of one device, for the commands' --json."""
    entries = device_entries(snapshot, device)
    return {"annotations": [asdict(a) for a in annotation_entries(entries)],
            "user_metadata": [asdict(m) for m in metadata_values(entries)]}


def format_notes(snapshot: dict, device: int, limit: int = 20) -> str:
    """Lines for `torchmem stats`: each annotation with its entry and time, and each metadata value."""

    entries = device_entries(snapshot, device)
    found, values = annotation_entries(entries), metadata_values(entries)
    if not found and not values:
        return ""
    t0 = next((e.get("time_us") for e in entries if isinstance(e, dict) and isinstance(e.get("time_us"), (int, float))), 0)
    lines = []
    if found:
        lines.append(f"  annotations {len(found):>18,}  (torch.cuda.memory._annotate_tensor)")
        for a in found[:limit]:
            block = f" on the {fmt_size(a.size, 1)} block" if a.size is not None else ""
            at = f" at 0x{a.addr:x}" if a.addr is not None else ""
            lines.append(f"    entry {a.entry:,} ({(a.time_us - t0) / 1e6:.6f} s in): {a.text!r}{block}{at}")
        if len(found) > limit:
            lines.append(f"    ... and {len(found) - limit:,} more (--json lists all)")
    if values:
        lines.append(f"  user metadata {len(values):>16,}  values (torch.cuda.memory._set_memory_metadata)")
        for m in values[:limit]:
            lines.append(f"    {m.text!r} on {m.entries:,} entries, first entry {m.first_entry:,}")
        if len(values) > limit:
            lines.append(f"    ... and {len(values) - limit:,} more (--json lists all)")
    return "\n".join(lines)
