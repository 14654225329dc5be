"""A pipeline plan: an fx graph cut into K stages, one stream each, running
concurrently on successive items, passing tensors through fixed buffers.

``pipeline(graph, stages=K, in_flight=2)`` (the policy is in
csrc/core/planner/pipeline/pipeline.h):

- the graph is cut into K contiguous runs of its node order, balanced by cost
  (each node's measured wall time, or ``cost`` given), each cut
  then moved to where the fewest bytes cross it while no stage costs more
  than 5% above the balanced cut; or ``cut={node: stage}`` given;
- stage-local buffers are planned per stage, each stage in its own region
  (concurrent stages cannot share bytes);
- a tensor crossing d stage boundaries (a returned one crosses into the
  consumer of the results) gets ``d + in_flight - 1`` fixed copies: with
  ``in_flight=2``, double buffering;
- the plan is for the steady state with every stage busy, and is checked by
  writing that steady state out as a multi-stream schedule and validating it
  against stream liveness.

The result reports the peak against the sequential plan (the whole graph on
one stream) and the lower bounds, and the ideal speed-up: the sum of stage
costs over the largest stage cost.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Hashable, Mapping, Optional, Sequence, Union

from torchmem.plan.buffers import Buffer
from torchmem.plan.fx import GraphAnalysis, analyze
from torchmem.plan.solve import DEFAULT_TIME_LIMIT, METHODS, Plan
from torchmem.plan.streams import Read, Sync
from torchmem import _core

CostSpec = Union[None, Mapping[str, float], Sequence[float]]
CutSpec = Union[None, Mapping[str, int], Sequence[int]]


@dataclass
class Stage:
    """One stage: its nodes (in order), their total cost, and the plan of
    its stage-local buffers (steps are positions among the stage's nodes),
    placed at ``base``."""

    index: int
    nodes: list[str]
    cost: float
    base: int
    plan: Plan


@dataclass
class Slot:
    """A tensor crossing stage boundaries: ``copies`` fixed copies of
    ``size`` bytes from ``base``, used round robin by successive items.
    ``to_stage`` equals the number of stages for a returned tensor."""

    buffer: Hashable
    size: int
    copies: int
    base: int
    from_stage: int
    to_stage: int

    @property
    def offsets(self) -> list[int]:
        return [self.base + c * self.size for c in range(self.copies)]


@dataclass
class PipelinePlan:
    """``height``: bytes for the steady state (stage regions, then slots);
    ``lower_bound``: the stages' lower bounds plus the slots; ``sequential``:
    the whole graph planned on one stream; ``speedup``: ideal, sum of stage
    costs over the largest. ``steady_state`` (when asked for): the unrolled
    multi-stream schedule with the plan's offsets."""

    stages: list[Stage]
    slots: list[Slot]
    height: int
    lower_bound: int
    slot_bytes: int
    sequential: Plan
    speedup: float
    in_flight: int
    stage_of: dict[str, int]
    seconds: float
    steady_state: Optional[Plan] = None
    node_steps: list[list[int]] = field(default_factory=list)  # per item, per node: its step in steady_state

    @property
    def extra_bytes(self) -> int:
        """What pipelining costs in memory over the sequential plan."""
        return self.height - self.sequential.height

    def summary(self) -> str:
        mib = 2**20
        lines = [f"{len(self.stages)} stages, in_flight {self.in_flight}: {self.height / mib:,.1f} MiB "
                 f"(lower bound {self.lower_bound / mib:,.1f}), sequential {self.sequential.height / mib:,.1f} MiB "
                 f"(lower bound {self.sequential.lower_bound / mib:,.1f}); ideal speed-up {self.speedup:.2f}x"]
        for s in self.stages:
            lines.append(f"  stage {s.index}: {len(s.nodes)} nodes, cost {s.cost:.4g}, "
                         f"local {s.plan.height / mib:,.1f} MiB at {s.base:,}")
        lines.append(f"  slots: {len(self.slots)} tensors, {self.slot_bytes / mib:,.1f} MiB")
        return "\n".join(lines)

    def validate(self) -> bool:
        """True when the steady state (if kept) respects stream liveness."""
        return self.steady_state is None or self.steady_state.validate()


def _per_node(spec: Any, names: list[str], what: str, default: Any) -> Optional[list]:
    if spec is None:
        return None
    if isinstance(spec, Mapping):
        index = {n: v for v, n in enumerate(names)}
        out: list = [None] * len(names)
        for name, value in spec.items():
            if name not in index:
                raise ValueError(f"{what} names node {name!r}, which is not in the graph")
            out[index[name]] = value
        for v in range(len(out)):
            if out[v] is None:
                out[v] = default(out, v)
        return out
    values = list(spec)
    if len(values) != len(names):
        raise ValueError(f"{what}: expected one value per node ({len(names)}), got {len(values)}")
    return values


def _stage_value(value: Any, node: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"cut: node {node!r} has stage {value!r} (must be an integer)")
    return value


def _cost_value(value: Any, node: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"cost: node {node!r} has cost {value!r} (must be a number)")
    return float(value)


def graph_columns(a: GraphAnalysis) -> tuple[list[str], list[int], list[list[int]], list[bool], list[int],
                                             list[tuple[int, int]]]:
    """The graph's buffers (non-empty owned ones and workspaces) and edges, as
    the core's pipeline graph takes them (node indices in graph order)."""
    names, producer, readers, returned, size = [], [], [], [], []
    for o in a.owned:
        if o.size > 0:
            names.append(o.name)
            producer.append(o.node)
            readers.append(sorted(o.readers))
            returned.append(o.to_output)
            size.append(o.size)
    for k, (node, nbytes) in enumerate(a.workspaces):
        if nbytes > 0:
            names.append(f"{a.names[node]}.workspace{k}")
            producer.append(node)
            readers.append([])
            returned.append(False)
            size.append(nbytes)
    edges = sorted((u, v) for v in range(len(a.names)) for u in a.deps[v])
    return names, producer, readers, returned, size, edges


def pipeline(graph: Any, *example_inputs: Any, stages: int = 2, in_flight: int = 2, cost: CostSpec = None,
             cut: CutSpec = None, method: str = "auto", time_limit: Optional[float] = None, alignment: int = 1,
             steady_items: int = 0) -> PipelinePlan:
    """Plans ``graph`` (a GraphAnalysis from ``torchmem.plan.fx.analyze``, or a
    torch.fx.GraphModule run once on ``example_inputs``) as a K-stage
    pipeline; see the module docstring.

    cost: per node, {name: cost} (missing nodes cost 0) or a sequence in
    graph order; default: each node's measured wall time (``analysis.seconds``;
    a GraphModule is analysed with ``timing_runs=3``). cut: per node,
    {name: stage} (a missing node takes the stage of the node before it, 0
    at the start) or a sequence; default: balanced by cost. ``steady_items``
    > 0 keeps the unrolled steady state of that many items (a Plan of buffers
    on streams) in ``steady_state``.

    Raises ValueError for stages < 1 or more stages than nodes, in_flight <
    1, a cut that breaks a dependency (naming the node), a stage without
    nodes, bad costs, and what ``solve`` rejects.
    """
    time_limit = _checked_options(stages, in_flight, method, time_limit, alignment, steady_items)
    a = graph if isinstance(graph, GraphAnalysis) else analyze(graph, *example_inputs, timing_runs=3)
    names = a.names
    costs = _node_costs(cost, a)
    stage_of = _node_stages(cut, names)
    columns = graph_columns(a)
    r = _core.planner.plan_pipeline(names, costs, *columns, stages, in_flight, stage_of, method, float(time_limit),
                                 alignment, steady_items)
    bnames = columns[0]
    whole = _sequential_buffers(columns, len(names))
    out_stages = [_stage(k, s, names, columns, alignment) for k, s in enumerate(r["stages"])]
    slots = [Slot(bnames[s["buffer"]], s["size"], s["copies"], s["base"], s["from_stage"], s["to_stage"])
             for s in r["slots"]]
    result = PipelinePlan(out_stages, slots, r["height"], r["lower_bound"], r["slot_bytes"],
                          _plan(whole, r["sequential"], alignment), r["speedup"], in_flight,
                          dict(zip(names, r["stage_of"])), r["seconds"])
    if steady_items:
        result.steady_state, result.node_steps = _steady_state(r["unrolled"], len(names))
    return result


def _checked_options(stages: Any, in_flight: Any, method: Any, time_limit: Any, alignment: Any,
                     steady_items: Any) -> float:
    """Raises ValueError for a bad option of ``pipeline``; returns the time limit (the default for None)."""
    if isinstance(stages, bool) or not isinstance(stages, int) or stages < 1:
        raise ValueError(f"stages must be an integer >= 1, got {stages!r}")
    if isinstance(in_flight, bool) or not isinstance(in_flight, int) or in_flight < 1:
        raise ValueError(f"in_flight must be an integer >= 1 (copies of a tensor crossing one stage boundary), "
                         f"got {in_flight!r}")
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")
    if time_limit is None:
        time_limit = DEFAULT_TIME_LIMIT
    if isinstance(time_limit, bool) or not isinstance(time_limit, (int, float)) or not time_limit > 0:
        raise ValueError(f"time limit must be a number > 0, got {time_limit!r}")
    if isinstance(alignment, bool) or not isinstance(alignment, int) or alignment < 1:
        raise ValueError(f"alignment must be an integer >= 1, got {alignment!r}")
    if isinstance(steady_items, bool) or not isinstance(steady_items, int) or steady_items < 0:
        raise ValueError(f"steady_items must be an integer >= 0, got {steady_items!r}")
    return time_limit


def _node_costs(cost: CostSpec, a: GraphAnalysis) -> list[float]:
    """Each node's cost: from ``cost`` (checked), else its measured wall time (0 where the analysis has none)."""
    names = a.names
    costs = _per_node(cost, names, "cost", lambda out, v: 0.0)
    return [_cost_value(c, names[v]) for v, c in enumerate(costs)] if costs is not None else \
        (list(a.seconds) if len(a.seconds) == len(names) else [0.0] * len(names))


def _node_stages(cut: CutSpec, names: list[str]) -> list[int]:
    """Each node's stage from ``cut`` (checked); empty for none given (the core balances the cut)."""
    stage_of = _per_node(cut, names, "cut", lambda out, v: out[v - 1] if v > 0 else 0)
    return [_stage_value(s, names[v]) for v, s in enumerate(stage_of)] if stage_of is not None else []


def _sequential_buffers(columns: tuple, nodes: int) -> list[Buffer]:
    """The graph's buffers on one stream, with steps in graph order (a returned one lives to the end)."""
    bnames, producer, readers, returned, size, _ = columns
    return [Buffer(n, producer[b], (nodes + 1) if returned[b] else max([producer[b]] + readers[b]) + 1,
                   size[b]) for b, n in enumerate(bnames)]


def _stage(k: int, s: Mapping[str, Any], names: list[str], columns: tuple, alignment: int) -> Stage:
    """Stage ``k`` from the core's result ``s``: its nodes, cost, base and the plan of its local buffers
    (steps are positions among the stage's nodes)."""
    bnames, producer, readers, returned, size, _ = columns
    local = {v: i for i, v in enumerate(s["nodes"])}
    bs = [Buffer(bnames[b], local[producer[b]], max([local[producer[b]]] + [local[x] for x in readers[b]]) + 1,
                 size[b]) for b in s["buffers"]]
    return Stage(k, [names[v] for v in s["nodes"]], s["cost"], s["base"], _plan(bs, s["plan"], alignment))


def _plan(buffers: list[Buffer], r: Mapping[str, Any], alignment: int) -> Plan:
    return Plan(buffers, list(r["offsets"]), r["height"], r["lower_bound"], r["method"], r["optimal"], r["seconds"],
                alignment, r["nodes"], r.get("sharing", ""))


def _steady_state(u: Mapping[str, Any], nodes: int) -> tuple[Plan, list[list[int]]]:
    reads: dict[int, list[Read]] = {}
    for b, stream, step in u["reads"]:
        reads.setdefault(b, []).append(Read(stream, step))
    syncs = tuple(Sync(*s) for s in u["syncs"])
    bs = [Buffer(name, lo, up, size, home, reads.get(i, ()), syncs if i == 0 else ())
          for i, (name, lo, up, size, home) in enumerate(zip(u["names"], u["lower"], u["upper"], u["size"], u["home"]))]
    height = max((o + b.size for o, b in zip(u["offsets"], bs)), default=0)
    plan = Plan(bs, list(u["offsets"]), height, 0, "pipeline", False, 0.0)
    steps = list(u["node_step"])
    return plan, [steps[t * nodes:(t + 1) * nodes] for t in range(len(steps) // nodes if nodes else 0)]
