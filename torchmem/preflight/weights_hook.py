"""Checkpoints without their bytes, inside the script's process (docs/preflight.md, "Weights without their bytes").

hook.py loads this file by path, as sitecustomize loads hook.py: it imports
nothing of torchmem's.

Under preflight, values on the device are garbage anyway, so a checkpoint's
bytes are never needed: only each tensor's name, shape and dtype, which a
safetensors file keeps in its header. Right after `import safetensors`,
`safetensors.safe_open` is replaced by `HeaderOnly`, which reads the header
alone and answers `get_tensor`, `get_slice(...)[index]` with `torch.empty`
tensors of those shapes and dtypes on the device asked for. Empty CPU
memory that nothing writes takes no host memory, and a copy to the fake
device keeps no data. `safetensors.torch.load_file` and the loaders of
transformers and diffusers go through `safe_open`, so they load shapes too.

The tensors are created in the order the script asks for them, on the
devices it asks for, so the device allocations are those of a real load.
The run plan's read_weights (`--read-weights`, run_plan.py) keeps the real loader.
"""
from __future__ import annotations

import json
import os
import struct
import sys
from typing import Any

# safetensors' dtype names, as torch's dtype attribute names.
DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64", "I32": "int32",
          "I16": "int16", "I8": "int8", "U8": "uint8", "U16": "uint16", "U32": "uint32", "U64": "uint64",
          "BOOL": "bool", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "C64": "complex64"}


def header(path: str) -> dict[str, Any]:
    """A safetensors file's header: {name: {"dtype", "shape", "data_offsets"}, "__metadata__": {...}}."""
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        if size > 100 << 20:
            raise OSError(f"{path}: a safetensors header of {size:,} bytes (the format allows 100 MB)")
        return json.loads(f.read(size))


class HeaderSlice:
    """One tensor of a HeaderOnly file: its shape and dtype; indexing gives an empty tensor of the slice's shape."""

    def __init__(self, entry: dict[str, Any], device: Any) -> None:
        self.entry, self.device = entry, device

    def get_shape(self) -> list[int]:
        return list(self.entry["shape"])

    def get_dtype(self) -> str:
        return self.entry["dtype"]

    def __getitem__(self, index: Any) -> Any:
        torch = sys.modules["torch"]
        dtype = getattr(torch, DTYPES[self.entry["dtype"]])
        shape = torch.empty(self.entry["shape"], dtype=dtype, device="meta")[index].shape
        return torch.empty(shape, dtype=dtype, device=self.device)


class HeaderOnly:
    """safetensors.safe_open, reading the header alone."""

    def __init__(self, filename: Any, framework: str = "pt", device: Any = "cpu", **kwargs: Any) -> None:
        if framework not in ("pt", "torch"):
            raise ValueError(f"preflight loads safetensors for torch only, not framework={framework!r}")
        self.entries = header(os.fspath(filename))
        self.meta = self.entries.pop("__metadata__", None)
        self.device = f"cuda:{device}" if isinstance(device, int) else device

    def __enter__(self) -> "HeaderOnly":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def keys(self) -> list[str]:
        return sorted(self.entries)

    def offset_keys(self) -> list[str]:
        return sorted(self.entries, key=lambda k: self.entries[k]["data_offsets"][0])

    def metadata(self) -> dict[str, str] | None:
        return self.meta

    def get_slice(self, name: str) -> HeaderSlice:
        return HeaderSlice(self.entries[name], self.device)

    def get_tensor(self, name: str) -> Any:
        return self.get_slice(name)[...]


def install(safetensors: Any) -> None:
    """Replaces safetensors.safe_open (called right after `import safetensors`)."""
    safetensors.safe_open = HeaderOnly
