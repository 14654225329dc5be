"""Unpickling a file from a stranger: data only, never code.

A memory snapshot is a tree of plain values. ``pickle.load`` would also run
whatever a hostile pickle names (``os.system`` through a global and
``REDUCE``), so every pickle torchmem reads goes through ``load_plain()``,
which checks twice:

1. Before anything is unpickled, the C++ scan (``csrc/core/traces/pickle_scan.h``)
   walks the opcode stream and accepts only the opcodes that build dicts,
   lists, tuples, str, bytes, int, float, bool and None (with the stack,
   mark, memo and frame opcodes around them). Any global (``GLOBAL``,
   ``STACK_GLOBAL``, ``INST``, ``OBJ``, the extension codes), any call or
   state (``REDUCE``, ``BUILD``, ``NEWOBJ``), persistent ids, out-of-band
   buffers, sets, frozensets and bytearrays end the load, the error naming
   what was asked for (``it names posix.system (STACK_GLOBAL)``) and its
   byte offset. So does a pickle that ends before its ``STOP``.
2. The unpickler that then runs refuses every global and persistent id as
   well (``find_class``, ``persistent_load``), so a gap in the scan could
   not run code either.

The types PyTorch's snapshots hold (``torch.cuda.memory._snapshot()`` as
``_dump_snapshot()`` pickles it in torch 2.11 and 2.13: dicts with str
keys, lists, the ``segment_pool_id`` tuple, int, float, bool, str, None;
frames as dicts) and torchmem's own dumps are all plain, so no name needs to
be allowed (docs/snapshots.md). Pickles of protocols 0 to 2 that hold bytes
are refused: they need the global ``_codecs.encode``.

The file is read into memory and unpickled from there, so a length field of
a damaged pickle cannot make the reader ask the file for more than it holds.
"""
from __future__ import annotations

import contextlib
import gc
import io
import pickle
from typing import Any, Iterator

from torchmem import _core

PLAIN_TYPES = (dict, list, tuple, str, bytes, int, float, bool, type(None))


class UnsafePickleError(pickle.UnpicklingError):
    """A pickle that asks for more than plain data: says what and where."""


class DamagedPickleError(pickle.UnpicklingError):
    """A pickle cut short, or with bytes that are not opcodes: says where."""


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise UnsafePickleError(f"it names {module}.{name}: code or a class, not plain data")

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafePickleError("it holds a persistent id: a reference to an object outside the file")


def loads_plain(data: bytes, drop_key: str | None = None) -> Any:
    """Unpickle `data`, refusing everything but plain data (UnsafePickleError, nothing run).

    With `drop_key`, every value of that dict key comes back as an empty list,
    unbuilt (csrc/core/traces/pickle_strip.h: the replay drops "frames", most of a
    big snapshot); where the rewrite cannot be sure, everything is built.
    """
    plain, offset, problem = _core.scan_plain_pickle(data)
    if not plain:
        damaged = problem.startswith("it ends") or "is not a pickle opcode" in problem
        raise (DamagedPickleError if damaged else UnsafePickleError)(f"{problem} (byte {offset:,})")
    if drop_key is not None:
        stripped = _core.strip_pickle_key(data, drop_key)
        if stripped is not None:
            data = stripped
    with gc_paused():
        return _PlainUnpickler(io.BytesIO(data)).load()


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off while millions of dicts and lists are built and read: each new one
    counts towards a collection that walks all of them again and again (unpickling a million entries
    2.4x faster). A plain tree has no cycles to collect."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def load_plain(path: str, drop_key: str | None = None) -> Any:
    """Unpickle the file at `path`, refusing everything but plain data (UnsafePickleError, nothing run)."""
    with open(path, "rb") as f:
        data = f.read()
    return loads_plain(data, drop_key)
