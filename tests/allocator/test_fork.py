"""Fork safety (issue 17, Note [Fork safety] in csrc/core/sync/fork_safety.h): a
child forked while other threads allocate never hangs on torchmem's locks, and
finds its allocators consistent.

Every test forks inside a fresh interpreter run with a hard timeout, and every
child there is waited for with a timeout of its own and killed when it runs
past it (tests/support/fork_experiment.py's wait_or_kill), so a hang fails fast. The
C++ side (fork from a thread while others allocate, also under TSan, and a
control fork that skips the handlers and hangs) is in tests/cpp/core_driver.cpp
(fork_while_threads_allocate, fork_waits_for_a_held_lock).
"""
import json
import os
import sys

import pytest
import torch

from tests.support.subprocess_runner import ROOT, last_json, run_args
from tests.support.subprocess_runner import run_ok as run_python_ok

EXPERIMENT = os.path.join(ROOT, "tests", "support", "fork_experiment.py")


def experiment(*args: str, timeout: int = 600) -> dict:
    return last_json(run_args([EXPERIMENT, *args], timeout=timeout))


def run_ok(code: str, timeout: int = 300) -> str:
    """`code` in a child that imports the tests' helpers (tests.support.fork_experiment: the checkout is
    first on its PYTHONPATH)."""
    return run_python_ok(code, timeout=timeout)


def test_the_hang_detector_kills_a_child_that_does_not_finish():
    """The harness can fail: a child that never finishes is reported as hung
    (and killed) after its timeout, one that fails as failed."""
    out = run_ok(
        """
        import json, os, time
        from tests.support.fork_experiment import wait_or_kill
        r = {}
        for name, body in (("sleeper", lambda: time.sleep(60)), ("failing", lambda: os._exit(3)),
                           ("fine", lambda: os._exit(0))):
            pid = os.fork()
            if pid == 0:
                body()
                os._exit(0)
            start = time.monotonic()
            r[name] = wait_or_kill(pid, 1.0)
            r[name + "_s"] = time.monotonic() - start
        print(json.dumps(r))
        """,
        timeout=60,
    )
    r = json.loads(out.strip().splitlines()[-1])
    assert (r["sleeper"], r["failing"], r["fine"]) == ("hung", "failed", "ok")
    assert 1.0 <= r["sleeper_s"] < 5.0


def test_200_forks_while_two_threads_hammer_the_allocator_in_cpp():
    """The experiment with the sharpest race: two threads run cached
    malloc/free pairs in C++ with the GIL released, so the allocator's lock is
    held most of the time. Before the fork handlers, 54 of 200 children hung."""
    r = experiment("--forks", "200", "--child-timeout", "5", "--native-churn")
    assert r["hung"] == 0 and r["failed"] == 0, r


@pytest.mark.slow
def test_200_forks_while_two_threads_make_tensors():
    """Issue 17's experiment as a new user would run it: torch.set_num_threads(1),
    two threads making CPU tensors, 200 children that each allocate two
    tensors (children that hung before the fix: 0 to 3 of 200 per run here)."""
    r = experiment("--forks", "200", "--child-timeout", "5")
    assert r["hung"] == 0 and r["failed"] == 0, r


def test_dataloader_fork_workers_with_a_background_thread():
    out = run_ok(
        """
        import json, threading, torch, torchmem
        from torch.utils.data import DataLoader, Dataset
        torch.set_num_threads(1)
        torchmem.install()

        class Squares(Dataset):
            def __len__(self):
                return 64
            def __getitem__(self, i):
                x = torch.full((1000 + 37 * i,), float(i))   # allocated in the worker, by torchmem
                y = torch.ones(3 << 18)                        # a large-pool block too
                return (x * x).sum() + (y.sum() - y.numel())

        stop = threading.Event()
        def churn():
            n = 0
            while not stop.is_set():
                a = torch.empty(1000 + n % 5000)
                b = torch.ones(300_000 + n % 7)
                del a, b
                n += 1
        thread = threading.Thread(target=churn, daemon=True)
        thread.start()
        loader = DataLoader(Squares(), batch_size=8, num_workers=2, multiprocessing_context="fork", timeout=60)
        totals = [float(sum(batch.sum() for batch in loader)) for epoch in range(4)]  # 2 new workers each epoch
        stop.set()
        thread.join()
        torchmem.caching_allocator().check_invariants()
        print(json.dumps({"totals": totals, "allocated": torchmem.memory_allocated()}))
        """,
        timeout=300,
    )
    r = json.loads(out.strip().splitlines()[-1])
    expected = float(sum((1000 + 37 * i) * i * i for i in range(64)))
    assert r["totals"] == [expected] * 4


CHILD_FREES_PARENTS_TENSORS = """
    import json, os, sys, threading, time, torch, torchmem
    from torchmem import _C
    from tests.support.fork_experiment import wait_or_kill
    torch.set_num_threads(1)

    torchmem.install(conf="max_split_size_mb:64")
    old_install = torch.ones(1 << 16)                      # made by an install that is retired below
    torchmem.install()                                     # a new caching allocator for what follows
    torchmem.record_memory_history(max_entries=4096)       # Python stacks: the context provider runs on every allocation
    kept = [torch.ones(1024), torch.ones(1 << 20), torch.ones(10 << 20)]  # 4 KiB, 4 MiB, 40 MiB
    scratch = torchmem.Arena(8 << 20, fallback="caching")
    with torchmem.arena(scratch):
        escaped = torch.ones(4096)                         # routed into the arena, outlives its block
    for step in range(4):                                  # warm-up, recorded, then planned steps
        with torchmem.planned(key="main") as report:
            planned_out = torch.ones(1 << 16) * 2          # escapes the last, planned, step
    assert report.phase == "planned" and report.hits > 0, report

    stop = threading.Event()
    def churn(seed):
        n = seed
        while not stop.is_set():
            a = torch.empty(1000 + n % 5000)
            b = torch.ones(300_000 + n % 7)
            del a, b
            n += 1
    def planned_steps():                                   # another thread in and out of planned steps
        while not stop.is_set():
            with torchmem.planned(key="bg", device="cpu"):
                x = torch.ones(50_000) + 1
                del x
    threads = [threading.Thread(target=churn, args=(i,), daemon=True) for i in range(2)]
    threads.append(threading.Thread(target=planned_steps, daemon=True))
    for t in threads:
        t.start()

    def child():
        caching = torchmem.caching_allocator()
        allocated = torchmem.memory_allocated()
        kept_bytes = sum(t.numel() * 4 for t in kept)
        kept.clear()                                       # the parent's blocks, freed by the child
        assert torchmem.memory_allocated() == allocated - kept_bytes, (allocated, torchmem.memory_allocated())
        live_in_arena = scratch.live_allocations
        global escaped, old_install, planned_out
        del escaped                                        # the arena's, through the routed allocators
        assert scratch.live_allocations == live_in_arena - 1
        del old_install                                    # the retired allocator's
        del planned_out                                    # the planned slab's
        for step in range(3):                              # planned() works in the child (its region is
            with torchmem.planned(key="child"):            # a block of the caching allocator: before the count)
                y = torch.ones(1 << 12) + 1
                assert float(y.sum()) == 2.0 * (1 << 12)
                del y
        before_mine = torchmem.memory_allocated()
        mine = [torch.arange(n, dtype=torch.float64) for n in (100, 70_000, 3 << 20)]
        assert [float(t.sum()) for t in mine] == [n * (n - 1) / 2 for n in (100, 70_000, 3 << 20)]
        with torchmem.arena(scratch):
            tmp = torch.ones(1000) * 3
            assert float(tmp.sum()) == 3000.0
            del tmp
        del mine
        assert torchmem.memory_allocated() == before_mine, (before_mine, torchmem.memory_allocated())
        caching.check_invariants()
        stats = torchmem.memory_stats()
        assert stats["allocated_bytes.all.current"] == torchmem.memory_allocated()
        assert stats["active_bytes.all.current"] >= stats["allocated_bytes.all.current"]

    outcomes = {"ok": 0, "failed": 0, "hung": 0}
    for i in range(20):
        time.sleep(0.005)
        pid = os.fork()
        if pid == 0:
            try:
                child()
                code = 0
            except BaseException as e:
                print("child:", repr(e), file=sys.stderr, flush=True)
                code = 1
            os._exit(code)
        outcomes[wait_or_kill(pid, 20.0)] += 1
    stop.set()
    for t in threads:
        t.join()
    torchmem.caching_allocator().check_invariants()
    print(json.dumps(outcomes))
"""


def test_a_child_frees_its_parents_tensors_allocates_and_checks_invariants():
    """Children forked while threads allocate and run planned steps free the
    parent's tensors (current install, a retired install, an arena through the
    thread-allocator routing, a planned slab), allocate their own (also in an
    arena and in planned steps), and find the statistics and invariants whole."""
    out = run_ok(CHILD_FREES_PARENTS_TENSORS, timeout=300)
    assert json.loads(out.strip().splitlines()[-1]) == {"ok": 20, "failed": 0, "hung": 0}


def test_a_planned_step_of_another_thread_is_closed_in_the_child():
    """A thread is inside a planned step when another forks: the child has no
    such thread, so the step is closed there and the child runs planned steps
    of its own (before: "planned() blocks do not nest")."""
    out = run_ok(
        """
        import json, os, sys, threading, torch, torchmem
        from tests.support.fork_experiment import wait_or_kill
        torchmem.install()
        inside, leave = threading.Event(), threading.Event()
        def steps_on_another_thread():
            for i in range(4):                                 # warm-up, recorded, planned, planned
                with torchmem.planned(key="bg"):
                    x = torch.ones(1 << 14) + 1
                    if i == 3:
                        inside.set()
                        leave.wait()                           # the step stays open across the fork
                    del x
        thread = threading.Thread(target=steps_on_another_thread, daemon=True)
        thread.start()
        inside.wait()
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                assert not sys.modules["torchmem.runtime.planned"].in_planned_step(), "the other thread's step is open"
                for i in range(3):
                    with torchmem.planned(key="child") as report:
                        y = torch.ones(1 << 12) * 2
                        assert float(y.sum()) == 2.0 * (1 << 12)
                        del y
                assert report.phase == "planned", report
                torchmem.caching_allocator().check_invariants()
            except BaseException as e:
                print("child:", repr(e), file=sys.stderr, flush=True)
                code = 1
            os._exit(code)
        outcome = wait_or_kill(pid, 30.0)
        assert sys.modules["torchmem.runtime.planned"].in_planned_step()  # the parent's step is untouched
        leave.set()
        thread.join()
        print(json.dumps({"child": outcome}))
        """,
        timeout=120,
    )
    assert json.loads(out.strip().splitlines()[-1]) == {"child": "ok"}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: the CUDA rule after fork")
def test_a_child_of_a_cuda_parent_uses_cpu_tensors_and_drops_inherited_cuda_frees():
    """CUDA cannot be used in a child forked after its parent used CUDA
    (PyTorch's rule); the child still works on the CPU, and freeing the
    parent's CUDA tensors there is a no-op, not a hang or a crash."""
    out = run_ok(
        """
        import json, os, sys, threading, torch, torchmem
        from tests.support.fork_experiment import wait_or_kill
        torchmem.install()
        inherited = [torch.ones(1 << 20, device="cuda") for _ in range(4)]
        stop = threading.Event()
        def churn():
            while not stop.is_set():
                x = torch.empty(1 << 18, device="cuda")
                del x
        thread = threading.Thread(target=churn, daemon=True)
        thread.start()
        outcomes = {"ok": 0, "failed": 0, "hung": 0}
        for i in range(10):
            pid = os.fork()
            if pid == 0:
                code = 0
                try:
                    inherited.clear()                      # frees of the parent's CUDA memory: dropped
                    assert float(torch.ones(1000).sum()) == 1000.0
                    try:
                        torch.ones(10, device="cuda")
                        code = 3                           # CUDA must refuse in the child
                    except RuntimeError:
                        pass
                except BaseException as e:
                    print("child:", repr(e), file=sys.stderr, flush=True)
                    code = 1
                os._exit(code)
            outcomes[wait_or_kill(pid, 30.0)] += 1
        stop.set()
        thread.join()
        torchmem.runtime.cuda.caching_allocator(0).check_invariants()
        print(json.dumps(outcomes))
        """,
        timeout=300,
    )
    assert json.loads(out.strip().splitlines()[-1]) == {"ok": 10, "failed": 0, "hung": 0}
