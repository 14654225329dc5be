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
"""
from torchmem.plan.buffers import Buffer, as_buffers
from torchmem.plan.csv_io import load_csv, save_csv
from torchmem.plan.solve import METHODS, Plan, lower_bound, solve
from torchmem.plan.trace import buffers_from_trace

__all__ = [
    "METHODS",
    "Buffer",
    "Plan",
    "as_buffers",
    "buffers_from_trace",
    "load_csv",
    "lower_bound",
    "save_csv",
    "solve",
]
