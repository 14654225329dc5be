"""Compaction: repack long-lived tensors (a module's parameters and buffers,
an optimizer's state) into one block, then give the freed cache back.

    step()                                   # the optimizer makes its state
    torchmem.compact(model, optimizer)       # weights and moments: one block

The caching allocator packs tensors in the order they were made, into
segments sized by its rounding rules, so long-lived tensors made early
(weights, then optimizer moments) leave free bytes beside them in
segments that can never be released. Compaction empties the cache, copies
the tensors into one new allocation at 64-byte offsets and points every
tensor at its new place (``tensor.data = ...``): the Parameter and tensor
objects are kept, so optimizers, hooks and references stay valid. Then
``empty_cache()`` returns the emptied segments.

Skipped (left as they are, counted in the report): tensors on another
device, sparse or quantized tensors, tensors that share storage with another
tensor of the group (tied views), and non-leaf tensors that require grad.
Views of a moved tensor taken before compaction (outside the group) keep
the old bytes and no longer follow the tensor, as with any ``.data``
assignment. Call it between steps, outside torchmem.planned() blocks.

Reserved can grow: the block is one request of the caching allocator, and
under the native policy a request of 1-10 MiB takes a 20 MiB segment (a
larger one is rounded to 2 MiB). The segment's free part stays cached and
serves later requests; ``CompactReport.explain()`` says so with the figures.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torchmem.runtime.devices import cpu_installed, device_name
from torchmem.runtime.memory import caching_allocator, empty_cache, memory_reserved
from torchmem.runtime.planned import in_planned_step

ALIGNMENT = 64


@dataclass
class CompactReport:
    tensors: int            # tensors moved
    bytes: int              # their bytes
    blocks: int             # blocks they now live in (1, or 0 when nothing moved)
    skipped: int            # tensors left where they were
    reserved_before: int
    reserved_after: int
    segment_bytes: int = 0  # the segment the block lives in (the native policy gives a 1-10 MiB block a 20 MiB one)

    def explain(self) -> str:
        """The report in words, with why reserved can grow: the block's segment may be larger than the block."""
        mib = 2**20
        text = (f"compacted {self.tensors} tensors ({self.bytes / mib:.2f} MiB) into {self.blocks} block; reserved "
                f"{self.reserved_before / mib:.1f} -> {self.reserved_after / mib:.1f} MiB")
        if self.segment_bytes >= 2 * self.bytes > 0:
            text += (f"; the block is one request of {self.bytes / mib:.2f} MiB, served from a "
                     f"{self.segment_bytes / mib:.0f} MiB segment (the native policy's rounding), whose free "
                     f"{(self.segment_bytes - self.bytes) / mib:.2f} MiB stays cached for the next allocations")
        return text


def _group(obj: Any) -> list:
    import torch

    if isinstance(obj, torch.nn.Module):
        return list(obj.parameters()) + [b for b in obj.buffers() if b is not None]
    if isinstance(obj, torch.optim.Optimizer):
        return [v for state in obj.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)) and all(isinstance(t, torch.Tensor) for t in obj):
        return list(obj)
    raise TypeError(f"compact() takes modules, optimizers, tensors or lists of tensors, got {type(obj).__name__}")


def _movable(tensors: list, device: Any) -> tuple[list, int]:
    """The distinct tensors of a group that can move, and how many cannot."""
    import torch

    seen: set[int] = set()
    unique = []
    for t in tensors:
        if id(t) not in seen:
            seen.add(id(t))
            unique.append(t)
    storages: dict[int, int] = {}
    for t in unique:
        if t.layout == torch.strided and not t.is_quantized and t.numel():
            key = t.untyped_storage().data_ptr()
            storages[key] = storages.get(key, 0) + 1
    movable = [
        t for t in unique
        if t.device == device and t.layout == torch.strided and not t.is_quantized and t.numel()
        and (t.is_leaf or not t.requires_grad) and storages[t.untyped_storage().data_ptr()] == 1
    ]
    return movable, len(unique) - len(movable)


def _pack(tensors: list, device: Any) -> int:
    """Copies `tensors` into one new block, then points each at its place; returns the block's address."""
    import torch

    offsets, total = [], 0
    for t in tensors:
        offsets.append(total)
        total += -(-t.numel() * t.element_size() // ALIGNMENT) * ALIGNMENT
    block = torch.empty(total, dtype=torch.uint8, device=device)
    with torch.no_grad():
        places = []
        for t, off in zip(tensors, offsets):
            place = block[off:off + t.numel() * t.element_size()].view(t.dtype).view(t.shape)
            place.copy_(t)
            places.append(place)
        for t, place in zip(tensors, places):
            t.data = place
    return block.data_ptr()


def _segment_bytes(address: int, device: Any) -> int:
    """The size of the caching allocator's segment that holds `address` (0 if none does)."""

    allocator = caching_allocator(str(device))
    for seg in allocator.segments() if allocator is not None else []:
        if seg["address"] <= address < seg["address"] + seg["total_size"]:
            return seg["total_size"]
    return 0


def compact(*objects: Any, device: Any = None) -> CompactReport:
    """Repack the long-lived tensors of `objects` (modules: parameters and
    buffers; optimizers: their state; tensors or lists of tensors) into one
    new block, then empty the cache. Give objects with the same lifetime in
    one call: the block lives while any of its tensors does. `device`: the
    device whose tensors move (default: the CPU, or the current CUDA device
    when torchmem is installed on CUDA). It needs room for one more copy of
    what it moves, for the moment of the copy."""
    import torch

    if not cpu_installed():
        raise RuntimeError("torchmem.compact() needs torchmem.install() first")
    if in_planned_step(device):
        raise RuntimeError("torchmem.compact() runs between steps, not inside a torchmem.planned() block")
    target = torch.device(device_name(device))
    tensors = [t for obj in objects for t in _group(obj)]
    movable, skipped = _movable(tensors, target)
    before = memory_reserved(target)
    empty_cache(target)  # the new block then comes from a fresh segment, not from holes
    address = _pack(movable, target) if movable else 0
    empty_cache(target)
    nbytes = sum(t.numel() * t.element_size() for t in movable)
    return CompactReport(len(movable), nbytes, 1 if movable else 0, skipped, before, memory_reserved(target),
                         _segment_bytes(address, target) if address else 0)
