"""memory_summary(): the statistics as a table, in the layout of torch.cuda.memory_summary()."""
from __future__ import annotations

from typing import Any

from torchmem.runtime.memory import memory_stats
from torchmem.sizes import fmt_size

WIDTH = 75


def format_bytes(n: int) -> str:
    """The table's sizes: one decimal ('1.5 KiB')."""
    return fmt_size(n, 1)


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
