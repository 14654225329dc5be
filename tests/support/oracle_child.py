"""Runs oracle workloads under PyTorch's own allocator on the fake GPU.

    python -m torchmem.fakegpu -- python -m tests.support.oracle_child IN.json OUT_DIR
    python -m torchmem.fakegpu -- python -m tests.support.oracle_child --groups GROUPS.json

IN.json holds a list of workloads (tests.support.oracle.Workload as dicts)
that share one setting string, which the caller puts in
PYTORCH_CUDA_ALLOC_CONF (PyTorch reads it once). Each runs in turn in this
one process, from a clean allocator (everything freed, the cache emptied,
statistics reset, a fresh history, the setting's memory fraction), with
its own card size and memory fraction (set_per_process_memory_fraction, over
the setting's); its native snapshot is written to
OUT_DIR/<index>.pickle and what PyTorch reported to OUT_DIR/<index>.json.
Ops (lists): ["a", id, size, stream] allocate (an out-of-memory error is
caught and the run goes on); ["f", id] free; ["u", id,
stream] record_stream; ["h", stream] hold a stream's work; ["c", stream]
complete it; ["e"] empty_cache; ["o", size, stream] an allocation that may run
out of memory, caught; ["r"] start recording here (a run recorded mid-way);
["g", [sizes]] capture a CUDA graph that allocates these sizes (its private
pool lives while the graph does); ["m", [sizes]] allocate them inside
torch.cuda.use_mem_pool of a new torch.cuda.MemPool; ["gd"] / ["md"] drop the
oldest graph / pool with its tensors. With "stacks" true, every trace entry
records its Python stack (PyTorch's default context="all"); else none.
With --groups, GROUPS.json lists such runs ({"conf", "card", "spec": IN.json,
"out": OUT_DIR}), each in a child forked from this one interpreter (Note [One
import of torch for every setting]).
"""
from __future__ import annotations

import inspect
import json
import os
import pickle
import sys
from typing import Callable

import torch

from torchmem.fakegpu import Control
from tests.support.oracle import NO_FORK
from torchmem.pytorch_env import conf_value

STAT_KEYS = ("allocated_bytes.all.peak", "reserved_bytes.all.peak", "allocated_bytes.all.current",
             "reserved_bytes.all.current", "num_alloc_retries", "num_ooms", "segment.all.peak",
             "allocation.all.allocated", "segment.all.allocated", "inactive_split_bytes.all.current",
             "active_bytes.all.peak", "requested_bytes.all.peak", "num_device_alloc", "num_device_free")


def run_one(workload: dict, streams: list, control: Control) -> tuple[dict, dict]:
    live: dict[int, torch.Tensor] = {}
    graphs: list = []  # (graph, its tensors)
    pools: list = []   # (pool, its tensors)
    oom_caught = 0
    recording = False

    def record() -> None:
        nonlocal recording
        context = "all" if workload.get("stacks") else None  # Python stacks on every entry, or none
        options = {"context": context, "stacks": "python", "max_entries": workload.get("max_entries") or 1_000_000}
        if "clear_history" in inspect.signature(torch.cuda.memory._record_memory_history_impl).parameters:
            options["clear_history"] = True
        else:  # torch 2.6 has no clear_history: turning recording off clears the history there
            torch.cuda.memory._record_memory_history(enabled=None)
        torch.cuda.memory._record_memory_history(**options)
        recording = True

    if not workload.get("record_at"):
        record()
    for index, op in enumerate(workload["ops"]):
        if index == workload.get("record_at") and not recording:
            record()
        kind = op[0]
        if kind == "a":  # the program catches an out-of-memory error and goes on
            try:
                with torch.cuda.stream(streams[op[3]]):
                    live[op[1]] = torch.empty(op[2], dtype=torch.uint8, device="cuda")
            except torch.OutOfMemoryError:
                oom_caught += 1
        elif kind == "f":
            live.pop(op[1], None)
        elif kind == "u":
            if op[1] in live:
                live[op[1]].record_stream(streams[op[2]])
        elif kind == "h":
            control.hold(streams[op[1]])
        elif kind == "c":
            control.complete(streams[op[1]])
        elif kind == "e":
            torch.cuda.empty_cache()
        elif kind == "o":
            try:
                with torch.cuda.stream(streams[op[2]]):
                    torch.empty(op[1], dtype=torch.uint8, device="cuda")
            except torch.OutOfMemoryError:
                oom_caught += 1
        elif kind == "r":
            if not recording:
                record()
        elif kind in ("g", "m"):  # tensors made in a private pool: a CUDA graph's capture, or a MemPool's
            owner = torch.cuda.CUDAGraph() if kind == "g" else torch.cuda.MemPool()
            try:
                with torch.cuda.graph(owner) if kind == "g" else torch.cuda.use_mem_pool(owner):
                    tensors = [torch.empty(size, dtype=torch.uint8, device="cuda") for size in op[1]]
                (graphs if kind == "g" else pools).append((owner, tensors))
            except torch.OutOfMemoryError:
                oom_caught += 1
        elif kind == "gd" and graphs:
            graphs.pop(0)
        elif kind == "md" and pools:
            pools.pop(0)
    snapshot = torch.cuda.memory._snapshot()
    stats = torch.cuda.memory_stats()
    report = {"stats": {k: stats.get(k) for k in STAT_KEYS}, "oom_caught": oom_caught,
              "torch": torch.__version__}
    live.clear()
    graphs.clear()
    pools.clear()
    return snapshot, report


def configured_fraction() -> float:
    """The per_process_memory_fraction of PYTORCH_CUDA_ALLOC_CONF (1.0 when it has none)."""
    value = conf_value(os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""), "per_process_memory_fraction")
    return float(value) if value is not None else 1.0


def release_kept_ranges(streams: list) -> None:
    """Gives back the expandable ranges that failed requests reserved and nothing mapped.

    PyTorch keeps such a range for the life of the process (only a release
    that unmaps a range's last pages gives it back), and the next request of
    its stream and pool maps there. Each workload here should start as in a
    fresh process, and no range sized for one workload's card (9/8 of it)
    should serve the next workload's card, which no GPU does: a request per
    stream and pool maps the lowest kept range, and empty_cache() gives it
    back, until one maps where the last did (a fresh range, given back too).
    """
    if "expandable_segments:True" not in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""):
        return
    for stream in streams:
        for size in (512, 2 << 20):  # the small pool, the large pool
            seen: set[int] = set()
            for _ in range(256):
                with torch.cuda.stream(stream):
                    addr = torch.empty(size, dtype=torch.uint8, device="cuda").data_ptr()
                torch.cuda.empty_cache()
                if addr in seen:
                    break
                seen.add(addr)


def reset(streams: list, control: Control, restore_fraction: bool = False) -> None:
    """Brings the process back to its state at start-up; restore_fraction: the workload set its own fraction.

    torch 2.9 and earlier take any set_per_process_memory_fraction() call, 1.0
    included, as a limit: a request over it is refused before an expandable
    range is reserved, and garbage_collection_threshold acts. Torch 2.10 and
    later take 1.0 as no limit (checked on the fake GPU: 2.6.0 and 2.9.1
    against 2.10.0 and 2.14.1). So the fraction is set back only where a
    workload changed it; fraction workloads run in groups of their own (run_native).
    """
    for s in streams[1:]:
        control.hold(s, False)
    control.complete_all()
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(enabled=None)
    torch.cuda.empty_cache()
    release_kept_ranges(streams)
    if restore_fraction:
        torch.cuda.set_per_process_memory_fraction(configured_fraction())  # the setting's own, as at start-up
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.reset_accumulated_memory_stats()


def run_group(workloads: list[dict], out: str) -> None:
    control = Control()
    torch.cuda.init()
    streams = [torch.cuda.default_stream()] + [torch.cuda.Stream() for _ in range(2)]
    for index, workload in enumerate(workloads):
        reset(streams, control)
        control.set_held(0, 0)
        control.set_total(0, workload["card"])
        control.set_held(0, workload.get("held", 0))
        if workload.get("fraction"):
            torch.cuda.set_per_process_memory_fraction(workload["fraction"])
        snapshot, report = run_one(workload, streams, control)
        with open(os.path.join(out, f"{index}.pickle"), "wb") as f:
            pickle.dump(snapshot, f)
        with open(os.path.join(out, f"{index}.json"), "w") as f:
            json.dump(report, f)
        reset(streams, control, restore_fraction=bool(workload.get("fraction")))


# Note [One import of torch for every setting]
# PyTorch reads PYTORCH_CUDA_ALLOC_CONF when CUDA's allocator starts, not at
# `import torch`; so one interpreter imports torch once and forks a child per
# group, which sets its setting and card before anything touches CUDA. That
# saves a fresh interpreter per group (34 of them for 100 workloads). A probe
# child first checks that this torch honours a setting given after the fork,
# as its snapshot's allocator_settings report it; where it does not, or a
# snapshot does not say, the caller falls back to a process per group.

PROBE = "max_split_size_mb:100"


def _forked(conf: str, card: int, work: Callable[[], None]) -> int:
    """Runs work() in a forked child under `conf` on a card of `card` bytes; its exit status."""
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            os.environ["PYTORCH_CUDA_ALLOC_CONF"] = conf
            os.environ.pop("PYTORCH_ALLOC_CONF", None)
            os.environ["TORCHMEM_FAKEGPU_MEMORY"] = str(card)
            Control().set_total(0, card)
            work()
            status = 0
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(status)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def _probe() -> None:
    torch.empty(1, device="cuda")
    settings = torch.cuda.memory._snapshot().get("allocator_settings") or {}
    if settings.get("PYTORCH_CUDA_ALLOC_CONF") != PROBE or settings.get("max_split_size") != 100 << 20:
        os._exit(NO_FORK)


def run_groups(groups: list[dict]) -> int:
    """Each group ({"conf", "card", "spec", "out"}) in a forked child; 0, NO_FORK, or the first failing status."""
    if torch.cuda.is_initialized():
        return NO_FORK
    if _forked(PROBE, 1 << 30, _probe) != 0:
        return NO_FORK
    failed = 0
    for group in groups:
        workloads = json.load(open(group["spec"]))
        status = _forked(group["conf"], group["card"], lambda: run_group(workloads, group["out"]))
        failed = failed or status
    return failed


def main() -> None:
    if sys.argv[1] == "--groups":
        sys.exit(run_groups(json.load(open(sys.argv[2]))))
    run_group(json.load(open(sys.argv[1])), sys.argv[2])


if __name__ == "__main__":
    main()
