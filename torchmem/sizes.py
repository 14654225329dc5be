"""Sizes: the one parser of sizes given as text, and the one formatter for messages and reports.

It imports only the core, whose parser reads PYTORCH_CUDA_ALLOC_CONF's sizes.
"""
from __future__ import annotations

from torchmem import _core


def gib(n: int) -> str:
    """'21.30 GiB' (always GiB); the commands print fmt_size()."""
    return f"{n / 2**30:.2f} GiB"


def fmt_size(n: int | float, decimals: int = 2) -> str:
    """A size in the unit that fits it: 512 -> '512 B', 3 << 20 -> '3.00 MiB', 21.3 GiB -> '21.30 GiB'.

    The commands' messages take two decimals; the statistics table and the pictures take one ('1.5 KiB')."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024:
            return f"{int(n):,} B" if unit == "B" else f"{value:.{decimals}f} {unit}"
        value /= 1024
    return f"{value:.{decimals}f} TiB"


def size_unit(peak: float) -> tuple[int, str]:
    """The unit of an axis whose largest value is `peak` bytes, as fmt_size would pick it: (bytes per unit, name)."""
    for scale, name in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if peak >= scale:
            return scale, name
    return 1, "B"


def parse_bytes(value: int | str, what: str = "capacity", allow_zero: bool = False) -> int:
    """Bytes from an int or a string with a unit like "80GiB" (2**30 bytes each) or "80GB" (10**9 bytes
    each); "8" alone is refused (bytes? GiB?), "8B" is 8 bytes. ValueError if negative (or zero)."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise TypeError(f"{what} must be bytes or a string like '80GiB', not {type(value).__name__}")
    if isinstance(value, str) and value.strip().replace(".", "", 1).isdigit() and float(value) != 0:
        raise ValueError(f"{what} {value.strip()!r} has no unit: write {value.strip()}GiB (2**30 bytes each), "
                         f"{value.strip()}GB (10**9 bytes each) or {value.strip()}B (bytes)")
    n = value if isinstance(value, int) else _core.parse_size(value)
    if n < 0 or (n == 0 and not allow_zero):
        raise ValueError(f"{what} must be {'non-negative' if allow_zero else 'positive'}, got {value!r}")
    return n


_DECIMAL_UNITS = {"kb": ("KiB", 10**3, 2**10), "mb": ("MiB", 10**6, 2**20), "gb": ("GiB", 10**9, 2**30),
                  "tb": ("TiB", 10**12, 2**40)}


def size_reading(value: int | str) -> str:
    """How a size given as text was read, for a size with a decimal unit: '80GB = 80,000,000,000 bytes
    (74.51 GiB; GB is 10**9 bytes, 80GiB would be 85,899,345,920)'; '' for binary units and plain ints."""
    if not isinstance(value, str):
        return ""
    text = value.strip()
    number = text.rstrip("bBkKmMgGtT ")
    unit = text[len(number):].strip().lower()
    if unit not in _DECIMAL_UNITS:
        return ""
    binary, decimal_scale, binary_scale = _DECIMAL_UNITS[unit]
    n = parse_bytes(text)
    return (f"{text} = {n:,} bytes ({fmt_size(n)}; {unit.upper()} is {decimal_scale:,} bytes, "
            f"{number}{binary} would be {int(float(number) * binary_scale):,})")
