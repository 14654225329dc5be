"""torchmem.Arena (the C++ arena from Python) and the torchmem.arena() block."""
import gc
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from torchmem import _C
from torchmem.arena import Arena, ArenaEscapeError, arena


def test_bump_alignment_used_peak_reset():
    a = Arena(1 << 20)
    assert (a.capacity, a.used, a.peak, a.device) == (1 << 20, 0, 0, "cpu")
    p1 = a.allocate(100)
    p2 = a.allocate(1)
    assert p1 % 64 == 0 and p2 - p1 == 128 and a.used == 129
    p3 = a.allocate(10, alignment=4096)
    assert p3 % 4096 == 0
    assert a.allocate(0) == 0
    assert a.live_allocations == 3
    a.deallocate(p2)  # frees nothing
    assert a.used == p3 - p1 + 10 and a.live_allocations == 2
    with pytest.raises(ValueError, match="not a live allocation"):
        a.deallocate(p2)
    with pytest.raises(ArenaEscapeError, match="2 allocations are still alive"):
        a.reset()
    a.deallocate(p1)
    a.deallocate(p3)
    used = a.used
    a.reset()
    assert a.used == 0 and a.peak == used
    assert a.allocate(8) == p1  # the same memory again
    a.reset_peak()
    assert a.peak == 8
    a.handle.check_invariants()


def test_out_of_memory_is_clear():
    a = Arena(4096)
    a.allocate(4000)
    with pytest.raises(torch.OutOfMemoryError, match="Arena out of memory: tried to allocate 200 bytes"):
        a.allocate(200)
    assert a.used == 4000


def test_sim_device_arena_counts_without_memory():
    dev = _C.SimDevice(1 << 30)
    a = Arena(1 << 30, dev)
    assert a.device == "sim" and dev.free_bytes == 0
    p = a.allocate(123 << 20)
    assert a.owns(p) and a.used == 123 << 20
    with pytest.raises(torch.OutOfMemoryError):
        Arena(1, dev)  # the device is full
    with pytest.raises(RuntimeError, match="only a host"):
        a.empty(4)
    del a
    gc.collect()
    assert dev.free_bytes == 1 << 30  # the region went back


def test_fallback_to_caching_allocator_is_counted():
    caching = _C.CachingAllocator(_C.HostDevice(0))
    a = Arena(4096, fallback=caching)
    a.allocate(4000)
    p = a.allocate(10000)  # does not fit: served by the caching allocator
    assert a.owns(p) and caching.owns(p)
    s = a.stats()
    assert (s["fallback_allocations"], s["fallback_bytes"], s["fallback_live"]) == (1, 10000, 1)
    a.deallocate(p)
    assert not caching.owns(p) and a.stats()["fallback_live"] == 0


def test_standalone_tensors_and_escapes():
    a = Arena(1 << 20)
    t = a.empty(256, dtype=torch.float32)
    t.fill_(3.0)
    assert a.owns(t.data_ptr()) and a.live_allocations == 1
    del t
    gc.collect()
    assert a.live_allocations == 0

    with a.scope(route=False):
        kept = a.empty(16, dtype=torch.float64)
        kept.fill_(7.0)
        scratch = a.empty(1000)
        del scratch
    assert a.escaped == 1 and a.stats()["reset_pending"]
    used = a.used
    with a.scope(route=False):  # the next step bumps past the escaped tensor
        other = a.empty(16, dtype=torch.float64)
        other.fill_(-1.0)
        assert other.data_ptr() > kept.data_ptr()
        del other
    assert torch.equal(kept, torch.full((16,), 7.0, dtype=torch.float64))  # never overwritten
    assert a.used > used
    view = kept[4:]
    del kept
    gc.collect()
    assert a.live_allocations == 1  # a view keeps the storage alive
    del view
    gc.collect()
    assert a.live_allocations == 0 and a.used == 0  # the deferred reset happened
    assert not a.stats()["reset_pending"]


def test_escape_policy_raise():
    a = Arena(1 << 16)
    with pytest.raises(ArenaEscapeError, match="1 allocations"):
        with a.scope(route=False, on_escape="raise"):
            t = a.empty(8)
    assert a.live_allocations == 1 and a.used > 0  # memory kept valid
    del t
    gc.collect()
    assert a.used == 0
    # An exception inside the block is not masked by the escape error.
    with pytest.raises(KeyError):
        with a.scope(route=False, on_escape="raise"):
            u = a.empty(8)  # noqa: F841
            raise KeyError("inner")
    with pytest.raises(ValueError, match="on_escape"):
        with a.scope(route=False, on_escape="ignore"):
            pass


# --------------------------------------------------------- routed blocks
# torchmem.arena() routes this thread's torch CPU allocations into the arena
# through the CPU install's thread allocator hook. Each case runs in a
# subprocess: installing torchmem as the CPU allocator is process-wide.

HOOK = hasattr(_C, "push_thread_allocator") and hasattr(_C, "cpu_install")


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_python(code):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=120, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@pytest.mark.skipif(not HOOK, reason="torchmem._C has no push_thread_allocator (CPU install hook) in this build")
def test_arena_blocks_route_keep_escapes_and_overflow():
    # One interpreter for the three scenarios (each start imports torch).
    out = run_python(
        """
        import gc, threading, torch, torchmem
        from torchmem.arena import arena, Arena
        torchmem.install()

        # 1. Allocations inside the block come from the arena; it resets at exit.
        a = Arena(64 << 20)
        for step in range(3):
            with arena(a):
                x = torch.randn(256, 256)
                y = torch.nn.functional.gelu(x @ x)  # oneDNN's raw allocations too
                s = float(y.sum())
                assert a.owns(y.data_ptr()), "tensor not from the arena"
                del x, y
            assert a.used == 0 and a.live_allocations == 0, a.stats()
        z = torch.ones(10)
        assert not a.owns(z.data_ptr())  # outside the block: the caching allocator
        print("peak", a.peak)

        # 2. A tensor that escapes stays valid; the arena resets when it dies,
        #    even when it dies on another thread.
        a = Arena(16 << 20)
        with arena(a):
            out = torch.full((1000,), 5.0)
        assert a.escaped == 1 and a.live_allocations == 1
        with arena(a):
            other = torch.full((1000,), -1.0)
            assert other.data_ptr() != out.data_ptr()
            del other
        assert torch.equal(out, torch.full((1000,), 5.0))
        holder = [out]
        del out
        t = threading.Thread(target=holder.clear)
        t.start(); t.join()
        gc.collect()
        assert a.used == 0 and a.live_allocations == 0, a.stats()

        # 3. Overflow: OutOfMemoryError naming the arena, or the caching fallback.
        try:
            with arena(1 << 20):
                torch.empty(4 << 20, dtype=torch.uint8)
        except torch.OutOfMemoryError as e:
            assert "Arena out of memory" in str(e), e
        else:
            raise AssertionError("no OutOfMemoryError")
        with arena(1 << 20, fallback="caching") as a:
            t = torch.empty(4 << 20, dtype=torch.uint8)
            assert a.stats()["fallback_allocations"] == 1
            del t
        assert a.used == 0
        print("ok")
        """
    )
    assert "ok" in out


def test_arena_block_needs_install():
    if not HOOK:
        pytest.skip("torchmem._C has no push_thread_allocator (CPU install hook) in this build")
    if _C.cpu_installed():
        pytest.skip("torchmem is installed in this process")
    with pytest.raises(RuntimeError, match="torchmem.install"):
        with arena(1 << 20):
            pass
