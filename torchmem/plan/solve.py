"""``solve``: place buffers in one slab (the C++ planner in csrc/core/planner)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Iterable, Optional

from torchmem import _core
from torchmem.plan.buffers import Buffer, as_buffers, has_streams, schedule_columns

METHODS = ("auto", "naive", "greedy", "sweep", "bottom_up", "portfolio", "search")
SHARINGS = ("auto", "shared", "per_stream")
DEFAULT_TIME_LIMIT = 10.0

ProgressFn = Callable[[float, int, int, str], None]
_planner = _core.planner


def _columns(buffers: list[Buffer]) -> tuple[list[int], list[int], list[int]]:
    return [b.lower for b in buffers], [b.upper for b in buffers], [b.size for b in buffers]


@dataclass
class Plan:
    """A placement: ``offsets[i]`` is the byte offset of ``buffers[i]``.

    ``height`` is the slab size (max offset + size, with sizes rounded up to
    ``alignment``); ``lower_bound`` the most bytes live at one instant (no
    placement can be lower); ``optimal`` is True when the height is proven
    minimal; ``method`` names what produced the placement. With streams,
    ``sharing`` says how streams share the slab ("shared" or "per_stream"),
    liveness extends to the synchronisations after reads on other streams,
    and ``validate()`` checks that no two buffers that can be live at once
    (in any execution the syncs allow) overlap.
    """

    buffers: list[Buffer]
    offsets: list[int]
    height: int
    lower_bound: int
    method: str
    optimal: bool
    seconds: float
    alignment: int = 1
    nodes: int = 0
    sharing: str = ""
    _by_id: dict = field(default_factory=dict, repr=False)

    def offset_of(self, buffer_id: Hashable) -> int:
        if not self._by_id:
            self._by_id = {b.id: off for b, off in zip(self.buffers, self.offsets)}
        return self._by_id[buffer_id]

    def as_dict(self) -> dict[Hashable, int]:
        return {b.id: off for b, off in zip(self.buffers, self.offsets)}

    @property
    def gap(self) -> float:
        """(height - lower_bound) / lower_bound; 0 when the bound is 0."""
        return (self.height - self.lower_bound) / self.lower_bound if self.lower_bound else 0.0

    def validation_error(self) -> Optional[str]:
        """None when valid, else a sentence naming two conflicting buffers."""
        sized = [dataclasses.replace(b, size=-(-b.size // self.alignment) * self.alignment) for b in self.buffers]
        for b, off in zip(self.buffers, self.offsets):
            if off % self.alignment:
                return f"buffer {b.id!r} at offset {off} is not aligned to {self.alignment}"
        if has_streams(sized):
            ok, first, second, message = _planner.validate_streams(*_columns(sized), *schedule_columns(sized),
                                                                  list(self.offsets))
        else:
            ok, first, second, message = _planner.validate(*_columns(sized), list(self.offsets))
        if ok:
            return None
        if first >= 0 and second >= 0:
            a, b = self.buffers[first], self.buffers[second]
            return f"buffers {a.id!r} and {b.id!r} overlap in time and space ({message})"
        return message

    def validate(self) -> bool:
        """True when no two buffers that overlap in time overlap in space."""
        return self.validation_error() is None


def lower_bound(buffers: Iterable[Any]) -> int:
    """The most bytes live at one instant; with streams, the most bytes of
    buffers pairwise live at once (a read in flight on another stream keeps
    its buffer live until no allocating stream can still miss it)."""
    bs = as_buffers(buffers)
    if not bs:
        return 0
    lower, upper, size = _columns(bs)
    if has_streams(bs):
        _, _, upper, _ = _planner.stream_lifetimes(lower, upper, size, *schedule_columns(bs))
    return int(_planner.lower_bound(lower, upper, size))


def solve(
    buffers: Iterable[Any],
    method: str = "auto",
    time_limit: Optional[float] = None,
    alignment: int = 1,
    progress: Optional[ProgressFn] = None,
    sharing: str = "auto",
) -> Plan:
    """Places every buffer at an offset; see torchmem/plan/__init__.py.

    method: one of METHODS. ``auto`` runs the portfolio of fast methods, then
    the exact search when the instance is small enough, until optimal or
    ``time_limit`` seconds (default 10). ``alignment``: every offset and
    size is rounded up to a multiple of it. ``progress(seconds, height,
    lower_bound, phase)`` is called on every improvement.
    ``sharing`` (buffers on several streams only): "shared" (one slab, a
    buffer kept until every allocating stream has synchronised after its
    last use), "per_stream" (a region per stream, a buffer kept until the
    synchronisation back to its own stream after its last read) or "auto"
    (both, the lower).
    Raises ValueError for bad buffers, an unknown method or sharing, a time
    limit <= 0, an alignment < 1, and for streams: a read that no
    synchronisation orders after its producer, a read with no
    synchronisation back to the producer's stream, a bad sync.
    """
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")
    if sharing not in SHARINGS:
        raise ValueError(f"unknown sharing {sharing!r}; choose from {', '.join(SHARINGS)}")
    if time_limit is None:
        time_limit = DEFAULT_TIME_LIMIT
    if isinstance(time_limit, bool) or not isinstance(time_limit, (int, float)) or not time_limit > 0:
        raise ValueError(f"time limit must be a number > 0, got {time_limit!r}")
    if isinstance(alignment, bool) or not isinstance(alignment, int) or alignment < 1:
        raise ValueError(f"alignment must be an integer >= 1, got {alignment!r}")
    bs = as_buffers(buffers)
    if not bs:
        return Plan([], [], 0, 0, method, True, 0.0, alignment)
    total = sum(-(-b.size // alignment) * alignment for b in bs)
    if total >= 2**62:
        raise ValueError(f"the sizes add up to {total} bytes, more than the planner's 2**62 limit")
    if has_streams(bs):
        r = _planner.solve_streams(*_columns(bs), *schedule_columns(bs), method, float(time_limit), alignment,
                                  sharing, progress)
    else:
        r = _planner.solve(*_columns(bs), method, float(time_limit), alignment, progress)
    return Plan(bs, list(r["offsets"]), r["height"], r["lower_bound"], r["method"], r["optimal"], r["seconds"],
                alignment, r["nodes"], r.get("sharing", ""))
