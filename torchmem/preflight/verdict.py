"""Whether a run fits the card itself, not only PyTorch's allocator (docs/preflight.md).

A program never gets a card's whole memory: the CUDA context and the
libraries' own memory sit outside PyTorch's caching allocator. A run fits
when its peak reserved bytes plus that outside memory stay within the
``total_memory`` the card reports:

    fits  <=>  peak_reserved + outside <= total
    headroom = total - outside - peak_reserved   (negative when it does not fit)
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Verdict:
    """One device's memory against its card."""

    peak_reserved: int   # PyTorch's reserved_bytes.all.peak
    outside: int         # memory outside the allocator counted against the card
    total: int           # the card's total_memory

    @property
    def needed(self) -> int:
        return self.peak_reserved + self.outside

    @property
    def headroom(self) -> int:
        return self.total - self.needed

    @property
    def fits(self) -> bool:
        return self.needed <= self.total


def verdict(peak_reserved: int, outside: int, total: int) -> Verdict:
    """The verdict for one device; every figure in bytes, none negative."""
    for label, value in (("peak_reserved", peak_reserved), ("outside", outside), ("total", total)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{label} must be a byte count (an int, 0 or more), not {value!r}")
    return Verdict(peak_reserved, outside, total)
