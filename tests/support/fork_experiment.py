"""The fork experiment of issue 17: does a forked child hang on the CPU allocator?

    python tests/support/fork_experiment.py [--forks 200] [--child-timeout 5] [--allocator torchmem|default]

With torch.set_num_threads(1) (so OpenMP plays no part), two threads allocate
and free CPU tensors in a loop while the main thread forks `--forks` children
one after another. Each child allocates two tensors (a small-pool and a
large-pool size), frees them and exits. A child still running after
`--child-timeout` seconds is counted as hung and killed. The last line printed
is JSON: {"allocator", "forks", "hung", "failed", "seconds"}.

Run it in a subprocess with a hard timeout of its own: it forks a
multi-threaded process on purpose.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import threading
import time

import torch

SIZES = (1_000, 60_000, 300_000, 3_000_000)  # floats: 4 KB (small pool) to 12 MB (large pool)


def churn_native(stop: threading.Event) -> None:
    """Cached malloc/free pairs in C++ with the GIL released: the allocator's
    lock is held most of the time (torchmem only)."""
    from torchmem import _C, _core
    allocator = _C.cpu_caching_allocator()
    while not stop.is_set():
        _core.time_malloc_free(allocator, 4096, 2000)


def churn(stop: threading.Event) -> None:
    i = 0
    while not stop.is_set():
        a = torch.empty(SIZES[i % len(SIZES)])
        b = torch.ones(SIZES[(i + 1) % len(SIZES)])
        del a, b
        i += 1


def child() -> None:
    code = 0
    try:
        x = torch.ones(1_000)
        y = torch.ones(3_000_000)
        if float(x.sum()) != 1_000.0 or float(y[-1]) != 1.0:
            code = 3
        del x, y
    except BaseException:  # noqa: BLE001 - any failure is reported by the exit status
        code = 2
    os._exit(code)


def wait_or_kill(pid: int, timeout: float) -> str:
    """'ok', 'failed' or 'hung' (killed after `timeout` seconds)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return "ok" if os.waitstatus_to_exitcode(status) == 0 else "failed"
        time.sleep(0.001)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return "hung"


def run(forks: int, child_timeout: float, allocator: str, threads: int, native: bool = False) -> dict:
    torch.set_num_threads(1)
    if allocator == "torchmem":
        import torchmem

        torchmem.install()
    stop = threading.Event()
    target = churn_native if native else churn
    workers = [threading.Thread(target=target, args=(stop,), daemon=True) for _ in range(threads)]
    for w in workers:
        w.start()
    outcome = {"ok": 0, "failed": 0, "hung": 0}
    start = time.monotonic()
    try:
        for _ in range(forks):
            time.sleep(0.002)  # let the threads get back into the allocator
            pid = os.fork()
            if pid == 0:
                child()
            outcome[wait_or_kill(pid, child_timeout)] += 1
    finally:
        stop.set()
        for w in workers:
            w.join()
    return {"allocator": allocator, "forks": forks, "hung": outcome["hung"], "failed": outcome["failed"],
            "seconds": round(time.monotonic() - start, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--forks", type=int, default=200)
    parser.add_argument("--child-timeout", type=float, default=5.0)
    parser.add_argument("--allocator", choices=("torchmem", "default"), default="torchmem")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--native-churn", action="store_true",
                        help="the threads run cached malloc/free pairs in C++ instead of making tensors (torchmem only)")
    args = parser.parse_args()
    if args.native_churn and args.allocator != "torchmem":
        parser.error("--native-churn needs --allocator torchmem")
    result = run(args.forks, args.child_timeout, args.allocator, args.threads, args.native_churn)
    if args.native_churn:
        result["churn"] = "native"
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
