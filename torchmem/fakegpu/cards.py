"""Which card the fake GPU pretends to be: a size, or a named card.

A named card sets the memory, the compute capability (PyTorch sizes some
workspaces by it) and the number of multiprocessors. The memory is the
card's nominal size in GiB; a real card reports a little less to CUDA, and
its driver keeps some for the context (not modelled: the fake card's free
memory starts at its total).
"""
from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Card:
    name: str
    memory: int              # bytes
    capability: str = "9.0"  # "major.minor"
    multiprocessors: int = 132


CARDS: dict[str, Card] = {
    "h100": Card("NVIDIA H100 80GB (torchmem fake GPU)", 80 << 30, "9.0", 132),
    "h200": Card("NVIDIA H200 141GB (torchmem fake GPU)", 141 << 30, "9.0", 132),
    "a100": Card("NVIDIA A100 80GB (torchmem fake GPU)", 80 << 30, "8.0", 108),
    "a100-40gb": Card("NVIDIA A100 40GB (torchmem fake GPU)", 40 << 30, "8.0", 108),
    "l4": Card("NVIDIA L4 24GB (torchmem fake GPU)", 24 << 30, "8.9", 58),
}

_UNITS = {"b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
          "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]+)\s*$")


def parse_memory(text: str) -> int:
    """Bytes from "80GiB", "24GB" (10**9), "512MiB"; a unit is required."""
    match = _SIZE.match(text)
    if not match or match.group(2).lower() not in _UNITS:
        raise ValueError(f"card size {text!r}: give a number with a unit (B, KiB, MiB, GiB, TiB, or KB, MB, GB, TB), "
                         f"or one of {', '.join(sorted(CARDS))}")
    value = float(match.group(1)) * _UNITS[match.group(2).lower()]
    if value < 2 << 20:
        raise ValueError(f"card size {text!r}: at least 2MiB")
    return int(value)


def card(spec: str | int | Card) -> Card:
    """A Card from a preset name, a size string or a number of bytes."""
    if isinstance(spec, Card):
        return spec
    if isinstance(spec, bool):
        raise TypeError("card must be a size like '80GiB', a byte count or a card name")
    if isinstance(spec, int):
        if spec < 2 << 20:
            raise ValueError(f"card size {spec} bytes: at least 2MiB")
        return Card("torchmem fake GPU", spec)
    preset = CARDS.get(spec.strip().lower())
    return preset if preset else Card("torchmem fake GPU", parse_memory(spec))
