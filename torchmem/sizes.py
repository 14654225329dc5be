"""Sizes in words, for messages and reports: a leaf of the package (it imports nothing of torchmem)."""
from __future__ import annotations


def gib(n: int) -> str:
    """'21.30 GiB' (always GiB); the commands print fmt_size()."""
    return f"{n / 2**30:.2f} GiB"


def fmt_size(n: int | float) -> str:
    """A size in the unit that fits it, two decimals: 512 -> '512 B', 3 << 20 -> '3.00 MiB', 21.3 GiB -> '21.30 GiB'."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024:
            return f"{int(n):,} B" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    return f"{value:.2f} TiB"
