"""The fake GPU: PyTorch's CUDA build on a machine with no GPU (docs/fakegpu.md).

A CUDA build of torch runs its real caching allocator on host memory when
torchmem's fake CUDA runtime is preloaded in front of the real one. There is one
set of stand-ins per CUDA major (``libcudart.so.13`` in build/fakegpu,
``libcudart.so.12`` in build/fakegpu/cuda12); the launcher picks the set that
matches the CUDA build of torch of the interpreter it will run.
Memory behaviour is real (segments, addresses, ``memory_stats()``, snapshots,
out-of-memory errors, expandable segments); arithmetic is not: kernels are
accepted and skipped, so values computed on the device are garbage.

    python -m torchmem.fakegpu --card 80GiB -- python train.py

From Python::

    from torchmem import fakegpu
    fakegpu.run(["python", "train.py"], card="h100")     # a command
    fakegpu.call(my_function, arg, card="24GiB")          # a function, in a fresh interpreter

Inside a process on the fake GPU, :class:`Control` holds streams back and
completes their work when a test says so, and reads the fake's counters.
"""
from __future__ import annotations

import ctypes
import functools
import inspect
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager

from torchmem.fakegpu.cards import CARDS, Card, card, parse_memory

__all__ = ["CARDS", "Card", "Control", "FakeGPUError", "TorchBuild", "call", "card", "environment",
           "interpreter_of", "libraries", "library_dir", "on_fake_gpu", "parse_memory", "run", "torch_build"]

RUNTIME = "libtorchmem_fakecudart.so"
MAJORS = (12, 13)  # the CUDA majors the fake GPU has stand-ins for
DEFAULT_MAJOR = 13  # the set used when the interpreter's torch is not a CUDA build


def blas(major: int = DEFAULT_MAJOR) -> tuple[str, str]:
    """The cuBLAS and cuBLASLt stand-ins of one CUDA major, with the real sonames (fakegpu/cublas/)."""
    return f"libcublas.so.{major}", f"libcublasLt.so.{major}"


NCCL = "libnccl.so.2"  # the NCCL stand-in (fakegpu/nccl/nccl.c), one soname for both majors


def libraries(major: int = DEFAULT_MAJOR) -> tuple[str, ...]:
    """The files of one set of stand-ins."""
    return (RUNTIME, "libcuda.so.1", "libnvidia-ml.so.1", *blas(major), NCCL)


BLAS = blas()
LIBRARIES = libraries()


class FakeGPUError(RuntimeError):
    """The fake GPU is not built, not loaded, or a function run on it failed."""


@dataclass(frozen=True)
class TorchBuild:
    """The torch an interpreter imports, read from its files (torch is not imported)."""

    python: str
    version: str | None  # torch.__version__; None when the interpreter has no torch
    cuda: str | None     # torch.version.cuda; None for a CPU build
    cublas: str | None   # the version of the nvidia cuBLAS wheel beside it, if any
    nccl: str | None = None  # the version of the nvidia NCCL wheel beside it, if any

    @property
    def major(self) -> int | None:
        """The CUDA major of the build (12 for torch 2.6.0+cu124), or None."""
        return int(self.cuda.split(".")[0]) if self.cuda else None


def _read_torch_build() -> dict:
    """Runs in the interpreter asked about: torch's version.py and the cuBLAS and NCCL wheels, without importing
    torch."""
    import importlib.util
    import os
    import re
    import sys
    from importlib import metadata

    found = {"version": None, "cuda": None, "cublas": None, "nccl": None}
    loaded = sys.modules.get("torch")
    if loaded is not None and hasattr(loaded, "version"):
        found["version"], found["cuda"] = str(loaded.__version__), loaded.version.cuda
    else:
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.origin is None:
            return found
        try:
            with open(os.path.join(os.path.dirname(spec.origin), "version.py")) as f:
                text = f.read()
        except OSError:
            return found
        for key, name in (("version", "__version__"), ("cuda", "cuda")):
            match = re.search(rf"^{name}\s*(?::[^=\n]*)?=\s*['\"]([^'\"]+)['\"]", text, re.M)
            found[key] = match.group(1) if match else None
    if found["cuda"]:
        major = found["cuda"].split(".")[0]
        for wheel in (f"nvidia-cublas-cu{major}", "nvidia-cublas"):
            try:
                version = metadata.version(wheel)
            except metadata.PackageNotFoundError:
                continue
            if version.split(".")[0] == major:
                found["cublas"] = version
                break
        for wheel in (f"nvidia-nccl-cu{major}", "nvidia-nccl"):
            try:
                found["nccl"] = metadata.version(wheel)
                break
            except metadata.PackageNotFoundError:
                continue
    return found


@functools.lru_cache(maxsize=16)
def torch_build(python: str | None = None) -> TorchBuild:
    """The torch of an interpreter (default this one); asks another interpreter in a subprocess.

    Raises FakeGPUError when `python` cannot be run or does not answer.
    """
    # abspath, not realpath: every venv's python links to the same base interpreter, each with its own torch
    if python is None or os.path.abspath(python) == os.path.abspath(sys.executable):
        return TorchBuild(sys.executable, **_read_torch_build())
    code = inspect.getsource(_read_torch_build) + "\nimport json\nprint(json.dumps(_read_torch_build()))\n"
    try:
        proc = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120,
                              env={k: v for k, v in os.environ.items() if k != "LD_PRELOAD"})
        found = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        found = None
    if not isinstance(found, dict):
        raise FakeGPUError(f"cannot tell which torch {python} runs (it did not answer a query of its torch build)")
    return TorchBuild(python, found.get("version"), found.get("cuda"), found.get("cublas"), found.get("nccl"))


def interpreter_of(command: Sequence[str], path: str | None = None) -> str | None:
    """The Python interpreter a command runs: the command itself, or a script's #! interpreter; else None."""
    if not command:
        return None
    program = shutil.which(os.fspath(command[0]), path=path)
    if program is None:
        return None
    if re.fullmatch(r"python[0-9.]*", os.path.basename(program)):
        return program
    try:
        with open(program, "rb") as f:
            first = f.readline(512).decode(errors="replace").strip()
    except OSError:
        return None
    if not first.startswith("#!"):
        return None
    words = first[2:].split()
    if words and os.path.basename(words[0]) == "env":
        words = [w for w in words[1:] if not w.startswith("-")]
        found = shutil.which(words[0], path=path) if words else None
        words = [found] if found else []
    if words and re.fullmatch(r"python[0-9.]*", os.path.basename(words[0])):
        return words[0]
    return None


PACKAGED = Path(__file__).resolve().parent / "lib"  # where pip's build puts the sets: lib/cuda13, lib/cuda12
CHECKOUT = Path(__file__).resolve().parents[2] / "build" / "fakegpu"  # `make fakegpu`'s: the CUDA 12 set in cuda12


def library_dir(major: int | None = None) -> Path:
    """Where the stand-ins of one CUDA major are (default: this interpreter's torch's).

    The first folder that holds the whole set: $TORCHMEM_FAKEGPU_LIBS (or its cudaMAJOR folder),
    else the installed package's lib/cudaMAJOR (built by pip), else a checkout's build/fakegpu.
    """
    if major is None:
        major = torch_build().major or DEFAULT_MAJOR
    if major not in MAJORS:
        raise FakeGPUError(f"the fake GPU has stand-ins for CUDA {' and '.join(map(str, MAJORS))} builds of torch, "
                           f"not CUDA {major}")
    configured = os.environ.get("TORCHMEM_FAKEGPU_LIBS")
    wanted = libraries(major)
    if configured:
        candidates = [Path(configured), Path(configured) / f"cuda{major}"]
    else:
        candidates = [PACKAGED / f"cuda{major}", CHECKOUT if major == DEFAULT_MAJOR else CHECKOUT / f"cuda{major}"]
    for candidate in candidates:
        if all((candidate / name).is_file() for name in wanted):
            return candidate
    where = candidates[0] if not configured or major == DEFAULT_MAJOR else candidates[1]
    missing = [name for name in wanted if not (where / name).is_file()]
    raise FakeGPUError(f"the fake GPU for CUDA {major} builds of torch is not installed ({', '.join(missing)} "
                       f"missing in {where}): {build_command(major)}")


def build_command(major: int) -> str:
    """The one command that builds CUDA `major`'s set (into the package pip installs)."""
    if (CHECKOUT.parents[1] / "fakegpu" / "build.py").is_file():  # running from a checkout
        headers = "" if major == DEFAULT_MAJOR else " with CUDA 12 headers in sight (CUDA12_HOME, or a CUDA 12 torch " \
                                                    "venv: make .venv-cuda-2.6.0/.deps FAKEGPU_TORCH=2.6.0)"
        return f"run `make fakegpu` in the torchmem checkout{headers}"
    pip = "pip install --no-build-isolation --force-reinstall --no-deps <torchmem checkout or git URL>"
    if major == (torch_build().major or DEFAULT_MAJOR):
        return f"reinstall torchmem with this torch: {pip}"
    return f"reinstall torchmem with CUDA {major} headers in sight: CUDA{major}_HOME=<a CUDA {major} toolkit> {pip}"


def environment(card: str | int | Card = "80GiB", devices: int = 1, *, hold: bool = False,
                log: str | os.PathLike[str] | None = None,
                base: Mapping[str, str] | None = None, python: str | os.PathLike[str] | None = None,
                command: Sequence[str] | None = None) -> dict[str, str]:
    """The environment of a process on the fake GPU (a copy of `base`, default os.environ).

    The stand-ins are those of the CUDA major of the torch that `python` runs
    (the interpreter of `command`, else this one).
    """
    chosen = globals()["card"](card)
    if isinstance(devices, bool) or not isinstance(devices, int) or not 1 <= devices <= 64:
        raise ValueError(f"devices must be 1 to 64, not {devices!r}")
    env = dict(os.environ if base is None else base)
    if python is None and command is not None:
        python = interpreter_of(command, env.get("PATH"))
    build = torch_build(os.fspath(python) if python is not None else None)
    if build.major is not None and build.major not in MAJORS:
        raise FakeGPUError(f"torch {build.version} in {build.python} is a CUDA {build.major} build; the fake GPU has "
                           f"stand-ins for CUDA {' and '.join(map(str, MAJORS))} builds")
    major = build.major or DEFAULT_MAJOR
    folder = library_dir(major)
    ours = (RUNTIME, *blas(major), NCCL)
    stale = (RUNTIME, NCCL, *(name for m in MAJORS for name in blas(m)))
    preload = [p for p in env.get("LD_PRELOAD", "").split(":") if p and not p.endswith(stale)]
    env["LD_PRELOAD"] = ":".join([*(str(folder / name) for name in ours), *preload])
    others = [p for p in env.get("LD_LIBRARY_PATH", "").split(":")
              if p and not (Path(p) / RUNTIME).is_file()]
    env["LD_LIBRARY_PATH"] = ":".join([str(folder), *others])
    env.update({
        "TORCHMEM_FAKEGPU_MEMORY": str(chosen.memory),
        "TORCHMEM_FAKEGPU_DEVICES": str(devices),
        "TORCHMEM_FAKEGPU_CC": chosen.capability,
        "TORCHMEM_FAKEGPU_NAME": chosen.name,
        "TORCHMEM_FAKEGPU_SMS": str(chosen.multiprocessors),
        "TORCHMEM_FAKEGPU_HOLD": "1" if hold else "0",
        "TORCHMEM_FAKEGPU": "1",
    })
    if log is not None:
        env["TORCHMEM_FAKEGPU_LOG"] = os.fspath(log)
    if build.cublas:
        env.setdefault("TORCHMEM_FAKEGPU_CUBLAS_VERSION", build.cublas)
    if build.nccl:
        env.setdefault("TORCHMEM_FAKEGPU_NCCL_VERSION", build.nccl)
    return env


def run(command: Sequence[str], card: str | int | Card = "80GiB", devices: int = 1, *, hold: bool = False,
        **kwargs: Any) -> subprocess.CompletedProcess:
    """Runs a command on the fake GPU (subprocess.run's keyword arguments pass through)."""
    env = environment(card, devices, hold=hold, base=kwargs.pop("env", None), command=command)
    return subprocess.run(list(command), env=env, **kwargs)


_CHILD = """
import pickle, sys, traceback
with open(sys.argv[1], "rb") as f:
    fn, args, kwargs = pickle.load(f)
try:
    result = (True, fn(*args, **kwargs))
except BaseException as exc:
    result = (False, "".join(traceback.format_exception(exc)))
with open(sys.argv[1], "wb") as f:
    pickle.dump(result, f)
"""


def call(fn: Callable[..., Any], *args: Any, card: str | int | Card = "80GiB", devices: int = 1,
         hold: bool = False, timeout: float | None = 600, env: Mapping[str, str] | None = None,
         **kwargs: Any) -> Any:
    """Calls fn(*args, **kwargs) in a fresh interpreter on the fake GPU and returns its result.

    fn must be importable by name (a module-level function) and its arguments
    and result picklable. An exception in the child is raised here as
    FakeGPUError with the child's traceback.
    """
    with tempfile.TemporaryDirectory(prefix="torchmem-fakegpu-") as tmp:
        exchange = Path(tmp) / "call.pickle"
        exchange.write_bytes(pickle.dumps((fn, args, kwargs)))
        proc = run([sys.executable, "-c", _CHILD, str(exchange)], card, devices, hold=hold, env=env,
                   capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise FakeGPUError(f"{getattr(fn, '__qualname__', fn)} on the fake GPU: exit status {proc.returncode}\n"
                               f"{proc.stderr[-4000:]}")
        ok, value = pickle.loads(exchange.read_bytes())
    if not ok:
        raise FakeGPUError(f"{getattr(fn, '__qualname__', fn)} on the fake GPU raised:\n{value}")
    return value


def on_fake_gpu() -> bool:
    """Whether this process runs on the fake GPU (its runtime is loaded)."""
    try:
        return hasattr(ctypes.CDLL(None), "fakegpu_version")
    except OSError:
        return False


class Control:
    """The fake GPU's control API (fakegpu/include/fakegpu.h) in this process.

    Streams are torch.cuda.Stream objects or their `cuda_stream` handles;
    None is the current device's default stream.
    """

    COUNTERS = ("malloc_calls", "free_calls", "failed_mallocs", "event_records", "event_queries", "syncs",
                "kernel_launches", "memcpy_calls", "captures_begun", "captures_ended", "graph_launches",
                "capture_violations", "unimplemented_calls", "vmm_creates", "vmm_releases", "vmm_maps",
                "vmm_unmaps", "failed_calls", "pending_events")

    def __init__(self) -> None:
        if not on_fake_gpu():
            raise FakeGPUError("this process does not run on the fake GPU: start it with "
                               "`python -m torchmem.fakegpu -- ...` or torchmem.fakegpu.run()")
        lib = ctypes.CDLL(None)
        self._lib = lib
        for name, res, argtypes in [
            ("fakegpu_hold_all", None, [ctypes.c_int]),
            ("fakegpu_hold_stream", ctypes.c_int, [ctypes.c_void_p, ctypes.c_int]),
            ("fakegpu_complete_stream", ctypes.c_int, [ctypes.c_void_p]),
            ("fakegpu_complete_all", None, []),
            ("fakegpu_pending_events", ctypes.c_longlong, []),
            ("fakegpu_counter", ctypes.c_longlong, [ctypes.c_char_p]),
            ("fakegpu_reset_counters", None, []),
            ("fakegpu_device_used", ctypes.c_longlong, [ctypes.c_int]),
            ("fakegpu_device_total", ctypes.c_longlong, [ctypes.c_int]),
            ("fakegpu_set_device_total", ctypes.c_int, [ctypes.c_int, ctypes.c_ulonglong]),
            ("fakegpu_set_device_held", ctypes.c_int, [ctypes.c_int, ctypes.c_ulonglong]),
            ("fakegpu_captures_underway", ctypes.c_int, []),
        ]:
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = res, argtypes

    @staticmethod
    def _handle(stream: Any) -> int:
        if stream is None:
            return 0
        return int(getattr(stream, "cuda_stream", stream))

    def hold_all(self, on: bool = True) -> None:
        """While on, work on every stream (present and future) stays pending."""
        self._lib.fakegpu_hold_all(int(on))

    def hold(self, stream: Any = None, on: bool = True) -> None:
        """Holds one stream's work back (events recorded on it stay not ready)."""
        if self._lib.fakegpu_hold_stream(self._handle(stream), int(on)) != 0:
            raise FakeGPUError(f"unknown stream {stream!r}")

    def complete(self, stream: Any = None) -> None:
        """Completes the work recorded on one stream so far."""
        if self._lib.fakegpu_complete_stream(self._handle(stream)) != 0:
            raise FakeGPUError(f"unknown stream {stream!r}")

    def complete_all(self) -> None:
        self._lib.fakegpu_complete_all()

    @contextmanager
    def held(self, stream: Any = None) -> Iterator["Control"]:
        """Holds a stream (every stream when None) inside the block; completes its work at the end."""
        if stream is None:
            self.hold_all(True)
        else:
            self.hold(stream, True)
        try:
            yield self
        finally:
            if stream is None:
                self.hold_all(False)
                self.complete_all()
            else:
                self.hold(stream, False)
                self.complete(stream)

    def pending_events(self) -> int:
        """Event records (and host functions) whose stream has not completed them."""
        return int(self._lib.fakegpu_pending_events())

    def counter(self, name: str) -> int:
        value = int(self._lib.fakegpu_counter(name.encode()))
        if value < 0:
            raise KeyError(f"no fake GPU counter {name!r}; counters: {', '.join(self.COUNTERS)}")
        return value

    def counters(self) -> dict[str, int]:
        return {name: self.counter(name) for name in self.COUNTERS}

    def reset_counters(self) -> None:
        self._lib.fakegpu_reset_counters()

    def used(self, device: int = 0) -> int:
        """Bytes of device memory in use (cudaMalloc and cuMemCreate, in 2 MiB units)."""
        return int(self._lib.fakegpu_device_used(device))

    def total(self, device: int = 0) -> int:
        return int(self._lib.fakegpu_device_total(device))

    def set_held(self, device: int, memory: str | int) -> None:
        """Holds this much of a card's memory outside every allocator, as a CUDA context does (replaces the last)."""
        size = memory if isinstance(memory, int) else parse_memory(memory)
        if self._lib.fakegpu_set_device_held(device, size) != 0:
            raise FakeGPUError(f"cannot hold {size} bytes of device {device} ({self.used(device)} of "
                               f"{self.total(device)} in use)")

    def set_total(self, device: int, memory: str | int) -> None:
        """Changes a card's memory (not below what is in use)."""
        size = memory if isinstance(memory, int) else parse_memory(memory)
        if self._lib.fakegpu_set_device_total(device, size) != 0:
            raise FakeGPUError(f"cannot set device {device}'s memory to {size} bytes ({self.used(device)} in use)")

    def captures_underway(self) -> int:
        return int(self._lib.fakegpu_captures_underway())
