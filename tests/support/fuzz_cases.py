"""Damaged snapshots and traces for the fuzzer (tests/replay/test_fuzz_snapshots.py, benchmarks/fuzz_snapshots.py).

A case is a base file (one of the four real snapshots kept as figures in
tests/data/native, or JSON lines) and one damage, chosen from a seed:
truncation, a wrong type in a field, a missing key, a negative, zero or
huge size, an overlapping or unaligned address, a free of an unknown
address, a double free, an ``oom`` with no request, thousands of devices,
deeply nested frames. ``write_case`` writes it as the file a user would
give (a pickle, a JSON snapshot or JSON lines) and ``check_case`` runs every
reader on it: each must finish, or raise TraceError naming the file.
"""
from __future__ import annotations

import copy
import gzip
import json
import os
import pickle
import random
import time
from typing import Any, Callable

NATIVE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "native")
BASES = ("hugepandacoder", "maphsge4", "nesta_gitu", "niuhuangxiaozi")
KINDS = ("truncate", "wrong_type", "missing_key", "size", "address", "unknown_free", "double_free", "oom_no_request",
         "many_devices", "deep_frames")
WRONG_VALUES: list[Any] = [None, "x", "", -1, 1.5, float("nan"), True, [], {}, [1, 2], {"a": 1}, 2**64, 2**70, -(2**63),
                           b"bytes", (1, 2)]
SIZES = [0, -1, -(2**63), 1, 2**31, 2**48, 2**62, 2**63 - 1, 2**63, 2**64 - 1, 2**64, 2**100]
_cache: dict[str, dict] = {}


def base(name: str) -> dict:
    if name not in _cache:
        with gzip.open(os.path.join(NATIVE, f"{name}.json.gz"), "rt") as f:
            _cache[name] = json.load(f)
    return copy.deepcopy(_cache[name])


def _entries(snap: dict) -> list[tuple[int, list]]:
    return [(d, t) for d, t in enumerate(snap["device_traces"]) if isinstance(t, list) and t]


def _pick_entry(rng: random.Random, snap: dict) -> dict:
    _, trace = rng.choice(_entries(snap))
    return rng.choice(trace)


def _pick_container(rng: random.Random, snap: dict) -> dict:
    """A trace entry, a segment or a block."""
    roll = rng.random()
    if roll < 0.6 or not snap["segments"]:
        return _pick_entry(rng, snap)
    seg = rng.choice(snap["segments"])
    return seg if roll < 0.8 or not seg["blocks"] else rng.choice(seg["blocks"])


def damage(snap: dict, kind: str, rng: random.Random) -> dict:
    """Apply one damage of `kind` to a snapshot dict (in place); returns it."""
    if kind == "wrong_type":
        target = _pick_container(rng, snap)
        key = rng.choice(sorted(target))
        target[key] = rng.choice(WRONG_VALUES)
    elif kind == "missing_key":
        target = _pick_container(rng, snap)
        del target[rng.choice(sorted(target))]
    elif kind == "size":
        target = _pick_container(rng, snap)
        target["size" if "size" in target else "total_size"] = rng.choice(SIZES)
    elif kind == "address":
        entry = _pick_entry(rng, snap)
        other = _pick_entry(rng, snap)
        key = "addr" if "addr" in entry else "device_free"
        entry[key] = rng.choice([other.get("addr", 0), entry.get(key, 0) + rng.choice([1, 8, 511, -1]),
                                 2**64 - 1, 2**64, -1])
    elif kind in ("unknown_free", "double_free"):
        d, trace = rng.choice(_entries(snap))
        frees = [i for i, e in enumerate(trace) if e.get("action", "").startswith("free")]
        at = rng.randrange(len(trace) + 1)
        if kind == "double_free" and frees:
            i = rng.choice(frees)
            at = rng.randrange(i, len(trace) + 1)
            trace.insert(at, dict(trace[i]))
        else:
            trace.insert(at, {"action": rng.choice(["free_requested", "free_completed"]),
                              "addr": rng.randrange(1, 2**48), "size": rng.randrange(1, 2**30), "stream": 0})
    elif kind == "oom_no_request":
        d, trace = rng.choice(_entries(snap))
        entry = {"action": "oom", "device_free": rng.randrange(0, 2**34), "stream": 0}
        if rng.random() < 0.3:
            entry = {"action": "oom", "size": rng.randrange(1, 2**34), "stream": 0}  # no device_free
        trace.insert(rng.randrange(len(trace) + 1), entry)
    elif kind == "many_devices":
        n = rng.choice([1000, 5000, 20000])
        traces = snap["device_traces"]
        if rng.random() < 0.5:
            snap["device_traces"] = [[] for _ in range(n)] + traces
            for seg in snap["segments"]:
                seg["device"] = seg.get("device", 0) + n
        else:
            for seg in snap["segments"]:
                seg["device"] = rng.choice([0, n, 2**40])
    elif kind == "deep_frames":
        pass  # written as bytes by write_case (a pickle cannot be made of them with pickle.dumps)
    return snap


def _deep_list_pickle(depth: int) -> bytes:
    """Pickle opcodes (protocol 2, no frames) of a list nested `depth` deep."""
    return b"]" * depth + b"a" * (depth - 1)


def write_case(path: str, seed: int, kind: str | None = None, fmt: str | None = None) -> dict:
    """Write one damaged file at `path`; returns what was done (base, kind, format, seed)."""
    rng = random.Random(seed)
    kind = kind or rng.choice(KINDS)
    name = rng.choice(BASES)
    fmt = fmt or rng.choice(["pickle", "pickle", "json", "jsonl"])
    if fmt == "jsonl":
        return _write_jsonl_case(path, rng, kind, seed)
    snap = damage(base(name), kind, rng) if kind not in ("truncate", "deep_frames") else base(name)
    if kind == "deep_frames":
        depth = rng.choice([100, 5000, 200_000])
        entry = _pick_entry(rng, snap)
        entry["frames"] = "__DEEP__"
        if fmt == "json":
            data = json.dumps(snap, default=str).replace('"__DEEP__"', "[" * depth + "]" * depth).encode()
        else:
            data = pickle.dumps(snap, protocol=2).replace(b"X\x08\x00\x00\x00__DEEP__", _deep_list_pickle(depth), 1)
    elif fmt == "json":
        data = json.dumps(snap, default=str).encode()
    else:
        data = pickle.dumps(snap, protocol=rng.choice([2, 3, 4, 5]))
    if kind == "truncate":
        data = data[: rng.randrange(len(data))]
    with open(path, "wb") as f:
        f.write(data)
    return {"seed": seed, "base": name, "kind": kind, "format": fmt}


def _write_jsonl_case(path: str, rng: random.Random, kind: str, seed: int) -> dict:
    events: list[dict] = []
    live: list[int] = []
    for i in range(rng.randrange(1, 400)):
        if live and rng.random() < 0.45:
            events.append({"op": "free", "id": live.pop(rng.randrange(len(live)))})
        else:
            events.append({"op": "alloc", "id": i, "size": rng.randrange(1, 64 << 20), "stream": rng.randrange(2)})
            live.append(i)
    e = rng.choice(events)
    if kind == "wrong_type":
        e[rng.choice(["op", "id", "size", "stream"])] = rng.choice(WRONG_VALUES[:13])
    elif kind == "missing_key":
        e.pop(rng.choice(["op", "id", "size", "stream"]), None)
    elif kind == "size":
        e["size"] = rng.choice([s for s in SIZES if abs(s) < 2**70])
    elif kind in ("unknown_free", "double_free", "address"):
        events.insert(rng.randrange(len(events) + 1), {"op": "free", "id": rng.choice([e["id"], 10**9])})
    lines = []
    for ev in events:
        try:
            lines.append(json.dumps(ev))
        except (TypeError, ValueError):
            lines.append(repr(ev))  # bytes or a tuple: not JSON, as a user's broken writer would leave it
    data = ("\n".join(lines) + "\n").encode()
    if kind == "deep_frames":
        data += b'{"op": "alloc", "id": 1, "size": ' + b"[" * 100_000 + b"\n"
    if kind == "truncate":
        data = data[: rng.randrange(len(data))]
    with open(path, "wb") as f:
        f.write(data)
    return {"seed": seed, "base": "jsonl", "kind": kind, "format": "jsonl"}


def readers() -> list[tuple[str, Callable[[str], Any]]]:
    """Every reader of a user's file, as the commands call them."""
    from torchmem import replay as sim
    from torchmem.formats.snapshot_format import load
    from torchmem.viz.ranks import rank_row
    from torchmem.viz.timeline import timeline
    from torchmem.viz.totals import totals

    def replay(path: str) -> Any:
        return sim.replay(path)

    def snapshot_views(path: str) -> Any:
        snap = load(path)
        totals(snap)
        rank_row(snap, path, 0, 5)
        if any(isinstance(t, list) and t for t in snap.get("device_traces") or []):
            timeline(snap)

    def viz(path: str) -> Any:
        from torchmem.viz.html import write_html

        snap = load(path)
        write_html(snap, path + ".html", title="fuzz")
        os.remove(path + ".html")

    def command_line(path: str) -> Any:
        """`torchmem replay FILE --json` as a user runs it: exit 0 or 1 with one line, never an internal error."""
        import contextlib
        import io

        from torchmem.cli import main
        from torchmem.formats.trace_types import TraceError

        err, out = io.StringIO(), io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            status = main(["replay", path, "--no-progress", "--json"])
        text = err.getvalue()
        if status == 1:
            if text.count("\n") != 1 or "internal error" in text or path not in text:
                raise Failure(f"torchmem replay: {text[:300]!r}")
            raise TraceError(text.strip())
        if status != 0:
            raise Failure(f"torchmem replay: exit status {status}: {text[:300]!r}")

    return [("replay", replay), ("stats/ranks/plot", snapshot_views), ("viz", viz), ("cli", command_line)]


class Failure(Exception):
    """A case that crashed a reader (an exception other than TraceError, or a TraceError not naming the file)."""


def check_case(path: str, time_limit: float = 60.0) -> dict[str, str]:
    """Run every reader on `path`: {reader: "ok" | "TraceError"}; Failure for anything else."""
    from torchmem.formats.trace_types import TraceError

    out = {}
    for name, read in readers():
        start = time.perf_counter()
        try:
            read(path)
            out[name] = "ok"
        except TraceError as exc:
            message = str(exc)
            if path not in message or "\n" in message:
                raise Failure(f"{name}: TraceError not naming the file on one line: {message[:300]}") from None
            out[name] = "TraceError"
        except FileNotFoundError:
            raise
        except Exception as exc:
            raise Failure(f"{name}: {type(exc).__name__}: {str(exc)[:300]}") from exc
        if time.perf_counter() - start > time_limit:
            raise Failure(f"{name}: took {time.perf_counter() - start:.1f} s")
    return out
