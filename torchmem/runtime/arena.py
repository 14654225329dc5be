"""Per-step scratch memory: a bump-pointer arena (``torchmem._core.Arena``).

    torchmem.install()
    scratch = torchmem.Arena(256 << 20)        # one region, taken once
    for batch in loader:
        with torchmem.arena(scratch):          # this thread's tensors come from the arena
            loss = model(batch).sum()
            loss.backward()
        print(scratch.last_block["peak"])      # bytes this step needed

An arena takes one region from its device when it is created. An allocation
bumps a cursor (rounded to 64 bytes, or to the alignment asked); each block
starts by rewinding the cursor to the region's start, so every step reuses the
same memory with no allocator search and no page faults.

Tensors that outlive their block (the loop's ``x`` and ``loss``, an output
kept for logging) keep their bytes: at the next block's start they become
holes the cursor skips, and their bytes return to use once they are freed.
A loop therefore holds one step plus what escaped, however long it runs. The
bytes of a live tensor are never handed out again, whichever thread frees it.

* ``on_escape="keep"`` (default): escapes are allowed; ``a.escaped`` and
  ``a.last_block`` say how many allocations (and bytes) were alive at the end
  of the last block.
* ``on_escape="raise"``: the same, then ``ArenaEscapeError`` is raised (unless
  the block is already leaving with an exception), for code that wants
  escapes to be bugs.

Beyond capacity an allocation raises ``torch.OutOfMemoryError`` with the
arena's figures, or, with ``fallback="caching"``, is served by torchmem's
caching allocator and counted in ``stats()["fallback_allocations"]``.

On CUDA (``device="cuda"``) the region is one block of torchmem's CUDA caching
allocator and serves one stream, the device's current stream when the arena
is created; allocations on other streams go to the caching allocator. The
autograd engine runs CUDA backward passes on its own threads, whose
allocations are not routed (routing is per thread).

Routing a thread's torch allocations needs torchmem installed
(``torchmem.install()``). Without routing, ``Arena.empty()`` hands out
tensors from a host arena directly.
"""
from __future__ import annotations

import contextlib
import ctypes
import math
import weakref
from typing import Iterator

import torch

from torchmem import _C, _core

from torchmem.runtime import cuda as tmcuda, devices

__all__ = ["Arena", "ArenaEscapeError", "arena"]

_ESCAPE_POLICIES = ("keep", "raise")

# Arena.last_block's keys, from the core's stats() keys.
_BLOCK_KEYS = {
    "peak": "block_peak",
    "allocations": "block_allocations",
    "holes": "block_holes",
    "hole_bytes": "block_hole_bytes",
    "holes_skipped": "block_holes_skipped",
    "fallback_allocations": "block_fallback_allocations",
    "fallback_bytes": "block_fallback_bytes",
    "escaped": "live_allocations",
    "escaped_bytes": "live_bytes",
}


class ArenaEscapeError(RuntimeError):
    """Allocations from an arena were still alive when its block ended."""


def _on_cuda(device) -> bool:
    """Whether the arena's region comes from CUDA: a CUDA device, or None when torchmem is installed on CUDA
    (torchmem.runtime.devices' rule)."""
    return devices.is_cuda(device) or (device is None and devices.cuda_installed())


def _make_device(device, capacity: int):
    if isinstance(device, _core.Device):
        return device
    if device == "sim":
        return _core.SimDevice(capacity)
    if device is not None and not isinstance(device, (str, torch.device)):
        raise TypeError(f"torchmem.Arena: unsupported device {device!r}")
    try:
        name = devices.device_name(device)
    except ValueError:
        name = ""
    if name != "cpu":
        raise ValueError(f"torchmem.Arena: device must be 'cpu', 'cuda', 'cuda:N', 'sim' or a torchmem device, "
                         f"got {device!r}")
    return _core.HostDevice(0)


def _make_fallback(fallback, caching):
    """The allocator serving requests beyond the region; `caching` is the device's caching allocator."""
    if fallback is None or isinstance(fallback, _core.Allocator):
        return fallback
    if fallback == "caching":
        if caching is None:
            raise RuntimeError("torchmem.Arena: fallback='caching' needs torchmem.install() first")
        return caching
    raise ValueError(f"torchmem.Arena: fallback must be None, 'caching' or a torchmem allocator, got {fallback!r}")


def _cuda_arena(device, capacity: int, alignment: int, fallback) -> "tuple[int, _core.Arena]":
    tmcuda._require_glue()  # CUDANotBuiltError without the CUDA part
    if not devices.cuda_installed():
        raise RuntimeError("torchmem.Arena(device='cuda') takes its region from torchmem's CUDA allocator: "
                           "call torchmem.install() before CUDA initialises")
    index = tmcuda._index(device)
    caching = tmcuda.caching_allocator(index)
    stream = torch.cuda.current_stream(index).cuda_stream
    return index, _core.Arena.over(caching, capacity, alignment, _make_fallback(fallback, caching), stream, caching)


class Arena:
    """A bump allocator over one region of `capacity` bytes.

    Args:
        capacity: bytes taken from the device at creation.
        device: "cpu" (host memory); "cuda", "cuda:N" or an index N (one
            block of torchmem's CUDA caching allocator, serving the current
            stream); None: the device torchmem is installed on (CUDA's
            current device when it is installed on CUDA, else the CPU:
            torchmem.runtime.devices' rule);
            "sim" (a simulated device: addresses only, for tests and
            planning); or a ``torchmem._C`` device.
        alignment: default alignment of allocations (a power of two >= 64).
        fallback: None (a full arena raises), "caching" (torchmem's caching
            allocator of the device serves what does not fit), or a
            ``torchmem._core.Allocator``.
    """

    def __init__(self, capacity: int, device=None, *, alignment: int = 64, fallback=None):
        capacity = int(capacity)
        self._cuda_index = None
        if _on_cuda(device):
            self._cuda_index, self._impl = _cuda_arena(device, capacity, alignment, fallback)
        else:
            self._device = _make_device(device, capacity)
            caching = devices.caching_allocator("cpu") if isinstance(fallback, str) else None
            self._impl = _core.Arena(self._device, capacity, alignment, _make_fallback(fallback, caching))
        self.escaped = 0       # live allocations when the last block ended
        self.last_block: dict = {}
        self._scopes: list = []

    # figures
    @property
    def capacity(self) -> int:
        return self._impl.capacity

    @property
    def used(self) -> int:
        """Where the cursor is: bytes from the region's start to the newest allocation."""
        return self._impl.used

    @property
    def peak(self) -> int:
        """The most bytes of the region in use at once since creation (or reset_peak())."""
        return self._impl.peak

    @property
    def live_allocations(self) -> int:
        return self._impl.live_allocations

    @property
    def device(self) -> str:
        return self._impl.device

    @property
    def stream(self) -> int | None:
        """The stream the region serves (None: every stream, on host memory)."""
        return self._impl.stream

    @property
    def handle(self) -> "_core.Arena":
        """The C++ arena (a ``torchmem._core.Allocator``)."""
        return self._impl

    def stats(self) -> dict:
        """Overall figures (peak, holes, hole_bytes, holes_skipped, rewinds, fallback_*...)
        and the current block's (block_peak, block_holes_skipped, ...)."""
        return self._impl.stats()

    def rewind(self) -> int:
        """Starts a block: the cursor returns to the start; live allocations
        become holes it skips. Always safe. Returns the number of holes."""
        return self._impl.rewind()

    def reset(self) -> None:
        """Releases everything now. Raises ArenaEscapeError (and changes
        nothing) while allocations are live; see rewind()."""
        if self._impl.live_allocations:
            raise ArenaEscapeError(
                f"torchmem.Arena.reset: {self._impl.live_allocations} allocations are still alive; "
                "free them first, or use rewind(), which keeps them"
            )
        self._impl.reset()

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
        """A block: rewinds the arena, and with route=True this thread's
        tensors on the arena's device come from it until the block ends.
        ``last_block`` then reports it (see the module docs)."""
        if on_escape not in _ESCAPE_POLICIES:
            raise ValueError(f"on_escape must be one of {_ESCAPE_POLICIES}, got {on_escape!r}")
        if route:
            self._push()
        self._impl.rewind()
        failed = False
        try:
            yield self
        except BaseException:
            failed = True
            raise
        finally:
            if route:
                self._pop()
            stats = self._impl.stats()
            self.last_block = {key: stats[name] for key, name in _BLOCK_KEYS.items()}
            self.escaped = stats["live_allocations"]
            if self.escaped and on_escape == "raise" and not failed:
                raise ArenaEscapeError(
                    f"torchmem.arena: {self.escaped} allocations ({stats['live_bytes']} bytes) are still "
                    "alive at the end of the block; the arena keeps their memory until they are freed"
                )

    def _push(self) -> None:
        if self._cuda_index is not None:
            _C.cuda_push_thread_allocator(self._cuda_index, self._impl)
            return
        if self._impl.device != "cpu":
            raise ValueError(f"torchmem.arena: routing torch allocations needs a 'cpu' or 'cuda' arena, "
                             f"not {self._impl.device!r}")
        if not devices.cpu_installed():
            raise RuntimeError("torchmem.arena routes allocations through torchmem's CPU allocator: "
                               "call torchmem.install() first")
        _C.push_thread_allocator(self._impl)

    def _pop(self) -> None:
        if self._cuda_index is not None:
            _C.cuda_pop_thread_allocator(self._cuda_index)
        else:
            _C.pop_thread_allocator()

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


@contextlib.contextmanager
def arena(capacity: "int | Arena", device=None, *, on_escape: str = "keep", fallback=None) -> Iterator[Arena]:
    """``with torchmem.arena(capacity) as a:`` routes this thread's allocations
    on `device` (as in Arena: None is the device torchmem is installed on)
    into an arena for the block.

    Pass an existing ``Arena`` instead of a capacity to reuse its region
    across steps (the usual case; its device and fallback were chosen when it
    was made). See the module docs for tensors that outlive the block.
    """
    if isinstance(capacity, Arena):
        if device is not None or fallback is not None:
            raise ValueError("torchmem.arena: device and fallback belong to the Arena when one is passed")
        a = capacity
    else:
        a = Arena(capacity, device, fallback=fallback)
    with a.scope(route=True, on_escape=on_escape):
        yield a


def conformance_factories() -> dict:
    """Arena configurations for the allocator conformance suite
    (tests/allocator/test_conformance.py): name -> factory() -> (allocator, host_backed)."""

    def sim():
        return _core.Arena(_core.SimDevice(64 << 30), 64 << 30), False

    def host_with_fallback():
        # A small region: most of the suite's requests overflow into the caching allocator.
        caching = _core.CachingAllocator(_core.HostDevice(0), "")
        return _core.Arena(_core.HostDevice(0), 64 << 20, 64, caching), True

    def over_caching():
        # The CUDA arena's shape on host memory: the region is one block of a caching allocator.
        caching = _core.CachingAllocator(_core.HostDevice(0), "")
        return _core.Arena.over(caching, 64 << 20, 64, caching, 0, caching), True

    return {"arena-sim": sim, "arena-host-fallback": host_with_fallback, "arena-over-caching": over_caching}
