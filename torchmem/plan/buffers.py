"""The planner's input and its lifetimes: a buffer with a half-open lifetime
and a size, and, with several streams, its producer's stream, its reads on
other streams and synchronisations (their types: torchmem/plan/streams.py);
where its lifetime ends under streams (``lifetimes``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Hashable, Iterable, Mapping, Sequence

from torchmem.plan.streams import Read, Sync, as_reads, as_syncs, check_stream
from torchmem import _core

INT64_LIMIT = 2**63


@dataclass(frozen=True)
class Buffer:
    """``size`` bytes live over time steps ``[lower, upper)``.

    A buffer ending at ``t`` and one starting at ``t`` may share bytes.
    With streams: ``stream`` is where it is produced (at ``lower``) and used
    through ``upper - 1``; ``reads`` are uses ``(stream, step)`` on other
    streams; ``syncs`` are synchronisations ``(src, after, dst, before)``
    (any buffer may name any; the planner uses them all).
    """

    id: Hashable
    lower: int
    upper: int
    size: int
    stream: int = 0
    reads: tuple[Read, ...] = ()
    syncs: tuple[Sync, ...] = ()

    def __post_init__(self) -> None:
        for name in ("lower", "upper", "size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                try:
                    as_int = int(value)
                except (TypeError, ValueError):
                    raise ValueError(f"buffer {self.id!r}: {name} must be an integer, got {value!r}") from None
                if as_int != value:
                    raise ValueError(f"buffer {self.id!r}: {name} must be an integer, got {value!r}")
                object.__setattr__(self, name, as_int)
        for name in ("lower", "upper", "size"):
            if not -INT64_LIMIT <= getattr(self, name) < INT64_LIMIT:
                raise ValueError(f"buffer {self.id!r}: {name} {getattr(self, name)} does not fit in 63 bits")
        if self.size < 0:
            raise ValueError(f"buffer {self.id!r}: negative size {self.size}")
        if self.lower >= self.upper:
            raise ValueError(f"buffer {self.id!r}: lower {self.lower} >= upper {self.upper} (lifetimes are [lower, upper))")
        owner = f"buffer {self.id!r}"
        object.__setattr__(self, "stream", check_stream(self.stream, f"{owner}: stream"))
        object.__setattr__(self, "reads", as_reads(self.reads, owner))
        object.__setattr__(self, "syncs", as_syncs(self.syncs, owner))


def as_buffers(items: Iterable[Any]) -> list[Buffer]:
    """Buffers from Buffer objects, ``(id, lower, upper, size)`` tuples or
    mappings with those keys (and optionally ``stream``, ``reads``,
    ``syncs``). Raises ValueError on anything else, on a negative size, on
    lower >= upper and on duplicate ids."""
    out: list[Buffer] = []
    for k, item in enumerate(items):
        if isinstance(item, Buffer):
            b = item
        elif isinstance(item, Mapping):
            try:
                b = Buffer(item.get("id", k), item["lower"], item["upper"], item["size"], item.get("stream", 0),
                           item.get("reads", ()), item.get("syncs", ()))
            except KeyError as exc:
                raise ValueError(f"buffer #{k}: missing key {exc.args[0]!r}") from None
        elif isinstance(item, Sequence) and not isinstance(item, (str, bytes)) and len(item) == 4:
            b = Buffer(*item)
        else:
            raise ValueError(f"buffer #{k}: expected a Buffer, (id, lower, upper, size) or a mapping, got {item!r}")
        out.append(b)
    seen: set = set()
    for b in out:
        if b.id in seen:
            raise ValueError(f"duplicate buffer id {b.id!r}")
        seen.add(b.id)
    return out


@dataclass(frozen=True)
class Lifetime:
    """Ends of a buffer's lifetime under streams (see docs/planner.md):
    ``own`` the release on its home stream, ``shared`` the release on every
    allocating stream, ``bound`` the earliest release on any of them."""

    own: int
    shared: int
    bound: int


def has_streams(buffers: Iterable[Buffer]) -> bool:
    """True when some buffer names a stream other than 0, a read or a sync."""
    return any(b.stream or b.reads or b.syncs for b in buffers)


def schedule_columns(buffers: Sequence[Buffer]) -> tuple[list[int], list[tuple[int, int, int]],
                                                         list[tuple[int, int, int, int]], list[str]]:
    """The core's schedule: home streams, reads (buffer, stream, step), the
    union of every buffer's syncs, and names for error messages."""
    home = [b.stream for b in buffers]
    reads = [(i, r.stream, r.step) for i, b in enumerate(buffers) for r in b.reads]
    syncs = sorted({tuple(s) for b in buffers for s in b.syncs})
    names = [repr(b.id) for b in buffers]
    return home, reads, syncs, names


def lifetimes(buffers: Iterable[Any]) -> list[Lifetime]:
    """Each buffer's lifetime ends under streams; ValueError for bad input
    (a read with no synchronisation from its producer or back to it, ...)."""

    bs = as_buffers(buffers)
    if not bs:
        return []
    own, shared, bound, _ = _core.planner.stream_lifetimes(
        [b.lower for b in bs], [b.upper for b in bs], [b.size for b in bs], *schedule_columns(bs))
    return [Lifetime(o, s, lo) for o, s, lo in zip(own, shared, bound)]
