"""memory_summary(): the statistics as a table, in the layout of torch.cuda.memory_summary()."""
from __future__ import annotations

from typing import Any

from torchmem.memory import memory_stats

WIDTH = 75


def format_bytes(n: int) -> str:
    """Human-readable bytes: 0 B, 512 B, 1.5 KiB, 20.0 MiB, 1.2 GiB."""
    n = int(n)
    sign = "-" if n < 0 else ""
    value = float(abs(n))
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{sign}{int(value)} {unit}" if unit == "B" else f"{sign}{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def format_count(n: int) -> str:
    return str(int(n))


ROWS = [
    ("Allocated memory", "allocated_bytes", format_bytes, True),
    ("Active memory", "active_bytes", format_bytes, True),
    ("Requested memory", "requested_bytes", format_bytes, True),
    ("Reserved memory", "reserved_bytes", format_bytes, True),
    ("Non-releasable memory", "inactive_split_bytes", format_bytes, True),
    ("Allocations", "allocation", format_count, True),
    ("Active allocs", "active", format_count, True),
    ("Reserved segments", "segment", format_count, True),
    ("Non-releasable allocs", "inactive_split", format_count, True),
    ("Oversize allocations", "oversize_allocations", format_count, False),
    ("Oversize segments", "oversize_segments", format_count, False),
]


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    """A table of current, peak, total allocated and total freed for each statistic."""
    stats = memory_stats(device)
    line = "|" + "-" * WIDTH + "|"
    double = "|" + "=" * WIDTH + "|"
    out = [double, "|" + " torchmem memory summary, device cpu ".center(WIDTH) + "|", line]
    half = WIDTH // 2
    out.append(
        "|"
        + f" OOMs: {stats.get('num_ooms', 0)}".ljust(half)
        + "|"
        + f" device alloc retries: {stats.get('num_alloc_retries', 0)}".ljust(WIDTH - half - 1)
        + "|"
    )
    out.append(double)
    out.append("|" + "        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  ".ljust(WIDTH) + "|")
    for title, key, fmt, pooled in ROWS:
        out.append(line)
        pools = [("all", title)]
        if pooled and not abbreviated:
            pools += [("large_pool", "      from large pool"), ("small_pool", "      from small pool")]
        for pool, label in pools:
            prefix = f"{key}.{pool}" if pooled else key
            cells = [fmt(stats.get(f"{prefix}.{field}", 0)) for field in ("current", "peak", "allocated", "freed")]
            row = f" {label:<22}|" + "|".join(f" {c:>10} " for c in cells)
            out.append("|" + row.ljust(WIDTH) + "|")
    out.append(double)
    return "\n".join(out) + "\n"
