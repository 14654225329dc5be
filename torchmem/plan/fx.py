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


def analyze(gm: Any, *example_inputs: Any, timing_runs: int = 0) -> GraphAnalysis:
    """Runs ``gm`` (a torch.fx.GraphModule, e.g. from torch.fx.symbolic_trace
    or torch.export(...).module()) once on the inputs and records buffers.
    ``timing_runs`` > 0: node times from that many more runs (median)."""
    import torch
    import torch.fx
    from torch.fx.passes.shape_prop import _extract_tensor_metadata

    if not isinstance(gm, torch.fx.GraphModule):
        raise ValueError(f"expected a torch.fx.GraphModule, got {type(gm).__name__}")
    nodes = list(gm.graph.nodes)
    index = {n: i for i, n in enumerate(nodes)}
    storage_owner: dict[int, Optional[int]] = {}  # storage key -> owned index (None: external)
    node_storages: dict[int, list[int]] = {}      # node -> storage keys of its output
    owned: list[_Owned] = []
    workspaces: list[tuple[int, int]] = []
    deps: list[set] = [set() for _ in nodes]
    last_writer: dict[int, int] = {}              # storage key -> last in-place writer
    readers_of: dict[int, list[int]] = {}         # storage key -> nodes that read it so far

    keep_alive: list = []  # storages stay allocated so their addresses stay unique

    def key(t: Any) -> int:
        storage = t.untyped_storage()
        keep_alive.append(storage)
        return storage.data_ptr()

    for name, t in list(gm.named_parameters()) + list(gm.named_buffers()):
        storage_owner.setdefault(key(t), None)

    seconds = [0.0] * len(nodes)

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n: Any) -> Any:
            start = time.perf_counter()
            try:
                return self._record(n)
            finally:
                seconds[index[n]] = time.perf_counter() - start

        def _record(self, n: Any) -> Any:
            v = index[n]
            inputs = n.all_input_nodes
            for u in inputs:
                deps[v].add(index[u])
            in_keys = {k for u in inputs for k in node_storages.get(index[u], [])}
            for k in in_keys:
                # Order against in-place writers of what this node reads.
                if k in last_writer and last_writer[k] != v:
                    deps[v].add(last_writer[k])
                o = storage_owner.get(k)
                if o is not None:
                    owned[o].readers.add(v)
                readers_of.setdefault(k, []).append(v)
            result = super().run_node(n)
            if n.op == "output":
                for k in in_keys:
                    o = storage_owner.get(k)
                    if o is not None:
                        owned[o].to_output = True
                return result
            tensors = _tensors(result)
            keys = []
            for t in tensors:
                k = key(t)
                keys.append(k)
                if k in storage_owner:
                    if k in in_keys and n.op not in ("placeholder", "get_attr") and _writes(n, t, in_keys):
                        for r in readers_of.get(k, []):
                            if r != v:
                                deps[v].add(r)
                        last_writer[k] = v
                    continue
                if n.op in ("placeholder", "get_attr"):
                    storage_owner[k] = None
                    continue
                storage_owner[k] = len(owned)
                suffix = "" if len(tensors) == 1 else f".{len(keys) - 1}"
                owned.append(_Owned(n.name + suffix, v, int(t.untyped_storage().nbytes())))
            node_storages[v] = keys
            if tensors:
                meta = [_extract_tensor_metadata(t) for t in tensors]
                n.meta["tensor_meta"] = meta[0] if isinstance(result, torch.Tensor) else meta
            fn = _workspace_fn(gm, n)
            if fn is not None:
                args = tuple(self.env[u] for u in inputs)
                size = int(fn(n, args))
                if size < 0:
                    raise ValueError(f"workspace of {n.name} is negative ({size})")
                workspaces.append((v, size))
            return result

    with torch.no_grad():
        Recorder(gm).run(*example_inputs)
    seconds = [0.0 if n.op in _FREE_OPS else t for n, t in zip(nodes, seconds)]
    if timing_runs:
        seconds = measure_seconds(gm, *example_inputs, runs=timing_runs)
    output = next((i for i, n in enumerate(nodes) if n.op == "output"), -1)
    return GraphAnalysis([n.name for n in nodes], owned, workspaces, deps, list(range(len(nodes))), seconds, output)


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
