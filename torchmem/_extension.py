"""Loading torchmem._C from a folder other than the package's own.

The fake-GPU tier builds the extension against a CUDA build of torch into
build/cuda-lib (the in-tree torchmem/_C*.so is the CPU tier's); setting
TORCHMEM_EXT_DIR to the folder that holds it makes `import torchmem` use it.
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys


def load_extension_from(folder: str) -> None:
    """Imports torchmem._C from `folder`; ImportError naming the folder when it is not there."""
    import torch  # noqa: F401  (loads libtorch, which the extension links against)

    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = os.path.join(folder, "_C" + suffix)
        if os.path.isfile(path):
            spec = importlib.util.spec_from_file_location("torchmem._C", path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules["torchmem._C"] = module
            spec.loader.exec_module(module)
            package = sys.modules.get("torchmem")
            if package is not None:
                package._C = module  # type: ignore[attr-defined]  # `torchmem._C` as an attribute, as an import sets it
            return
    raise ImportError(f"TORCHMEM_EXT_DIR={folder}: no torchmem extension (_C{importlib.machinery.EXTENSION_SUFFIXES[0]}) "
                      "there; build it with `make fakegpu-ext`, or unset TORCHMEM_EXT_DIR")
