"""`preflight --steps N`, inside the script's process (docs/preflight.md, "Stopping after N steps").

hook.py loads this file by path, as sitecustomize loads hook.py: it imports
nothing of torchmem's, and nothing of torch's until it is handed the module.

What counts as a step:
- every step of a torch.optim.Optimizer, fused and foreach ones included,
  through torch.optim's global step post-hook (the HF Trainer's and
  Accelerate's optimizers wrap one);
- one DeepSpeed engine step, however many inner optimizer steps it takes
  (ZeRO-3 steps each sub-group's partition in turn).

At each step the peaks since the one before are kept, per device, and
PyTorch's peak counters start again (`reset_peak_memory_stats`). So under
--steps, a script's own `max_memory_allocated()` gives the peak since its
last step. The whole run's peaks are the largest of the steps' and the rest.
After the N-th step `stop` is called: the process writes its report and
ends there.
"""
from __future__ import annotations

from typing import Any, Callable


class StepCounter:
    """Counts optimizer steps and keeps each one's peaks; calls `stop` after the `limit`-th."""

    def __init__(self, torch: Any, limit: int, stop: Callable[[], None]) -> None:
        self.torch = torch
        self.limit = limit
        self.stop = stop
        self.steps: list[dict[str, Any]] = []
        self.engine_depth = 0  # inside a DeepSpeed engine step: its inner steps do not count

    def install(self) -> None:
        import importlib

        importlib.import_module("torch.optim.optimizer").register_optimizer_step_post_hook(self._optimizer_step)

    def watch_engine(self, engine: type) -> None:
        """Counts `engine.step` (DeepSpeedEngine) once per call, and not the optimizer steps inside it."""
        original = engine.step
        counter = self

        def step(self: Any, *args: Any, **kwargs: Any) -> Any:
            counter.engine_depth += 1
            try:
                result = original(self, *args, **kwargs)
            finally:
                counter.engine_depth -= 1
            if counter.engine_depth == 0 and getattr(self, "is_gradient_accumulation_boundary", lambda: True)():
                counter._count()
            return result

        engine.step = step

    def peak(self, device: int, what: str) -> int:
        """The largest peak (`allocated` or `reserved`) the counted steps saw on `device`."""
        return max((s["devices"].get(device, {}).get(what, 0) for s in self.steps), default=0)

    def to_json(self) -> dict[str, Any]:
        return {"asked": self.limit, "steps": [{"devices": {str(d): v for d, v in s["devices"].items()}}
                                               for s in self.steps]}

    def _optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.engine_depth == 0:
            self._count()

    def _count(self) -> None:
        cuda = self.torch.cuda
        devices = {}
        for d in range(cuda.device_count() if cuda.is_initialized() else 0):
            stats = cuda.memory_stats(d)
            if stats.get("num_device_alloc", 0):
                devices[d] = {"allocated": stats.get("allocated_bytes.all.peak", 0),
                              "reserved": stats.get("reserved_bytes.all.peak", 0)}
                cuda.reset_peak_memory_stats(d)
        self.steps.append({"devices": devices})
        if len(self.steps) >= self.limit:
            self.stop()
