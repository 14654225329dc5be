"""Static memory planning: give every buffer an offset in one slab.

When the lifetimes of all buffers are known ahead (a fixed-shape graph, one
training step, a CUDA-graph capture), buffers that never live at the same
time can share bytes. ``solve`` places them; the slab's height is compared
with the lower bound (the most bytes live at one instant)::

    from torchmem.plan import Buffer, solve
    plan = solve([Buffer("a", 0, 3, 4), Buffer("b", 3, 9, 4), Buffer("c", 0, 9, 4)])
    plan.height, plan.lower_bound, plan.offsets

Sources of buffers: MiniMalloc CSV files (``load_csv``), recorded alloc/free
traces (``buffers_from_trace``) and torch.fx graphs (``torchmem.plan.fx``).

Several streams: a buffer names its producer's stream, its reads on other
streams and synchronisations (``Sync``); liveness then extends to the
synchronisation after the last read (``torchmem.plan.streams``; ``lifetimes``
says where, in torchmem/plan/buffers.py).
``pipeline(graph, stages=K, in_flight=2)`` plans an fx graph cut into K
concurrent stages with double-buffered tensors between them.
"""
from torchmem.plan.buffers import Buffer, as_buffers, lifetimes
from torchmem.plan.csv_io import load_csv, save_csv
from torchmem.plan.pipeline_plan import PipelinePlan, pipeline
from torchmem.plan.solve import METHODS, SHARINGS, Plan, lower_bound, solve
from torchmem.plan.streams import Read, Sync
from torchmem.plan.trace import buffers_from_trace

__all__ = [
    "METHODS",
    "SHARINGS",
    "Buffer",
    "PipelinePlan",
    "Plan",
    "Read",
    "Sync",
    "as_buffers",
    "buffers_from_trace",
    "lifetimes",
    "load_csv",
    "lower_bound",
    "pipeline",
    "save_csv",
    "solve",
]
