"""Fields of snapshot entries: the checks every reader of a snapshot shares."""
from __future__ import annotations

from torchmem import _core
from torchmem.formats.trace_types import TraceError, short_repr

SMALL_SEGMENT = _core.rules.SMALL_BUFFER  # the native allocator's small-pool segments; large ones are never this size
LIVE_STATES = ("active_allocated", "active_pending_free")


INT_LIMIT = 2**62  # addresses and sizes: a sum of two stays below 2**63


def int_field(entry: dict, key: str, where: object) -> int:
    value = entry.get(key)
    if type(value) is int and 0 <= value < INT_LIMIT:  # the common case, first
        return value
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TraceError(f"{where}: {key} must be a non-negative integer, got {short_repr(value)}")
    if value >= INT_LIMIT:
        raise TraceError(f"{where}: {key} is {value:,}, past 2**62 (no device has that much memory)")
    return value
