"""Buffers of a torch.fx graph, from running it once on example inputs.

``analyze(gm, *inputs)`` runs the GraphModule node by node (shape
propagation with real tensors: every node gets ``meta["tensor_meta"]``) and
watches storages:

- a node whose output uses a storage no earlier value uses owns a new
  buffer of that storage's bytes, live from its step through the step of the
  last node that reads it (directly or through a view);
- a view (``view``, ``permute``, ``getitem`` of ``split``, ``reshape`` that
  did not copy, ...) creates no buffer: it shares its base's storage and
  keeps the base alive while it is used;
- an in-place op (``add_``, ``ReLU(inplace=True)``, ...) writes an existing
  storage: no buffer, and the base stays alive through it;
- parameters, buffers and inputs live outside the plan; values returned by
  the graph stay live until the end;
- an operator may declare scratch space with ``register_workspace(target,
  fn)``, ``fn(node, args) -> bytes``: a buffer live during that op's step.

Steps are positions in an execution order: the graph's own, or one from
``GraphAnalysis.schedule()`` (peak-aware reordering).

Streams: ``buffers(streams={node name: stream})`` runs each node on a
stream (default 0). A buffer is produced on its producer's stream and read
on its readers'; every dependency between nodes on different streams becomes
a sync (the consumer waits for the producer, as ``wait_stream`` would), and
at the output node every stream waits for every other (the join that ends
the graph). A read on another stream keeps its buffer live until a sync leads
back to the buffer's stream: the next dependency that does, else the join.

Each node's wall time is kept (``seconds``), the cost model of
``torchmem.plan.pipeline``: from the recorded run itself (which pays every
first-call cost), or with ``timing_runs=N`` the median of N further runs;
placeholders, attributes and the output node cost 0.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Mapping, Optional, Sequence

from torchmem.plan.buffers import Buffer
from torchmem.plan.solve import Plan, lower_bound, solve
from torchmem.plan.streams import Read, Sync, check_stream
from torchmem import _core

WorkspaceFn = Callable[[Any, tuple], int]
_WORKSPACES: dict[Any, WorkspaceFn] = {}


def register_workspace(target: Any, fn: WorkspaceFn) -> None:
    """Declares that ``target`` (a function, a method name or a module
    class) needs ``fn(node, args)`` bytes of scratch space while it runs."""
    if not callable(fn):
        raise ValueError("workspace fn must be callable")
    _WORKSPACES[target] = fn


def unregister_workspace(target: Any) -> None:
    _WORKSPACES.pop(target, None)


@dataclass
class _Owned:
    name: str          # buffer id
    node: int          # index of the producing node
    size: int
    readers: set = field(default_factory=set)  # node indices that read it (directly or via a view)
    to_output: bool = False


@dataclass
class GraphAnalysis:
    """What one run of the graph showed: nodes in graph order, the buffers
    they own, who reads them, and the dependencies between nodes."""

    names: list[str]
    owned: list[_Owned]
    workspaces: list[tuple[int, int]]          # (node index, bytes)
    deps: list[set]                            # deps[v] = nodes that must run before v
    graph_order: list[int]
    seconds: list[float] = field(default_factory=list)  # per node, wall time in the recorded run
    output: int = -1                           # index of the output node (-1: none)

    def stream_of(self, streams: Optional[Mapping[str, int]]) -> list[int]:
        """Per node, its stream from ``{node name: stream}`` (default 0);
        ValueError naming an unknown node or a bad stream."""
        out = [0] * len(self.names)
        if not streams:
            return out
        index = {name: v for v, name in enumerate(self.names)}
        for name, stream in streams.items():
            if name not in index:
                raise ValueError(f"stream assignment names node {name!r}, which is not in the graph")
            out[index[name]] = check_stream(stream, f"node {name!r}: stream")
        return out

    def buffers(self, order: Optional[Sequence[int]] = None,
                streams: Optional[Mapping[str, int]] = None) -> list[Buffer]:
        """Buffers with lifetimes in steps of ``order`` (default: graph order),
        on the streams of ``streams`` ({node name: stream}, default all 0)."""
        order = list(self.graph_order if order is None else order)
        pos = {v: i for i, v in enumerate(order)}
        end = len(order)
        stream = self.stream_of(streams)
        syncs = self._syncs(order, pos, stream) if any(stream) else {}
        out = []
        for o in self.owned:
            if o.size == 0:
                continue
            start, home = pos[o.node], stream[o.node]
            last = max([pos[r] for r in o.readers if stream[r] == home] + [start])
            upper = end + 1 if o.to_output else last + 1
            # The output node only hands returned values back; they live to the end.
            reads = sorted(Read(stream[r], pos[r]) for r in o.readers if stream[r] != home and r != self.output)
            out.append(Buffer(o.name, start, upper, o.size, home, reads, syncs.pop(o.node, ())))
        for k, (node, size) in enumerate(self.workspaces):
            if size > 0:
                out.append(Buffer(f"{self.names[node]}.workspace{k}", pos[node], pos[node] + 1, size, stream[node]))
        rest = [s for group in syncs.values() for s in group]
        if rest and out:
            out[0] = Buffer(out[0].id, out[0].lower, out[0].upper, out[0].size, out[0].stream, out[0].reads,
                            tuple(out[0].syncs) + tuple(rest))
        return out

    def _syncs(self, order: list[int], pos: dict, stream: list[int]) -> dict[int, tuple[Sync, ...]]:
        """Syncs by the node they start from: one per dependency across
        streams, and the join at the output node (every stream waits for
        every other)."""
        found: dict[int, set] = {}
        for v in order:
            for u in self.deps[v]:
                if stream[u] != stream[v]:
                    found.setdefault(u, set()).add(Sync(stream[u], pos[u], stream[v], pos[v]))
        if self.output >= 0 and self.output in pos:
            at = pos[self.output]
            last: dict[int, int] = {}
            for v in order:
                if pos[v] < at:
                    last[stream[v]] = v
            for s, v in last.items():
                for h in set(stream):
                    if h != s:
                        found.setdefault(v, set()).add(Sync(s, pos[v], h, at))
        return {u: tuple(sorted(group)) for u, group in found.items()}

    def peak(self, order: Optional[Sequence[int]] = None) -> int:
        return lower_bound(self.buffers(order))

    def schedule(self) -> tuple[list[int], int, int]:
        """A topological order with a lower peak of live bytes (least-peak-
        first, then swaps of independent neighbours); returns (order,
        peak before, peak after). Workspaces are not part of the model."""

        n = len(self.names)
        out_bytes = [0] * n
        users: list[list[int]] = [[] for _ in range(n)]
        sink = n  # a final node that reads everything returned
        for o in self.owned:
            # One buffer per owner node in the model; fold several into one.
            out_bytes[o.node] += o.size
            users[o.node].extend(sorted(o.readers))
            if o.to_output:
                users[o.node].append(sink)
        edges = [(u, v) for v in range(n) for u in self.deps[v]]
        edges += [(v, sink) for v in range(n)]
        out_bytes.append(0)
        users.append([])
        order, before, after = _core.planner.schedule(n + 1, edges, out_bytes, [sorted(set(u)) for u in users],
                                                    self.graph_order + [sink])
        order = [v for v in order if v != sink]
        return order, self.peak(self.graph_order), self.peak(order)


def _tensors(value: Any) -> list:
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []


def _workspace_fn(gm: Any, node: Any) -> Optional[WorkspaceFn]:
    if node.op == "call_module":
        mod = gm.get_submodule(node.target)
        return _WORKSPACES.get(type(mod))
    return _WORKSPACES.get(node.target)


_FREE_OPS = ("placeholder", "get_attr", "output")


def measure_seconds(gm: Any, *example_inputs: Any, runs: int = 3) -> list[float]:
    """Each node's median wall time over ``runs`` runs of ``gm`` node by node
    (run it once before, to pay first-call costs); placeholders, attributes
    and the output node cost 0."""
    import torch
    import torch.fx

    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 1:
        raise ValueError(f"runs must be an integer >= 1, got {runs!r}")
    nodes = list(gm.graph.nodes)
    index = {n: i for i, n in enumerate(nodes)}
    samples: list[list[float]] = [[] for _ in nodes]

    class Timer(torch.fx.Interpreter):
        def run_node(self, n: Any) -> Any:
            start = time.perf_counter()
            try:
                return super().run_node(n)
            finally:
                samples[index[n]].append(time.perf_counter() - start)

    with torch.no_grad():
        for _ in range(runs):
            Timer(gm).run(*example_inputs)
    return [0.0 if n.op in _FREE_OPS else statistics.median(s) for n, s in zip(nodes, samples)]


@dataclass
class _Recording:
    """What the recorded run has seen so far: the storages of values, the buffers they own, who reads and
    writes them, and each node's wall time."""

    nodes: list
    index: dict                                   # node -> its position in graph order
    storage_owner: dict[int, Optional[int]] = field(default_factory=dict)  # storage key -> owned index (None: external)
    node_storages: dict[int, list[int]] = field(default_factory=dict)      # node -> storage keys of its output
    owned: list[_Owned] = field(default_factory=list)
    workspaces: list[tuple[int, int]] = field(default_factory=list)        # (node index, bytes)
    deps: list[set] = field(default_factory=list)                          # deps[v] = nodes that must run before v
    last_writer: dict[int, int] = field(default_factory=dict)              # storage key -> last in-place writer
    readers_of: dict[int, list[int]] = field(default_factory=dict)         # storage key -> nodes that read it so far
    keep_alive: list = field(default_factory=list)  # storages stay allocated so their addresses stay unique
    seconds: list[float] = field(default_factory=list)                     # per node, wall time in the run

    def key(self, t: Any) -> int:
        """The key of ``t``'s storage (its address), kept allocated for the rest of the run."""
        storage = t.untyped_storage()
        self.keep_alive.append(storage)
        return storage.data_ptr()


def _start_recording(gm: Any) -> _Recording:
    """An empty recording of ``gm``'s nodes, its parameters and buffers known as external storages."""
    nodes = list(gm.graph.nodes)
    rec = _Recording(nodes, {n: i for i, n in enumerate(nodes)}, deps=[set() for _ in nodes],
                     seconds=[0.0] * len(nodes))
    for name, t in list(gm.named_parameters()) + list(gm.named_buffers()):
        rec.storage_owner.setdefault(rec.key(t), None)
    return rec


def _record_reads(rec: _Recording, v: int, inputs: list) -> set[int]:
    """Records node ``v``'s reads of its inputs (dependencies, readers of their storages); returns the storage
    keys it reads."""
    for u in inputs:
        rec.deps[v].add(rec.index[u])
    in_keys = {k for u in inputs for k in rec.node_storages.get(rec.index[u], [])}
    for k in in_keys:
        # Order against in-place writers of what this node reads.
        if k in rec.last_writer and rec.last_writer[k] != v:
            rec.deps[v].add(rec.last_writer[k])
        o = rec.storage_owner.get(k)
        if o is not None:
            rec.owned[o].readers.add(v)
        rec.readers_of.setdefault(k, []).append(v)
    return in_keys


def _mark_returned(rec: _Recording, in_keys: set[int]) -> None:
    """Marks the buffers the output node reads as returned by the graph."""
    for k in in_keys:
        o = rec.storage_owner.get(k)
        if o is not None:
            rec.owned[o].to_output = True


def _record_outputs(rec: _Recording, n: Any, v: int, tensors: list, in_keys: set[int]) -> list[int]:
    """Records the storages of node ``v``'s output tensors (a new buffer for a storage no earlier value uses,
    an in-place write of one it read); returns their storage keys."""
    keys = []
    for t in tensors:
        k = rec.key(t)
        keys.append(k)
        if k in rec.storage_owner:
            if k in in_keys and n.op not in ("placeholder", "get_attr") and _writes(n, t, in_keys):
                for r in rec.readers_of.get(k, []):
                    if r != v:
                        rec.deps[v].add(r)
                rec.last_writer[k] = v
            continue
        if n.op in ("placeholder", "get_attr"):
            rec.storage_owner[k] = None
            continue
        rec.storage_owner[k] = len(rec.owned)
        suffix = "" if len(tensors) == 1 else f".{len(keys) - 1}"
        rec.owned.append(_Owned(n.name + suffix, v, int(t.untyped_storage().nbytes())))
    return keys


def _set_tensor_meta(n: Any, result: Any, tensors: list) -> None:
    """Sets ``n.meta["tensor_meta"]`` as shape propagation does: one entry for a tensor, a list otherwise."""
    import torch
    from torch.fx.passes.shape_prop import _extract_tensor_metadata

    meta = [_extract_tensor_metadata(t) for t in tensors]
    n.meta["tensor_meta"] = meta[0] if isinstance(result, torch.Tensor) else meta


def _workspace_bytes(fn: WorkspaceFn, n: Any, args: tuple) -> int:
    """The bytes of scratch space ``fn`` declares for node ``n``; ValueError when negative."""
    size = int(fn(n, args))
    if size < 0:
        raise ValueError(f"workspace of {n.name} is negative ({size})")
    return size


def _recorder(gm: Any, rec: _Recording) -> Any:
    """An fx Interpreter over ``gm`` that records every node it runs, and its wall time, into ``rec``."""
    import torch.fx

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n: Any) -> Any:
            start = time.perf_counter()
            try:
                return self._record(n)
            finally:
                rec.seconds[rec.index[n]] = time.perf_counter() - start

        def _record(self, n: Any) -> Any:
            v = rec.index[n]
            inputs = n.all_input_nodes
            in_keys = _record_reads(rec, v, inputs)
            result = super().run_node(n)
            if n.op == "output":
                _mark_returned(rec, in_keys)
                return result
            tensors = _tensors(result)
            rec.node_storages[v] = _record_outputs(rec, n, v, tensors, in_keys)
            if tensors:
                _set_tensor_meta(n, result, tensors)
            fn = _workspace_fn(gm, n)
            if fn is not None:
                rec.workspaces.append((v, _workspace_bytes(fn, n, tuple(self.env[u] for u in inputs))))
            return result

    return Recorder(gm)


def analyze(gm: Any, *example_inputs: Any, timing_runs: int = 0) -> GraphAnalysis:
    """Runs ``gm`` (a torch.fx.GraphModule, e.g. from torch.fx.symbolic_trace
    or torch.export(...).module()) once on the inputs and records buffers.
    ``timing_runs`` > 0: node times from that many more runs (median)."""
    import torch
    import torch.fx

    if not isinstance(gm, torch.fx.GraphModule):
        raise ValueError(f"expected a torch.fx.GraphModule, got {type(gm).__name__}")
    rec = _start_recording(gm)
    with torch.no_grad():
        _recorder(gm, rec).run(*example_inputs)
    nodes = rec.nodes
    seconds = [0.0 if n.op in _FREE_OPS else t for n, t in zip(nodes, rec.seconds)]
    if timing_runs:
        seconds = measure_seconds(gm, *example_inputs, runs=timing_runs)
    output = next((i for i, n in enumerate(nodes) if n.op == "output"), -1)
    return GraphAnalysis([n.name for n in nodes], rec.owned, rec.workspaces, rec.deps, list(range(len(nodes))),
                         seconds, output)


def _writes(node: Any, out: Any, in_keys: set) -> bool:
    """True when the node returned an input's storage because it wrote it
    (an in-place op), False for a view."""
    target = node.target
    name = target if isinstance(target, str) else getattr(target, "__name__", "")
    if name.endswith("_") and not name.endswith("__"):
        return True
    if node.op == "call_module":
        return bool(getattr(node.graph.owning_module.get_submodule(node.target), "inplace", False))
    return bool(node.kwargs.get("inplace", False))


@dataclass
class GraphPlan:
    """A planned graph: the plan of its buffers, the order it assumes, and
    the peak of live bytes before and after reordering."""

    plan: Plan
    order: list[str]
    naive_bytes: int
    peak_before: int
    peak_after: int


def plan_graph(gm: Any, *example_inputs: Any, method: str = "auto", reorder: bool = False,
               time_limit: Optional[float] = None, alignment: int = 1,
               analysis: Optional[GraphAnalysis] = None, streams: Optional[Mapping[str, int]] = None,
               sharing: str = "auto") -> GraphPlan:
    """Analyzes (unless given ``analysis``), optionally reorders, and solves.
    ``streams``: {node name: stream} (see the module docstring); ``sharing``
    as in ``solve``."""
    a = analysis if analysis is not None else analyze(gm, *example_inputs)
    before = a.peak()
    if reorder:
        order, before, after = a.schedule()
        if after > before:
            order, after = a.graph_order, before
    else:
        order, after = a.graph_order, before
    buffers = a.buffers(order, streams)
    plan = solve(buffers, method=method, time_limit=time_limit, alignment=alignment, sharing=sharing)
    return GraphPlan(plan, [a.names[v] for v in order], sum(b.size for b in buffers), before, after)
