"""Buffers from a recorded allocation trace.

A trace is a list of events ``{"op": "alloc" | "free", "id": N, "size": BYTES}``
in program order (``size`` is needed on allocs only). Event ``k`` happens
at time ``k``; an id allocated at event ``a`` and freed at event ``f`` becomes
a buffer live over ``[a, f)``. Ids still live at the end stay live until one
step past the last event. An id may be reused after it is freed (each
allocation becomes its own buffer, named ``id`` or ``(id, n)`` for the n-th
reuse). Self-contained: it reads plain dicts, not any other module's types.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

from torchmem.plan.buffers import Buffer


def buffers_from_trace(events: Iterable[Mapping[str, Any]]) -> list[Buffer]:
    buffers: list[Buffer] = []
    live: dict[Any, tuple[Any, int, int]] = {}  # id -> (name, start, size)
    uses: dict[Any, int] = {}
    t = 0
    for t, event in enumerate(events):
        try:
            op, key = event["op"], event["id"]
        except (KeyError, TypeError):
            raise ValueError(f"event {t}: expected a mapping with 'op' and 'id', got {event!r}") from None
        if op == "alloc":
            if key in live:
                raise ValueError(f"event {t}: id {key!r} allocated twice without a free")
            size = event.get("size")
            if isinstance(size, bool) or not isinstance(size, int) or size < 0:
                raise ValueError(f"event {t}: alloc of {key!r} needs a non-negative integer size, got {size!r}")
            n = uses.get(key, 0)
            uses[key] = n + 1
            live[key] = (key if n == 0 else (key, n), t, size)
        elif op == "free":
            if key not in live:
                raise ValueError(f"event {t}: free of {key!r}, which is not allocated")
            name, start, size = live.pop(key)
            buffers.append(Buffer(name, start, t, size))
        else:
            raise ValueError(f"event {t}: op must be 'alloc' or 'free', got {op!r}")
    end = t + 1
    for name, start, size in live.values():
        buffers.append(Buffer(name, start, max(end, start + 1), size))
    buffers.sort(key=lambda b: (b.lower, b.upper))
    return buffers
