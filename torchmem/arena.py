"""Per-step scratch memory: a bump-pointer arena (``torchmem._C.Arena``).

    with torchmem.arena(256 << 20) as a:      # this thread's CPU tensors come from the arena
        out = model(x)                         # frees inside the block are no-ops
        loss = out.sum().item()
    print(a.peak)                              # bytes the step needed

An arena takes one region from its device when it is created. An allocation
bumps an offset (rounded to 64 bytes, or to the alignment asked); freeing one
tensor releases nothing; leaving the block resets the arena, so the next step
reuses the same memory with no allocator search and no page faults.

Escapes. A tensor allocated in the block and still alive when the block ends
(``out`` above) must never see its memory handed to someone else. torchmem
counts the arena's live allocations, and on exit:

* ``on_escape="keep"`` (default): the arena is not reset while anything is
  live; it resets itself when the last escaped tensor is freed (whatever the
  thread). Until then the memory stays valid and a new block on the same arena
  carries on bumping after it. ``a.escaped`` tells how many were alive at exit.
* ``on_escape="raise"``: the same, then ``ArenaEscapeError`` is raised (unless
  the block is already leaving with an exception), for code that wants
  escapes to be bugs.

Beyond capacity an allocation raises ``torch.OutOfMemoryError`` with the
arena's figures, or, with ``fallback="caching"``, is served by torchmem's
caching allocator and counted in ``stats()["fallback_allocations"]``.

Routing a thread's torch allocations needs torchmem's CPU allocator
(``torchmem.install()``). Without routing, ``Arena.empty()`` hands out
tensors from the arena directly (host memory only).
"""
from __future__ import annotations

import contextlib
import ctypes
import math
import weakref
from typing import Iterator

import torch

from torchmem import _C

__all__ = ["Arena", "ArenaEscapeError", "arena"]

_ESCAPE_POLICIES = ("keep", "raise")


class ArenaEscapeError(RuntimeError):
    """Allocations from an arena were still alive when its block ended."""


def _make_device(device, capacity: int):
    if device is None or isinstance(device, (str, torch.device)):
        name = "cpu" if device is None else str(device)
        if name == "cpu":
            return _C.HostDevice(0)
        if name == "sim":
            return _C.SimDevice(capacity)
        raise ValueError(f"torchmem.Arena: device must be 'cpu', 'sim' or a torchmem device, got {device!r}")
    if isinstance(device, _C.Device):
        return device
    raise TypeError(f"torchmem.Arena: unsupported device {device!r}")


def _make_fallback(fallback):
    if fallback is None or isinstance(fallback, _C.Allocator):
        return fallback
    if fallback == "caching":
        caching = _C.cpu_caching_allocator()
        if caching is None:
            raise RuntimeError("torchmem.Arena: fallback='caching' needs torchmem.install() first")
        return caching
    raise ValueError(f"torchmem.Arena: fallback must be None, 'caching' or a torchmem allocator, got {fallback!r}")


class Arena:
    """A bump allocator over one region of `capacity` bytes.

    Args:
        capacity: bytes taken from the device at creation.
        device: None or "cpu" (host memory), "sim" (a simulated device: addresses
            only, for tests and planning), or a ``torchmem._C`` device.
        alignment: default alignment of allocations (a power of two >= 64).
        fallback: None (a full arena raises), "caching" (torchmem's CPU caching
            allocator serves what does not fit), or a ``torchmem._C.Allocator``.
    """

    def __init__(self, capacity: int, device=None, *, alignment: int = 64, fallback=None):
        capacity = int(capacity)
        self._device = _make_device(device, capacity)
        self._impl = _C.Arena(self._device, capacity, alignment, _make_fallback(fallback))
        self.escaped = 0  # live allocations when the last block ended
        self._scopes: list = []

    # figures
    @property
    def capacity(self) -> int:
        return self._impl.capacity

    @property
    def used(self) -> int:
        """Bytes handed out since the last reset, alignment padding included."""
        return self._impl.used

    @property
    def peak(self) -> int:
        return self._impl.peak

    @property
    def live_allocations(self) -> int:
        return self._impl.live_allocations

    @property
    def device(self) -> str:
        return self._impl.device

    @property
    def handle(self) -> "_C.Arena":
        """The C++ arena (a ``torchmem._C.Allocator``)."""
        return self._impl

    def stats(self) -> dict:
        return self._impl.stats()

    def reset(self) -> None:
        """Releases everything now. Raises ArenaEscapeError (and changes
        nothing) while allocations are live; see reset_when_unused()."""
        if self._impl.live_allocations:
            raise ArenaEscapeError(
                f"torchmem.Arena.reset: {self._impl.live_allocations} allocations are still alive; "
                "free them first or use reset_when_unused()"
            )
        self._impl.reset()

    def reset_when_unused(self) -> bool:
        """Resets now if nothing is live (True), else as soon as the last live
        allocation is freed (False)."""
        return self._impl.reset_when_unused()

    def reset_peak(self) -> None:
        self._impl.reset_peak()

    # standalone use
    def allocate(self, size: int, alignment: int = 0) -> int:
        """Raw allocation: an address (an int). 0 for size 0."""
        return self._impl.allocate(size, alignment)

    def deallocate(self, ptr: int) -> None:
        self._impl.deallocate(ptr)

    def owns(self, ptr: int) -> bool:
        return self._impl.owns(ptr)

    def empty(self, *shape, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """A CPU tensor whose storage comes from the arena, without routing
        torch's allocator. The allocation is live until the tensor (and every
        view of it) is gone."""
        if len(shape) == 1 and isinstance(shape[0], (tuple, list, torch.Size)):
            shape = tuple(shape[0])
        if self._impl.device != "cpu":
            raise RuntimeError("torchmem.Arena.empty: only a host ('cpu') arena backs tensors")
        nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        if nbytes == 0:
            return torch.empty(shape, dtype=dtype)
        addr = self._impl.allocate(nbytes, 0)
        buffer = (ctypes.c_byte * nbytes).from_address(addr)
        weakref.finalize(buffer, self._impl.deallocate, addr)
        return torch.frombuffer(buffer, dtype=dtype).view(shape)

    # blocks
    @contextlib.contextmanager
    def scope(self, *, route: bool = True, on_escape: str = "keep") -> Iterator["Arena"]:
        """A block: with route=True this thread's CPU tensors come from the
        arena; on exit the arena resets (at once, or when escaped allocations
        die, see the module docs)."""
        if on_escape not in _ESCAPE_POLICIES:
            raise ValueError(f"on_escape must be one of {_ESCAPE_POLICIES}, got {on_escape!r}")
        if route:
            _push(self)
        failed = False
        try:
            yield self
        except BaseException:
            failed = True
            raise
        finally:
            if route:
                _C.pop_thread_allocator()
            live = self._impl.live_allocations
            self.escaped = live
            self._impl.reset_when_unused()
            if live and on_escape == "raise" and not failed:
                raise ArenaEscapeError(
                    f"torchmem.arena: {live} allocations ({self._impl.stats()['live_bytes']} bytes) are still "
                    "alive at the end of the block; the arena keeps their memory until they are freed"
                )

    def __enter__(self) -> "Arena":
        """``with a:`` is ``with a.scope():`` (routed, on_escape="keep")."""
        scope = self.scope()
        result = scope.__enter__()
        self._scopes.append(scope)
        return result

    def __exit__(self, *exc) -> bool | None:
        return self._scopes.pop().__exit__(*exc)

    def __repr__(self) -> str:
        return (f"torchmem.Arena(capacity={self.capacity}, device={self.device!r}, used={self.used}, "
                f"peak={self.peak}, live={self.live_allocations})")


def _push(a: Arena) -> None:
    push = getattr(_C, "push_thread_allocator", None)
    if push is None:
        raise RuntimeError("torchmem.arena: this build of torchmem has no thread allocator hook")
    if a.device != "cpu":
        raise ValueError(f"torchmem.arena: routing torch allocations needs a 'cpu' arena, not {a.device!r}")
    if not _C.cpu_installed():
        raise RuntimeError("torchmem.arena routes allocations through torchmem's CPU allocator: "
                           "call torchmem.install() first")
    push(a.handle)


@contextlib.contextmanager
def arena(capacity: "int | Arena", device=None, *, on_escape: str = "keep", fallback=None) -> Iterator[Arena]:
    """``with torchmem.arena(capacity) as a:`` routes this thread's CPU
    allocations into an arena for the block and resets it at the end.

    Pass an existing ``Arena`` instead of a capacity to reuse its region
    across steps (no new region per step). See the module docs for tensors
    that outlive the block (``on_escape``).
    """
    if device is not None and str(device) != "cpu":
        raise NotImplementedError(f"torchmem.arena: device {device!r} is not supported yet (CPU only)")
    a = capacity if isinstance(capacity, Arena) else Arena(capacity, device, fallback=fallback)
    with a.scope(route=True, on_escape=on_escape):
        yield a


def conformance_factories() -> dict:
    """Arena configurations for the allocator conformance suite
    (tests/test_conformance.py): name -> factory() -> (allocator, host_backed)."""

    def sim():
        return _C.Arena(_C.SimDevice(64 << 30), 64 << 30), False

    def host_with_fallback():
        # A small region: most of the suite's requests overflow into the caching allocator.
        caching = _C.CachingAllocator(_C.HostDevice(0), "")
        return _C.Arena(_C.HostDevice(0), 64 << 20, 64, caching), True

    return {"arena-sim": sim, "arena-host-fallback": host_with_fallback}
