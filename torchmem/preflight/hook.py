"""The part of preflight that runs inside the script's own processes (docs/preflight.md).

The launcher puts ``torchmem/preflight/startup`` first on PYTHONPATH; its
``sitecustomize`` calls :func:`install` in every Python process the command
starts (torchrun's ranks too). Nothing happens until the process imports
torch; then, before the script can allocate:

- PyTorch's own history recording starts (``_record_memory_history``), for
  every device, with Python stacks; the script's own calls to start, stop or
  snapshot it see a session of their own, and leave it running (Note [The
  script's own history]);
- cuDNN is switched off (``torch.backends.cudnn.enabled = False``: the fake
  GPU has no cuDNN stand-in, so convolutions and batch norm take PyTorch's
  own CUDA kernels; their buffers are not cuDNN's workspaces);
- NCCL is the fake GPU's stand-in (fakegpu/nccl/nccl.c): ProcessGroupNCCL
  runs as it is, and the most device memory NCCL held on a device counts
  outside the allocator (``nccl`` in the report);
- when only some ranks of a job run (the plan's ``world``, world.py),
  ``init_process_group`` gets a store that answers locally (Note [Ranks that
  are not run]);
- when CUDA initialises, the memory a real process holds outside PyTorch's
  allocator (the plan's ``outside`` bytes: the card's CUDA context
  and libraries, torchmem/fakegpu/cards.py) is taken from every device with
  the fake runtime's own ``cudaMalloc``, so the allocator gets what it would
  get on the real card;
- safetensors checkpoints load their headers, not their bytes, unless
  the plan's ``read_weights`` is set (weights_hook.py);
- with the plan's ``steps`` (``--steps N``), optimizer steps are
  counted with their peaks, and the process ends after the N-th
  (steps_hook.py);
- calls that read values computed on the device (``.item()``,
  ``.tolist()``, ``bool()``) or whose output's size depends on them
  (``.nonzero()``, ``torch.nonzero(x)``, ``torch.where(mask)``,
  ``torch.bincount``, boolean-mask indexing ``x[mask]``...) are counted with
  the line of the script that made them (Note [Data-dependent shapes]).

At exit, or at the first uncaught ``torch.OutOfMemoryError`` (before the
traceback releases the tensors), the process writes its native snapshot
(``NAME.pickle``) and a small report (``NAME.json``) into
the plan's ``out`` folder, NAME being ``rank{RANK}`` under torchrun, else
``pid{PID}``. A process that never initialised CUDA writes nothing. An
uncaught exception is written as one line to the report and in full to
``NAME.traceback.txt``, not printed: the launcher prints the line.
"""
from __future__ import annotations

import atexit
import importlib.abc
import importlib.machinery
import json
import os
import re
import sys
import traceback
from typing import Any

# What the launcher (preflight/__init__.py) tells each process is one RunPlan in one variable (run_plan.py),
# read once by install() into _state["plan"].
_state: dict[str, Any] = {"written": False, "counts": {}, "sized": {}, "notes": [], "outcome": None, "plan": None}

# Tensor methods whose result depends on values computed on the device.
READS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__")
SHAPES = ("nonzero", "unique", "unique_consecutive", "masked_select", "bincount", "argwhere", "repeat_interleave")
# torch functions whose output's size depends on them (TorchScript builtins: Note [Data-dependent shapes]).
SHAPE_FUNCTIONS = ("nonzero", "argwhere", "masked_select", "bincount", "unique_consecutive", "repeat_interleave",
                   "where")


OWNER = "TORCHMEM_PREFLIGHT_RANK_OWNER"


# Note [One report per rank]
# A rank's children inherit its environment, RANK included: inductor's compile
# workers, DataLoader workers, anything the script spawns. Each runs this hook
# too, and one that writes rank{RANK}.json replaces the rank's own report. So
# the first hooked process of a rank claims the name (OWNER, inherited by its
# children), and a child of the same rank reports as rank{RANK}-pid{PID}.

def name() -> str:
    rank = os.environ.get("RANK")
    if rank is None or not rank.isdigit():
        return f"pid{os.getpid()}"
    owner = os.environ.setdefault(OWNER, f"{rank}:{os.getpid()}")
    return f"rank{rank}" if owner == f"{rank}:{os.getpid()}" else f"rank{rank}-pid{os.getpid()}"


def install() -> None:
    """Called from sitecustomize: waits for torch's import, and handles uncaught exceptions."""
    plan = _sibling("run_plan").plan_of(os.environ)
    if plan is None:
        return
    _state["plan"] = plan
    sys.meta_path.insert(0, _AfterImport("torch", _on_torch))
    if not plan.read_weights:  # checkpoints load their shapes, not their bytes (weights_hook.py)
        sys.meta_path.insert(0, _AfterImport("safetensors", lambda module: _sibling("weights_hook").install(module)))
    previous = sys.excepthook

    def excepthook(kind: type[BaseException], exc: BaseException, tb: Any) -> None:
        try:
            _uncaught(exc)
        except Exception:  # the report must not hide the script's own error
            previous(kind, exc, tb)

    sys.excepthook = excepthook


class _AfterImport(importlib.abc.MetaPathFinder):
    """Calls `then(module)` right after the import of module `name` finishes, once."""

    def __init__(self, name: str, then: Any) -> None:
        self.name, self.then = name, then

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        original = loader.exec_module

        def exec_module(module: Any) -> None:
            original(module)
            self.then(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _on_torch(torch: Any) -> None:
    name()  # claims this rank's report before the script can spawn children (Note [One report per rank])
    if torch.version.cuda is None:
        _state["notes"].append(f"torch {torch.__version__} is not a CUDA build: nothing was recorded")
        return
    plan = _state["plan"]
    entries = plan.max_entries or sys.maxsize
    context = history_context(torch.__version__)
    torch.cuda.memory._record_memory_history(max_entries=entries, stacks="python", context=context)
    if context != "all":
        _state["notes"].append(f"frees were recorded without their stacks: torch {torch.__version__} fails "
                               "compiled code under activation checkpointing when they are (PyTorch issue 179536)")
    _state["history"] = _ScriptHistory(torch, context, entries)
    _state["history"].install()
    torch.backends.cudnn.enabled = False
    if hasattr(torch.backends.cuda, "enable_cudnn_sdp"):
        torch.backends.cuda.enable_cudnn_sdp(False)
    _count_reads(torch)
    _count_size_reads(torch)
    if plan.world:
        _local_rendezvous(torch, plan.world)
    if plan.outside > 0:
        torch.cuda._lazy_call(lambda: _take_outside(torch, plan.outside))
    if plan.steps:
        _count_steps(torch, plan.steps)
    atexit.register(_at_exit)


def _sibling(name: str) -> Any:
    """A module of this folder, loaded by path as this one is (none of torchmem's imports run)."""
    import importlib.util

    key = f"_torchmem_preflight_{name}"
    if key in sys.modules:
        return sys.modules[key]
    where = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
    spec = importlib.util.spec_from_file_location(key, where)
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module  # before it runs: a dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def _count_steps(torch: Any, limit: int) -> None:
    """--steps: counts optimizer steps (steps_hook.py) and ends the process after the `limit`-th."""
    counter = _sibling("steps_hook").StepCounter(torch, limit, _stop_after_steps)
    counter.install()
    _state["steps"] = counter
    engine = "deepspeed.runtime.engine"
    if engine in sys.modules:
        counter.watch_engine(sys.modules[engine].DeepSpeedEngine)
    else:
        sys.meta_path.insert(0, _AfterImport(engine, lambda module: counter.watch_engine(module.DeepSpeedEngine)))


def _stop_after_steps() -> None:
    """The last step asked for is done: the report and snapshot are written, and the process ends with 0."""
    _state["outcome"] = {"status": "completed"}
    _write()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # a closed stream: nothing left to say
            pass
    os._exit(0)  # the script's code after this step, and the interpreter's finalization, never run


# Note [Frees recorded without stacks]
# On torch 2.11.0, a compiled function recomputed under activation
# checkpointing fails with "SystemError: <built-in method apply of
# FunctionMeta> returned NULL without setting an exception" while the history
# records a stack at every free (context="all", the default): PyTorch issue
# 179536, a regression from 2.10. Stacks at allocations only
# (context="alloc") run. So on the releases from 2.11 up to 2.13 preflight
# records "alloc": allocations, segments and OOMs keep their stacks, frees
# carry none. Seen on 2.11.0 (tests/fakegpu/test_compile.py); 2.14.1 records
# "all" and runs; 2.12 and 2.13 were not tried. The cost: advise replays such
# a snapshot as one without stacks, so it cannot tell a program's
# empty_cache() just before a request from the allocator's retry (the
# retry-count deviation, docs/fakegpu.md).

def history_context(version: str) -> str:
    """The `context` preflight records the history with on this torch (Note [Frees recorded without stacks])."""
    # pytorch_env.torch_release reads versions too; this module imports nothing of torchmem's.
    major, minor = (int(part) for part in re.findall(r"\d+", version)[:2])
    return "alloc" if (2, 11) <= (major, minor) < (2, 14) else "all"


# Note [The script's own history]
# PyTorch has one history recorder per process, and preflight's recording
# needs it from torch's import to the end. Many scripts start, dump and stop
# their own: _record_memory_history(max_entries=N), _dump_snapshot(path),
# _record_memory_history(enabled=None). On a card the stop empties the
# history, so preflight's snapshot would hold no entries. So the recorder's
# two entry points in torch._C are wrapped, which also catches a script that
# calls them directly:
# - _cuda_record_memory_history (and its _legacy form) keeps preflight's
#   recording on: the script's call only opens or closes the script's session
#   and sets its max_entries, skip_actions and context. Flags that only add
#   to what is recorded (compile_context, global_record_annotations, pinned
#   host memory) are passed on.
# - _cuda_memorySnapshot answers the script with a copy of the full snapshot
#   whose device_traces hold what a card would have recorded for it: the
#   entries since its session began, less its skip_actions, the last N of
#   them, with the frames its context keeps (_with_context). Outside a
#   session they are empty, as on a card after a stop.
# Where a session begins is where the trace ended when it was opened (the
# snapshot taken there appends a `snapshot` entry, skipped: a card would not
# have it). Under --max-entries preflight's own ring drops entries from the
# front, so the boundary is found again by the entry just before it, compared
# without time_us (each snapshot converts times afresh). Preflight's own
# snapshots at exit and OOM call the unwrapped function.
# Not reproduced: C++ frames (stacks="all"; preflight records Python frames),
# a free's own stack under context="all" on 2.11 to 2.13 (preflight records
# "alloc" there), and the frames on blocks allocated before the session.

_RECORD_ON = ("all", "state", True)


class _ScriptHistory:
    """The script's own view of the history recorder (Note [The script's own history])."""

    def __init__(self, torch: Any, context: str, max_entries: int) -> None:
        memory = torch.cuda.memory
        self.torch = torch
        self.record = torch._C._cuda_record_memory_history
        self.legacy = getattr(torch._C, "_cuda_record_memory_history_legacy", None)
        self.raw_snapshot = torch._C._cuda_memorySnapshot
        self.defaults = _arguments(getattr(memory, "_record_memory_history_impl", None))
        self.names = list(self.defaults)
        self.legacy_names = list(_arguments(getattr(memory, "_record_memory_history_legacy", None)))
        self.own = {"enabled": "all", "context": context, "stacks": "python", "max_entries": max_entries}
        self.bounded = max_entries < sys.maxsize
        self.session: dict[str, Any] | None = None
        self.extra: dict[str, Any] = {}

    def install(self) -> None:
        torch_c = self.torch._C
        torch_c._cuda_record_memory_history = self.script_record
        if self.legacy is not None:
            torch_c._cuda_record_memory_history_legacy = self.script_record_legacy
        torch_c._cuda_memorySnapshot = self.script_snapshot

    def snapshot(self) -> dict[str, Any]:
        """The full snapshot, preflight's own (its `snapshot` entry is appended to every device's trace)."""
        try:
            return self.raw_snapshot(None)
        except TypeError:  # torch before 2.8 takes no mempool id
            return self.raw_snapshot()

    def stop(self) -> None:
        """Stops the recorder for good: preflight's snapshot is written."""
        self.record(None, *(self.defaults[n] for n in self.names[1:]))

    def script_record(self, *args: Any, **kwargs: Any) -> None:
        given = dict(zip(self.names, args), **kwargs)
        self._script_call(given.get("enabled"), given.get("context", "all"), given.get("stacks", "all"),
                          given.get("max_entries", sys.maxsize), given)

    def script_record_legacy(self, *args: Any, **kwargs: Any) -> None:
        given = dict(zip(self.legacy_names, args), **kwargs)
        context = "alloc" if given.get("trace_alloc_record_context") else \
            "state" if given.get("record_context", True) else None
        stacks = "all" if given.get("record_context_cpp") else "python"
        self._script_call(bool(given.get("enabled")), context, stacks, given.get("trace_alloc_max_entries", 1),
                          given)

    def _script_call(self, enabled: Any, context: Any, stacks: str, max_entries: int, given: dict[str, Any]) -> None:
        extra = {n: given[n] for n in _ADDITIVE if given.get(n) and n in self.names}
        if extra.items() - self.extra.items() or not self.torch.cuda.is_initialized():
            self.extra.update(extra)  # the call also initialises CUDA, as the script's own would
            self.record(*(self.extra.get(n, self.own.get(n, self.defaults[n])) for n in self.names))
        if enabled not in _RECORD_ON:
            self.session = None  # a card empties the history at a stop
            return
        if self.session is None or given.get("clear_history"):
            full = self.snapshot()
            starts = [(len(t), _anchor(t[-1]) if t else None) for t in full["device_traces"]]
            self.session = {"starts": starts}
        self.session.update(max_entries=max(1, int(max_entries)), context=context,
                            skip=set(given.get("skip_actions") or ()))
        if stacks == "all" and _CPP_NOTE not in _state["notes"]:
            _state["notes"].append(_CPP_NOTE)

    def script_snapshot(self, *args: Any) -> dict[str, Any]:
        full = self.raw_snapshot(*args)
        view = dict(full)
        view["device_traces"] = [self._window(d, trace) for d, trace in enumerate(full.get("device_traces", []))]
        return view

    def _window(self, device: int, trace: list[dict[str, Any]]) -> list[dict[str, Any]]:
        session = self.session
        if session is None or device >= len(session["starts"]):
            return []
        index, anchor = session["starts"][device]
        start = _boundary(trace, index, anchor) if self.bounded else index
        if start < len(trace) and trace[start].get("action") == "snapshot":
            start += 1  # the snapshot that opened the session
        entries = _with_context(trace[start:], session["context"], self.own["context"])
        entries = [e for e in entries if e.get("action") not in session["skip"]]
        return entries[-session["max_entries"]:]


_FREES = ("free_requested", "free_completed")


def _with_context(entries: list[dict[str, Any]], context: Any, recorded: str) -> list[dict[str, Any]]:
    """The entries with the frames a card records under the script's `context`, from those preflight recorded
    under `recorded`: none under None or "state"; under "alloc", a free carries its block's allocation's stack,
    recorded in the session (checked against the fake GPU without preflight, torch 2.14.1)."""
    if context is None or context == "state":
        return [{k: v for k, v in e.items() if k != "frames"} for e in entries]
    if context != "alloc" or recorded == "alloc":
        return entries  # what preflight recorded is what the card records
    blocks: dict[Any, Any] = {}  # a live block's stack at its allocation, made in the session
    out = []
    for e in entries:
        action = e.get("action")
        if action == "alloc":
            blocks[e.get("addr")] = e.get("frames")
        elif action in _FREES:
            frames = blocks.pop(e.get("addr"), None) if action == "free_completed" else blocks.get(e.get("addr"))
            e = {k: v for k, v in e.items() if k != "frames"}
            if frames:
                e["frames"] = frames
        out.append(e)
    return out


_ADDITIVE = ("compile_context", "global_record_annotations", "record_pinned_host_memory")
_CPP_NOTE = ("the script asked its own history for C++ frames (stacks=\"all\"): its own snapshots hold the Python "
             "frames preflight records")


def _arguments(function: Any) -> dict[str, Any]:
    """The positional arguments torch._C's recorder takes, with their defaults: its Python caller's, less
    `device` (the same order on 2.6 to 2.14)."""
    import inspect

    if function is None:
        return {"enabled": None, "context": "all", "stacks": "all", "max_entries": sys.maxsize}
    parameters = inspect.signature(function).parameters
    return {n: [] if n == "skip_actions" and p.default is None else p.default
            for n, p in parameters.items() if n != "device"}


def _anchor(entry: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in entry.items() if k != "time_us"}


def _boundary(trace: list[dict[str, Any]], index: int, anchor: dict[str, Any] | None) -> int:
    """Where a boundary taken at trace length `index`, just after `anchor`, now lies in a ring that drops from the
    front: 0 when the anchor was dropped."""
    if anchor is None:
        return 0
    for i in range(min(index, len(trace)) - 1, -1, -1):
        if _anchor(trace[i]) == anchor:
            return i + 1
    return 0


def _take_outside(torch: Any, size: int) -> None:
    """Takes `size` bytes of every device outside PyTorch's allocator, as a real CUDA context and libraries do."""
    import ctypes

    runtime = ctypes.CDLL(None)
    if not hasattr(runtime, "fakegpu_version"):
        _state["notes"].append("the memory outside the allocator was not taken: the fake GPU's runtime is not loaded")
        return
    device = ctypes.c_int(0)
    runtime.cudaGetDevice(ctypes.byref(device))
    taken = []
    for d in range(torch.cuda.device_count()):
        pointer = ctypes.c_void_p()
        if runtime.cudaSetDevice(d) != 0 or runtime.cudaMalloc(ctypes.byref(pointer), ctypes.c_size_t(size)) != 0:
            runtime.cudaGetLastError()
            _state["notes"].append(f"device {d}: the card is smaller than the memory outside the allocator "
                                   f"({size:,} bytes): nothing of it was taken")
            continue
        taken.append(d)
    runtime.cudaSetDevice(device.value)
    _state["outside"] = {d: size for d in taken}


def _shown(path: str) -> str:
    """A file as the user knows it: relative when under the current folder, else as it is."""
    if path.startswith("<"):
        return path
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative


def _site(depth: int = 2) -> str:
    """The innermost frame outside torch and torchmem, from `depth` frames up: the script's line that made the
    call."""
    frame = sys._getframe(depth)
    while frame is not None:
        path = frame.f_code.co_filename
        if not re.search(r"[/\\](torch|torchmem[/\\]preflight|transformers|accelerate)[/\\]|^<frozen", path):
            return f"{_shown(path)}:{frame.f_lineno}"
        frame = frame.f_back
    return "?"


# Note [Data-dependent shapes]
# On the fake GPU, device values are whatever the memory held (mostly zeros:
# fresh pages), so code whose allocation sizes follow device values allocates
# other sizes than on a card. Such calls are counted per line of the script:
# the Tensor methods of READS and SHAPES; the torch functions of
# SHAPE_FUNCTIONS (torch.where only in its one-argument form, which is
# nonzero; repeat_interleave, function or method, only with repeats on the
# device); and indexing with a boolean mask on the device, read or written
# (x[mask], x[mask] = v), which runs nonzero inside. MoE routing goes through these. The wrappers
# are registered as TorchScript builtins under the wrapped op's name, so
# scripted code that calls torch.nonzero still compiles to aten::nonzero;
# under torch.compile they call straight through, uncounted, so Dynamo sees
# the plain op and its graphs are those of a run without preflight.

def _count_reads(torch: Any) -> None:
    counts: dict[str, dict[str, int]] = _state["counts"]
    compiling = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)

    def count(label: str) -> None:
        sites = counts.setdefault(label, {})
        site = _site(3)
        sites[site] = sites.get(site, 0) + 1

    def on_device(value: Any) -> bool:
        return bool(getattr(value, "is_cuda", False))

    def wrap(owner: Any, attr: str, label: str, seen: Any = None) -> Any:
        """Replaces owner.attr by a wrapper that counts the calls `seen(args, kwargs)` picks (default: a first
        argument on the device); returns the wrapper, or None when owner has no such attribute."""
        original = getattr(owner, attr, None)
        if original is None:
            return None
        picks = seen or (lambda args, kwargs: bool(args) and on_device(args[0]))

        def counted(*args: Any, **kwargs: Any) -> Any:
            if not compiling() and picks(args, kwargs):
                count(label)
            return original(*args, **kwargs)

        counted.__name__ = getattr(original, "__name__", attr)
        counted.__doc__ = getattr(original, "__doc__", None)
        setattr(owner, attr, counted)
        return counted

    for attr in READS:
        wrap(torch.Tensor, attr, "bool()" if attr == "__bool__" else f"{attr.strip('_')}()" if attr.startswith("__")
             else f".{attr}()")
    def repeats_on_device(args: tuple, kwargs: dict) -> bool:
        """repeat_interleave(x, repeats) or x.repeat_interleave(repeats), or repeats alone as the input."""
        return on_device(kwargs.get("repeats", args[1] if len(args) > 1 else args[0] if args else None))

    for attr in SHAPES:
        wrap(torch.Tensor, attr, f".{attr}()", repeats_on_device if attr == "repeat_interleave" else None)

    def mask_in(index: Any) -> bool:
        parts = index if isinstance(index, (tuple, list)) else (index,)
        return any(on_device(i) and getattr(i, "dtype", None) in (torch.bool, torch.uint8) for i in parts)

    wrap(torch.Tensor, "__getitem__", "x[mask]", lambda args, kwargs: len(args) > 1 and mask_in(args[1]))
    wrap(torch.Tensor, "__setitem__", "x[mask] = v", lambda args, kwargs: len(args) > 1 and mask_in(args[1]))

    builtins = getattr(getattr(torch, "jit", None), "_builtins", None)
    special = {
        "where": lambda args, kwargs: len(args) == 1 and not kwargs and on_device(args[0]),
        "repeat_interleave": repeats_on_device,
    }
    for name in SHAPE_FUNCTIONS:
        op = builtins._find_builtin(getattr(torch, name, None)) if builtins is not None else None
        if op is None:
            continue  # not a TorchScript builtin in this release: left as it is
        label = "torch.where(mask)" if name == "where" else f"torch.{name}()"
        wrapper = wrap(torch, name, label, special.get(name))
        builtins._register_builtin(wrapper, op)


# Note [The script sized itself]
# A script, or a library it calls, may read the card's size and size itself by
# it: Accelerate's device_map="auto" reads mem_get_info, a batch finder reads
# total_memory. Then a replay of this run at another card's size is not what
# that card would run. So calls of torch.cuda.mem_get_info and
# get_device_properties are counted by the line that made them, when that line
# is not in torch itself (inductor and SDPA read the properties for their own
# choices). The report marks the other cards' rows (cards_table.py).

def _count_size_reads(torch: Any) -> None:
    sized: dict[str, dict[str, int]] = _state["sized"]
    for attr in ("mem_get_info", "get_device_properties"):
        original = getattr(torch.cuda, attr, None)
        if original is None:
            continue

        def counted(*args: Any, _original: Any = original, _label: str = f"torch.cuda.{attr}()", **kwargs: Any) -> Any:
            caller = sys._getframe(1)
            path = caller.f_code.co_filename
            if not re.search(r"[/\\](torch|torchmem[/\\]preflight)[/\\]|^<frozen", path):
                sites = sized.setdefault(_label, {})
                site = f"{_shown(path)}:{caller.f_lineno}"
                sites[site] = sites.get(site, 0) + 1
            return _original(*args, **kwargs)

        counted.__name__, counted.__doc__ = attr, original.__doc__
        for owner in (torch.cuda, getattr(torch.cuda, "memory", None)):
            if getattr(owner, attr, None) is original:
                setattr(owner, attr, counted)


# Note [Ranks that are not run]
# With --world-size, one process runs one rank of a job whose other ranks do
# not exist. The rendezvous would wait for them, so init_process_group gets a
# store of this process alone, and its own init_method is dropped. The store
# answers as if every absent rank did what this one does: add(key, n) adds n
# for each rank of the world, so a store-based barrier sees the whole world
# arrive; a key no rank here set reads as 128 zero bytes, the size of NCCL's
# unique id, the one value ProcessGroupNCCL reads from another rank; waits
# return at once; check says only whether this process set the keys
# (ProcessGroupNCCL's heartbeat checks for another rank's dump signal). The
# NCCL stand-in needs no peer, so collectives complete.
# Values that should come from other ranks (a broadcast object, a gathered
# size) are whatever this rank's buffers hold.

def _local_store_class(dist: Any, world: int) -> type:
    """A torch.distributed.Store of this process alone, answering for a world of `world` ranks."""

    class LocalStore(dist.Store):
        """A store of this process alone (Note [Ranks that are not run])."""

        def __init__(self) -> None:
            super().__init__()
            self.data: dict[str, bytes] = {}

        def set(self, key: str, value: Any) -> None:
            self.data[key] = value.encode() if isinstance(value, str) else bytes(value)

        def get(self, key: str) -> bytes:
            return self.data.get(key, bytes(128))

        def add(self, key: str, amount: int) -> int:
            total = int(self.data.get(key, b"0")) + amount * world
            self.data[key] = str(total).encode()
            return total

        def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
            now = self.data.get(key)
            want = expected.encode() if isinstance(expected, str) else bytes(expected)
            if (now is None and not want) or now == want:
                self.set(key, desired)
            return self.data.get(key, want)

        def delete_key(self, key: str) -> bool:
            return self.data.pop(key, None) is not None

        def num_keys(self) -> int:
            return len(self.data)

        def check(self, keys: list[str]) -> bool:
            return all(key in self.data for key in keys)

        def wait(self, keys: list[str], timeout: Any = None) -> None:
            return None

        def set_timeout(self, timeout: Any) -> None:
            return None

    return LocalStore


def _local_rendezvous(torch: Any, world: int) -> None:
    dist = getattr(torch, "distributed", None)
    if dist is None or not dist.is_available():
        return
    import inspect

    LocalStore = _local_store_class(dist, world)
    original = dist.init_process_group
    signature = inspect.signature(original)
    rank = int(os.environ.get("RANK", "0"))
    note = f"rank {rank} of {world} ran alone: the other ranks' rendezvous and collectives were answered locally"

    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        given = signature.bind_partial(*args, **kwargs).arguments
        given.pop("init_method", None)
        store = LocalStore()
        _state.setdefault("stores", []).append(store)  # C++ calls its Python methods only while it lives here
        given.update(store=store, rank=rank, world_size=world)
        if note not in _state["notes"]:
            _state["notes"].append(note)
        return original(**given)

    dist.init_process_group = init_process_group
    if hasattr(dist, "distributed_c10d"):
        dist.distributed_c10d.init_process_group = init_process_group


def _nccl_peak(device: int) -> int:
    """The most device memory the NCCL stand-in held at once on a device (fakegpu/nccl/nccl.c), or 0."""
    import ctypes

    try:
        peak = ctypes.CDLL(None).torchmem_nccl_device_peak
    except (AttributeError, OSError):
        return 0  # not on the stand-in
    peak.restype, peak.argtypes = ctypes.c_size_t, [ctypes.c_int]
    return int(peak(device))


def _oom_details(exc: BaseException) -> dict[str, Any]:
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    device = re.search(r"GPU (\d+)", message)
    tried = re.search(r"Tried to allocate ([\d.]+ [KMGT]?i?B)", message)
    where = "?"
    for frame, line in traceback.walk_tb(exc.__traceback__):
        path = frame.f_code.co_filename
        if not re.search(r"[/\\](torch|torchmem[/\\]preflight)[/\\]", path) and not path.startswith("<frozen"):
            where = f"{_shown(path)}:{line} (in {frame.f_code.co_name})"
    return {"message": message, "device": int(device.group(1)) if device else None,
            "tried": tried.group(1) if tried else None, "where": where}


def _uncaught(exc: BaseException) -> None:
    out = _state["plan"].out
    torch = sys.modules.get("torch")
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    with open(os.path.join(out, f"{name()}.traceback.txt"), "w") as f:
        f.write(text)
    if torch is not None and isinstance(exc, torch.OutOfMemoryError):
        _state["outcome"] = {"status": "oom", "oom": _oom_details(exc)}
    else:
        where = _oom_details(exc)["where"]
        line = " ".join(f"{type(exc).__name__}: {exc}".split())
        _state["outcome"] = {"status": "error", "error": f"{line[:300]} ({where})" if where != "?" else line[:300]}
    _write()


def _at_exit() -> None:
    if _state["outcome"] is None:
        _state["outcome"] = {"status": "completed"}
    _write()
    _quiesce_autograd()


# Note [Autograd threads at interpreter exit]
# PyTorch runs a CUDA backward on one autograd thread per device. After the
# backward has returned to the caller, that thread may still hold the last
# reference to the backward's GraphTask; its ThreadLocalState holds a copy of
# the caller's contextvars.Context (a Python object), so releasing it takes
# the GIL. If the interpreter has begun finalizing by then, CPython 3.11 ends
# the thread with pthread_exit inside take_gil; the forced unwinding meets
# noexcept C++ destructors (~GraphTask, ~ThreadLocalState) and std::terminate
# aborts the process: "terminate called without an active exception", after
# the snapshot is written (gdb, torch 2.14.1, the thread held at its
# PyEval_AcquireThread until finalize_modules). So before the interpreter
# finalizes, each device's autograd thread runs one empty backward, and the
# main thread waits, without the GIL, until that backward's GraphTask is
# released: the thread takes tasks in order, so every earlier GraphTask is
# released by then too.

class _Marker:
    """A value put in a ContextVar: it lives exactly as long as the contexts that hold it."""


def _quiesce_autograd(timeout: float = 10.0) -> None:
    """Waits until no autograd device thread still holds a GraphTask (Note [Autograd threads at interpreter exit])."""
    import contextvars
    import time
    import weakref

    torch = sys.modules.get("torch")
    if torch is None or torch.version.cuda is None or not torch.cuda.is_initialized():
        return
    try:
        _state["history"].stop()  # the snapshot is written: stop recording stacks
        marker_var: contextvars.ContextVar[Any] = contextvars.ContextVar("torchmem_preflight_quiesce")
        for d in range(torch.cuda.device_count()):
            if not torch.cuda.memory_stats(d).get("num_device_alloc", 0):
                continue  # no tensor was ever made there: no backward ran there
            for _ in range(2):  # the second: the thread has also dropped the first's last task (its node)
                marker = _Marker()
                released = weakref.ref(marker)
                token = marker_var.set(marker)
                try:
                    with torch.enable_grad():
                        leaf = torch.empty(0, device=f"cuda:{d}", requires_grad=True)  # empty: no device memory
                        out, grad = leaf * 2, torch.empty(0, device=f"cuda:{d}")
                        torch.autograd.backward(out, grad)
                    _state.setdefault("quiesce_kept", []).append((leaf, out, grad))  # never freed on that thread
                finally:
                    marker_var.reset(token)
                    del marker
                deadline = time.monotonic() + timeout
                while released() is not None and time.monotonic() < deadline:
                    time.sleep(0.001)  # without the GIL, which the autograd thread needs to release the GraphTask
    except Exception as exc:  # the process is ending: say so, never fail it here
        print(f"torchmem preflight: the autograd threads could not be waited for at exit: {exc}", file=sys.stderr)


def _write() -> None:
    torch = sys.modules.get("torch")
    outcome = _state["outcome"] or {"status": "completed"}
    used = torch is not None and torch.version.cuda is not None and torch.cuda.is_initialized()
    if _state["written"] or (not used and outcome["status"] == "completed"):
        return  # a process that never used the GPU and ended well (torchrun's launcher) has nothing to say
    _state["written"] = True
    out = _state["plan"].out
    base = os.path.join(out, name())
    if used:
        import pickle

        with open(base + ".pickle", "wb") as f:
            pickle.dump(_state["history"].snapshot(), f)  # the whole recording (Note [The script's own history])
    devices = []
    steps = _state.get("steps")  # --steps: PyTorch's peaks restart at each step (steps_hook.py)
    for d in range(torch.cuda.device_count() if used else 0):
        stats = torch.cuda.memory_stats(d)
        if not stats.get("num_device_alloc", 0) and not stats.get("num_ooms", 0):
            continue
        devices.append({
            "device": d,
            "peak_allocated": max(stats.get("allocated_bytes.all.peak", 0), steps.peak(d, "allocated") if steps else 0),
            "peak_reserved": max(stats.get("reserved_bytes.all.peak", 0), steps.peak(d, "reserved") if steps else 0),
            "allocated": stats.get("allocated_bytes.all.current", 0),
            "reserved": stats.get("reserved_bytes.all.current", 0),
            "num_ooms": stats.get("num_ooms", 0),
            "num_alloc_retries": stats.get("num_alloc_retries", 0),
            "total": torch.cuda.get_device_properties(d).total_memory,
            "outside": _state.get("outside", {}).get(d, 0) + _nccl_peak(d),
            "nccl": _nccl_peak(d),
        })
    report = {
        "name": name(), "pid": os.getpid(), "rank": os.environ.get("RANK"), "argv": sys.argv,
        "torch": getattr(torch, "__version__", None), "settings": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "capability": ".".join(map(str, torch.cuda.get_device_capability(0))) if used else None,
        "device_name": torch.cuda.get_device_name(0) if used else None,
        **outcome,
        "devices": devices, "reads": _state["counts"], "sized": _state["sized"], "notes": _state["notes"],
        "steps": steps.to_json() if steps else None,
        "snapshot": base + ".pickle" if used else None,
    }
    with open(base + ".json.tmp", "w") as f:
        json.dump(report, f, indent=1)
    os.replace(base + ".json.tmp", base + ".json")
