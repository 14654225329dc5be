"""Loading torchmem's extensions from a folder other than the package's own.

The fake-GPU tier builds them against a CUDA build of torch into
build/cuda-<release>/lib/torchmem (the in-tree torchmem/_core*.so and _C*.so
are the CPU tier's); setting TORCHMEM_EXT_DIR to that folder makes
`torchmem._core` and `torchmem._C` import from there. Both come from the same
folder: _C links the _core beside it, and a process holds one _core.
"""
from __future__ import annotations

import glob
import importlib.machinery
import os


def prefer_extensions_in(package_path: list[str], folder: str) -> None:
    """Puts `folder` first on the package's search path; ImportError naming the folder when it holds no
    torchmem extension. Only compiled files are there, so the package's Python modules still come from the
    package (a folder there, such as fakegpu/ with the fake GPU's libraries, is no package: no __init__.py)."""
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    if not glob.glob(os.path.join(glob.escape(folder), "_core" + suffix)):
        raise ImportError(f"TORCHMEM_EXT_DIR={folder}: no torchmem extension (_core{suffix}) there; build it "
                          "with `make fakegpu-ext`, or unset TORCHMEM_EXT_DIR")
    if folder not in package_path:
        package_path.insert(0, folder)
