"""The fake GPU: PyTorch's CUDA build on a machine with no GPU (docs/fakegpu.md).

A CUDA build of torch runs its real caching allocator on host memory when
torchmem's fake CUDA runtime is preloaded in front of ``libcudart.so.13``.
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
import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager

from torchmem.fakegpu.cards import CARDS, Card, card, parse_memory

__all__ = ["CARDS", "Card", "Control", "FakeGPUError", "call", "card", "environment", "library_dir",
           "on_fake_gpu", "parse_memory", "run"]

RUNTIME = "libtorchmem_fakecudart.so"
BLAS = ("libcublas.so.13", "libcublasLt.so.13")  # stand-ins with the real sonames (fakegpu/cublas/)
LIBRARIES = (RUNTIME, "libcuda.so.1", "libnvidia-ml.so.1", *BLAS)


class FakeGPUError(RuntimeError):
    """The fake GPU is not built, not loaded, or a function run on it failed."""


def library_dir() -> Path:
    """Where the fake GPU's libraries are: $TORCHMEM_FAKEGPU_LIBS, else the checkout's build/fakegpu."""
    configured = os.environ.get("TORCHMEM_FAKEGPU_LIBS")
    folder = Path(configured) if configured else Path(__file__).resolve().parents[2] / "build" / "fakegpu"
    missing = [name for name in LIBRARIES if not (folder / name).is_file()]
    if missing:
        raise FakeGPUError(f"the fake GPU is not built ({', '.join(missing)} missing in {folder}): run `make fakegpu` "
                           "in the torchmem checkout, or set TORCHMEM_FAKEGPU_LIBS to the folder that has them")
    return folder


def environment(card: str | int | Card = "80GiB", devices: int = 1, *, hold: bool = False,
                log: str | os.PathLike[str] | None = None,
                base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a process on the fake GPU (a copy of `base`, default os.environ)."""
    chosen = globals()["card"](card)
    if isinstance(devices, bool) or not isinstance(devices, int) or not 1 <= devices <= 64:
        raise ValueError(f"devices must be 1 to 64, not {devices!r}")
    folder = library_dir()
    env = dict(os.environ if base is None else base)
    ours = (RUNTIME, *BLAS)
    preload = [p for p in env.get("LD_PRELOAD", "").split(":") if p and not p.endswith(ours)]
    env["LD_PRELOAD"] = ":".join([*(str(folder / name) for name in ours), *preload])
    env["LD_LIBRARY_PATH"] = ":".join(p for p in [str(folder), env.get("LD_LIBRARY_PATH", "")] if p)
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
    blas = _cublas_version()
    if blas:
        env.setdefault("TORCHMEM_FAKEGPU_CUBLAS_VERSION", blas)
    return env


def _cublas_version() -> str | None:
    """The installed nvidia-cublas wheel's version (13.1.1.3): the fake cuBLAS reports it, as the real one would."""
    from importlib import metadata

    try:
        return metadata.version("nvidia-cublas")
    except metadata.PackageNotFoundError:
        return None


def run(command: Sequence[str], card: str | int | Card = "80GiB", devices: int = 1, *, hold: bool = False,
        **kwargs: Any) -> subprocess.CompletedProcess:
    """Runs a command on the fake GPU (subprocess.run's keyword arguments pass through)."""
    env = environment(card, devices, hold=hold, base=kwargs.pop("env", None))
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
                "vmm_unmaps", "pending_events")

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

    def set_total(self, device: int, memory: str | int) -> None:
        """Changes a card's memory (not below what is in use)."""
        size = memory if isinstance(memory, int) else parse_memory(memory)
        if self._lib.fakegpu_set_device_total(device, size) != 0:
            raise FakeGPUError(f"cannot set device {device}'s memory to {size} bytes ({self.used(device)} in use)")

    def captures_underway(self) -> int:
        return int(self._lib.fakegpu_captures_underway())
