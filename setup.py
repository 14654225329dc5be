"""Build torchmem: a pure C++ core, c10 glue and pybind11 bindings in one extension.

The CUDA glue (csrc/cuda, csrc/torch/cuda_*) is compiled only when the installed
torch is a CUDA build and CUDA_HOME is found; everything else builds on any
machine with a CPU torch.
"""
import glob
import os

from setuptools import find_packages, setup
from torch.utils import cpp_extension

ROOT = os.path.dirname(os.path.abspath(__file__))


def sources(pattern: str) -> list[str]:
    return sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, pattern), recursive=True))


def cuda_available() -> bool:
    import torch

    return torch.version.cuda is not None and cpp_extension.CUDA_HOME is not None


core = sources("csrc/core/**/*.cpp")
cpu_glue = sources("csrc/torch/cpu_*.cpp")
bindings = sources("csrc/bindings/*.cpp")
cuda_glue = sources("csrc/cuda/*.cpp") + sources("csrc/torch/cuda_*.cpp") if cuda_available() else []

# No -std flag: torch.utils.cpp_extension picks the standard the installed
# torch needs (C++17 up to 2.13, C++20 from 2.14); the core is C++17 and
# compiles under both.
cxx_flags = ["-O2", "-fvisibility=hidden"]
define_macros = [("TORCHMEM_WITH_CUDA", "1")] if cuda_glue else []

Extension = cpp_extension.CUDAExtension if cuda_glue else cpp_extension.CppExtension
extension = Extension(
    name="torchmem._C",
    sources=core + cpu_glue + cuda_glue + bindings,
    include_dirs=[os.path.join(ROOT, "csrc")],
    extra_compile_args={"cxx": cxx_flags, "nvcc": ["-O2"]} if cuda_glue else cxx_flags,
    define_macros=define_macros,
    libraries=["c10_cuda", "torch_cuda"] if cuda_glue else [],
)

setup(
    name="torchmem",
    version="0.1.0",
    description="Memory toolkit for PyTorch: caching, arena and paged allocators, a planner and a replayer",
    packages=find_packages(include=["torchmem", "torchmem.*"]),
    python_requires=">=3.10",
    ext_modules=[extension],
    cmdclass={"build_ext": cpp_extension.BuildExtension.with_options(use_ninja=True)},
    entry_points={"console_scripts": ["torchmem=torchmem.__main__:main"]},
)
