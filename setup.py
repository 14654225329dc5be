"""Build torchmem against the torch installed in the environment that runs the build.

    pip install --no-build-isolation .          # or a git URL in place of "."

Two extensions: torchmem._core (the C++ core and its bindings) links no torch,
so the command line's file tools run without importing it; torchmem._C (the
glue that swaps PyTorch's allocators) links that torch's libraries and _core.
_C must be built with that very torch. pyproject.toml therefore lists no torch
among its build requirements: a build under pip's build isolation sees no torch
and stops at once, saying what to type. The package's metadata pins the torch it was built against.

The CUDA glue (csrc/cuda, csrc/torch/cuda_*) is compiled when torch is a CUDA
build. It is plain C++ (no .cu files, so no nvcc): it needs only the CUDA
runtime's headers and library, taken from torch's own nvidia wheels
(nvidia/cu13 for CUDA 13, nvidia/cuda_runtime and its siblings for CUDA 12),
else from CUDA_HOME when that toolkit has torch's CUDA major version. CUDA 13's
runtime wheel lacks crt/ (nvidia-cuda-crt has it); when that wheel is absent,
crt/ comes from the CUDA headers bundled with triton, a dependency of torch.
No nvcc runs, so torch's check of nvcc's version against torch.version.cuda
(made only for .cu sources) never applies. TORCHMEM_NO_CUDA=1 builds without
the glue.

Objects go to build/<cpu|cuda>-<torch release>/temp (the Makefile's fake-GPU
build uses the same folder), so builds against different torches never mix and
a rebuild compiles only what changed; a wheel's files are staged in
build/<...>/wheel, emptied first so no stale file reaches the wheel.
"""
from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import NamedTuple, NoReturn

from setuptools import Extension, find_packages, setup
from setuptools.command.build import build

ROOT = Path(__file__).resolve().parent
HOW = "pip install --no-build-isolation <this checkout or its git URL>"
OLDEST_CUDA_TORCH = (2, 8)  # csrc/torch/cuda_allocator.h's static_assert


def fail(message: str) -> NoReturn:
    """Stops the build with one line on stderr."""
    sys.exit(f"torchmem: {message}")


def torch_outside_build() -> str | None:
    """The folder of the torch this Python sees without the build's own path (pip's isolation adds its
    packages through PYTHONPATH), or None when it sees none."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONNOUSERSITE")}
    probe = "import importlib.util as u; s = u.find_spec('torch'); print(s.origin if s and s.origin else '')"
    try:
        found = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True,
                               timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return os.path.dirname(found) if found else None


def isolated_env(path: str) -> bool:
    """Whether `path` lies in a build frontend's throw-away environment (pip: pip-build-env-*, build: build-env-*)."""
    return any(part.startswith(("pip-build-env-", "build-env-")) for part in Path(path).parts)


def import_torch() -> tuple[ModuleType, ModuleType]:
    """torch and torch.utils.cpp_extension, or a one-line error when the build cannot use the user's torch."""
    try:
        import torch
        from torch.utils import cpp_extension
    except ImportError as exc:
        found = torch_outside_build()
        if found:
            fail(f"build isolation hides your torch ({found}); torchmem must be built against it: {HOW}")
        fail(f"no torch in this environment ({exc}); install torch first, then: {HOW}")
    if isolated_env(torch.__file__):
        fail(f"this build sees a torch installed for the build alone ({os.path.dirname(torch.__file__)}), "
             f"not yours; torchmem must be built against your installed torch: {HOW}")
    return torch, cpp_extension


class CudaRuntime(NamedTuple):
    """Where the CUDA glue's headers and runtime library come from."""

    include_dirs: list[str]
    library: str   # the libcudart.so.<major> file to link
    origin: str    # for the build log
    complete: bool = True  # False: crt/ is missing


def runtime_major(include_dir: Path) -> int | None:
    """The CUDA major version of cuda_runtime_api.h in `include_dir` (CUDART_VERSION 13000 -> 13), or None."""
    try:
        text = (include_dir / "cuda_runtime_api.h").read_text(errors="replace")
    except OSError:
        return None
    match = re.search(r"#define\s+CUDART_VERSION\s+(\d+)", text)
    return int(match.group(1)) // 1000 if match else None


def nvidia_folders(torch: ModuleType) -> list[Path]:
    """The `nvidia` wheel folders this torch can load from: beside torch first, then the namespace package's."""
    import importlib.util

    folders = [Path(torch.__file__).resolve().parents[1] / "nvidia"]
    spec = importlib.util.find_spec("nvidia")
    if spec is not None and spec.submodule_search_locations:
        folders += [Path(p).resolve() for p in spec.submodule_search_locations]
    unique: list[Path] = []
    for folder in folders:
        if folder.is_dir() and folder not in unique:
            unique.append(folder)
    return unique


def has_crt(include_dir: Path) -> bool:
    """Whether `include_dir` has crt/host_defines.h, which cuda_runtime_api.h includes."""
    return (include_dir / "crt" / "host_defines.h").is_file()


def crt_elsewhere(major: int) -> Path | None:
    """A CUDA <major> include folder with crt/ for runtime headers shipped without it.

    CUDA 13's nvidia-cuda-runtime wheel leaves crt/ to nvidia-cuda-crt, which torch does not pull in;
    triton, which torch does pull in on Linux, bundles a full set of CUDA headers.
    """
    import importlib.util

    spec = importlib.util.find_spec("triton")
    if spec is None or not spec.origin:
        return None
    bundled = Path(spec.origin).parent / "backends" / "nvidia" / "include"
    return bundled if has_crt(bundled) and runtime_major(bundled) == major else None


def wheel_runtime(folder: Path, major: int) -> CudaRuntime | None:
    """The CUDA runtime in one nvidia folder: nvidia/cu<major> (CUDA 13 wheels), else nvidia/cuda_runtime with
    the include folders of its sibling wheels (CUDA 12: cublas, cusparse, nvrtc, ...)."""
    for name in (f"cu{major}", "cuda_runtime"):
        home = folder / name
        library = home / "lib" / f"libcudart.so.{major}"
        if runtime_major(home / "include") != major or not library.is_file():
            continue
        siblings = [] if name != "cuda_runtime" else sorted(
            str(p) for p in folder.glob("*/include") if p.is_dir() and p.parent.name != name)
        include_dirs = [str(home / "include"), *siblings]
        origin = f"torch's nvidia wheels ({home})"
        if not any(has_crt(Path(d)) for d in include_dirs):
            crt = crt_elsewhere(major)
            if crt is None:
                return CudaRuntime(include_dirs, str(library), origin, complete=False)
            include_dirs.append(str(crt))  # after the runtime's own: only what they lack comes from there
            origin += f", crt/ from {crt}"
        return CudaRuntime(include_dirs, str(library), origin)
    return None


def nvidia_version(dist: str, major: int) -> str:
    """A pip version pattern for an NVIDIA component of torch's CUDA: crt/ shares nvrtc's version (13.0.88)."""
    for name in (dist, f"{dist}-cu{major}"):
        try:
            return ".".join(metadata.version(name).split(".")[:3]) + ".*"
        except metadata.PackageNotFoundError:
            pass
    return f"{major}.*"


def toolkit_runtime(cuda_home: str | None, major: int) -> CudaRuntime | None:
    """The CUDA runtime of a toolkit (CUDA_HOME), when its major version is torch's."""
    if not cuda_home or runtime_major(Path(cuda_home, "include")) != major:
        return None
    for lib in ("lib64", "lib", "targets/x86_64-linux/lib"):
        library = Path(cuda_home, lib, f"libcudart.so.{major}")
        if library.is_file():
            return CudaRuntime([str(Path(cuda_home, "include"))], str(library), f"the CUDA toolkit at {cuda_home}")
    return None


def cuda_runtime(torch: ModuleType, cpp_extension: ModuleType) -> CudaRuntime | None:
    """The CUDA runtime the glue is built with; None for a CPU torch or TORCHMEM_NO_CUDA=1."""
    if torch.version.cuda is None or os.environ.get("TORCHMEM_NO_CUDA") == "1":
        return None
    release = tuple(int(n) for n in re.findall(r"\d+", torch.__version__)[:2])
    if release < OLDEST_CUDA_TORCH:
        print(f"torchmem: building without the CUDA allocator glue, which needs torch "
              f"{'.'.join(map(str, OLDEST_CUDA_TORCH))} or newer, not {torch.__version__}; preflight, replay and "
              "advise are unaffected", file=sys.stderr)
        return None
    major = int(torch.version.cuda.split(".")[0])
    folders = nvidia_folders(torch)
    found = [r for r in (wheel_runtime(folder, major) for folder in folders) if r is not None]
    found.append(toolkit_runtime(cpp_extension.CUDA_HOME, major))
    for runtime in found:
        if runtime is not None and runtime.complete:
            return runtime
    if found[0] is not None:
        fail(f"the CUDA {major} headers in {found[0].include_dirs[0]} lack crt/ (NVIDIA ships it in another wheel): "
             f"pip install 'nvidia-cuda-crt=={nvidia_version('nvidia-cuda-nvrtc', major)}', then: {HOW}")
    fail(f"torch {torch.__version__} is a CUDA {torch.version.cuda} build, but no CUDA {major} runtime headers were "
         f"found (nvidia wheels: {', '.join(map(str, folders)) or 'none'}; CUDA_HOME: {cpp_extension.CUDA_HOME}): "
         f"install the nvidia-cuda-runtime wheel for CUDA {major}, set CUDA_HOME to a CUDA {major} toolkit, "
         "or set TORCHMEM_NO_CUDA=1 to build without CUDA")


def fakegpu_headers(torch: ModuleType, cpp_extension: ModuleType, major: int) -> list[Path]:
    """CUDA `major`'s header folders for the fake GPU's set: torch's own nvidia wheels when they are that
    major's, else CUDA<major>_HOME's or CUDA_HOME's include folder; [] when none holds them."""
    if torch.version.cuda and int(torch.version.cuda.split(".")[0]) == major:
        for folder in nvidia_folders(torch):
            runtime = wheel_runtime(folder, major)
            if runtime is not None:
                return [Path(d) for d in runtime.include_dirs]
    for home in (os.environ.get(f"CUDA{major}_HOME"), cpp_extension.CUDA_HOME):
        if home and runtime_major(Path(home, "include")) == major:
            return [Path(home, "include")]
        if home and runtime_major(Path(home)) == major:  # a bare include folder, or nvidia/cuda_runtime's
            return [Path(home)]
    return []


def build_fakegpu(torch: ModuleType, cpp_extension: ModuleType, temp: str, package_dir: str) -> None:
    """The fake GPU's stand-ins (fakegpu/build.py), built in TEMP/fakegpu-<major>, into
    PACKAGE_DIR/fakegpu/lib/cuda<major>: for the installed torch's CUDA major and, where its headers are
    found, the other one. Preflight finds them there."""
    import importlib.util

    # fakegpu/build.py, the Makefile's builder too; by path, since a module named `build` may be loaded already.
    spec = importlib.util.spec_from_file_location("torchmem_fakegpu_build", ROOT / "fakegpu" / "build.py")
    fakegpu_build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fakegpu_build)
    own = int(torch.version.cuda.split(".")[0]) if torch.version.cuda else None
    for major in sorted((12, 13), key=lambda m: m != own):
        headers = fakegpu_headers(torch, cpp_extension, major)
        out = Path(package_dir, "fakegpu", "lib", f"cuda{major}")
        work = Path(temp, f"fakegpu-{major}")
        if not headers:
            if major == own:
                print(f"torchmem: the fake GPU for CUDA {major} is left out: no CUDA {major} headers in torch's "
                      "nvidia wheels", file=sys.stderr)
            continue
        try:
            built = fakegpu_build.build_set(major, headers, work)
        except (fakegpu_build.BuildError, OSError) as exc:
            if major == own:
                fail(f"the fake GPU for CUDA {major} did not build: {exc}")
            print(f"torchmem: the fake GPU for CUDA {major} is left out: {exc}", file=sys.stderr)
            continue
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        for library in built:
            shutil.copyfile(library, out / library.name)
        (out / "libcuda.so").symlink_to("libcuda.so.1")  # Triton 3.2 (torch 2.6) links its launcher with -lcuda
        print(f"torchmem: built the fake GPU for CUDA {major} with headers from {headers[0]}", file=sys.stderr)


def torch_requirement(torch: ModuleType) -> str:
    """The pin on the torch built against: its distribution's version as pip sees it (PyPI's CUDA wheel says
    2.14.1 where torch.__version__ says 2.14.1+cu130; the CPU wheel says 2.13.0+cpu)."""
    try:
        return f"torch=={metadata.version('torch')}"
    except metadata.PackageNotFoundError:  # a torch built from source and put on the path by hand
        return f"torch=={torch.__version__}"


def build_dir(torch: ModuleType, cuda: CudaRuntime | None) -> str:
    """build/cuda-2.14.1, build/cpu-2.13.0: one folder per torch release and flavour."""
    release = torch.__version__.split("+")[0]
    return os.path.join("build", f"{'cuda' if torch.version.cuda else 'cpu'}-{release}")


def version(torch: ModuleType, cuda: CudaRuntime | None) -> str:
    """0.1.0+torch2.14.1.cu130: the torch built against in the local label, so wheels built against
    different torches have different names (PyTorch's own wheels do the same)."""
    release = torch.__version__.split("+")[0]
    flavour = "cu" + torch.version.cuda.replace(".", "") if torch.version.cuda else "cpu"
    return f"0.1.0+torch{release}.{flavour}"


def sources(pattern: str) -> list[str]:
    return sorted(os.path.relpath(p, ROOT) for p in glob.glob(str(ROOT / pattern), recursive=True))


def one_unit(files: list[str], path: str) -> str:
    """A source file at `path` that #includes `files`, so they compile as one unit; rewritten only when
    the list changes, so an unchanged list costs no rebuild (ninja follows the included files).

    The bindings compile this way: pybind11's headers are then parsed once, not once per file
    (41 s of compiler CPU for all of them, against about 150 s file by file).
    """
    text = "// Generated by setup.py (one_unit): these files compiled as one unit.\n" + "".join(
        f'#include "{(ROOT / f).as_posix()}"\n' for f in files)
    if not os.path.isfile(path) or Path(path).read_text() != text:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        Path(path).write_text(text)
    return path


def core_file() -> str:
    """torchmem._core's file name (_core.cpython-311-x86_64-linux-gnu.so): its soname too."""
    return "_core" + sysconfig.get_config_var("EXT_SUFFIX")


def commands(torch: ModuleType, cpp_extension: ModuleType, folder: str) -> dict[str, type]:
    """setuptools' build and build_ext, with their default folders under `folder` (see the module's docstring)."""

    class Build(build):
        """Stages a wheel's files in FOLDER/wheel, emptied first, unless a folder is given."""

        def finalize_options(self) -> None:
            self.owns_build_lib = self.build_lib is None
            if self.owns_build_lib:
                self.build_lib = os.path.join(folder, "wheel")
            super().finalize_options()

        def run(self) -> None:
            if self.owns_build_lib:
                shutil.rmtree(self.build_lib, ignore_errors=True)
            super().run()

    class BuildExt(cpp_extension.BuildExtension):
        """Compiles into FOLDER/temp unless --build-temp is given (editable installs included), then builds
        the fake GPU's stand-ins beside the package's Python files."""

        def finalize_options(self) -> None:
            if self.build_temp is None:
                self.build_temp = os.path.join(folder, "temp")
            super().finalize_options()

        def build_extension(self, ext) -> None:
            if ext.name == "torchmem._C":  # links the _core built just before it
                ext.extra_objects = [self.get_ext_fullpath("torchmem._core")]
            super().build_extension(ext)

        def run(self) -> None:
            super().run()
            build_fakegpu(torch, cpp_extension, self.build_temp,
                          str(ROOT / "torchmem") if self.inplace else os.path.join(self.build_lib, "torchmem"))

    return {"build": Build, "build_ext": BuildExt.with_options(use_ninja=True)}


def main() -> None:
    torch, cpp_extension = import_torch()
    cuda = cuda_runtime(torch, cpp_extension)
    if cuda:
        print(f"torchmem: building the CUDA glue against torch {torch.__version__} with CUDA headers from "
              f"{cuda.origin}", file=sys.stderr)
    build = build_dir(torch, cuda)
    glue_bindings = [f"csrc/bindings/{name}.cpp" for name in ("module", "cpu_install_bindings", "oom_bindings",
                                                              "cuda_bindings")]
    core_bindings = [f for f in sources("csrc/bindings/*.cpp") if f not in glue_bindings]
    cpu_glue = sources("csrc/torch/cpu_*.cpp")
    cuda_glue = sources("csrc/cuda/*.cpp") + sources("csrc/torch/cuda_*.cpp") if cuda else []

    # torchmem._core: the core and its bindings, with pybind11's headers from torch's include folder and no
    # torch library, so the command line's tools load it without torch. Its symbols stay visible (no
    # -fvisibility=hidden; pybind11's own are hidden by its headers), and its soname is its file's name,
    # so _C links against it and finds it beside itself.
    core = Extension(
        name="torchmem._core",
        sources=sources("csrc/core/**/*.cpp") + [one_unit(core_bindings, os.path.join(build, "core_bindings.cpp"))],
        include_dirs=[str(ROOT / "csrc"), *cpp_extension.include_paths()[:1]],
        extra_compile_args=["-O2", "-g0"],
        extra_link_args=[f"-Wl,-soname,{core_file()}"],
    )
    # torchmem._C: the glue that needs torch. No -std flag: torch.utils.cpp_extension picks the standard the
    # installed torch needs (C++17 up to 2.13, C++20 from 2.14); the core is C++17 and compiles under both.
    glue = cpp_extension.CppExtension(
        name="torchmem._C",
        sources=cpu_glue + cuda_glue + [one_unit([f for f in glue_bindings if cuda or "cuda" not in f],
                                                 os.path.join(build, "glue_bindings.cpp"))],
        include_dirs=[str(ROOT / "csrc"), *(cuda.include_dirs if cuda else [])],
        # -g0 drops the -g that Python's own flags add: a quarter of the compile time (11.2 s against 8.8 s
        # of CPU for csrc/bindings/module.cpp), and a wheel without debug information.
        extra_compile_args=["-O2", "-g0", "-fvisibility=hidden"],
        define_macros=[("TORCHMEM_WITH_CUDA", "1")] if cuda else [],
        libraries=["c10_cuda", "torch_cuda"] if cuda else [],
        extra_link_args=[*([cuda.library] if cuda else []), "-Wl,-rpath,$ORIGIN"],
    )

    setup(
        name="torchmem",
        version=version(torch, cuda),
        description="Memory toolkit for PyTorch: caching, arena and paged allocators, a planner and a replayer",
        packages=find_packages(include=["torchmem", "torchmem.*"]),
        # preflight's start-up hook: a folder put on the child's PYTHONPATH, not a package.
        package_data={"torchmem.preflight": ["startup/sitecustomize.py"]},
        python_requires=">=3.10",
        install_requires=[torch_requirement(torch), "numpy", "tqdm"],
        extras_require={"plot": ["matplotlib"]},
        ext_modules=[core, glue],  # in this order: _C links the _core just built
        cmdclass=commands(torch, cpp_extension, build),
        entry_points={"console_scripts": ["torchmem=torchmem.__main__:main"]},
    )


# pip's backend runs this file as __main__ too; tests import it to check the header search alone.
if __name__ == "__main__":
    main()
