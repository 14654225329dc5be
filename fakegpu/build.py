"""Builds one set of the fake GPU's stand-ins (docs/fakegpu.md): the Makefile and setup.py both call it.

A set is the libraries of one CUDA major, compiled from fakegpu/'s C sources against that major's
headers: libtorchmem_fakecudart.so, libcuda.so.1 (and libcuda.so), libnvidia-ml.so.1,
libcublas.so.MAJOR, libcublasLt.so.MAJOR and libnccl.so.2. Only cuda_runtime_api.h and cuda.h are
needed (cublas_api.h's version is read where present); the CUDA 12 wheels lack crt/host_defines.h, so a host-only one
(fakegpu/include/crt12) is searched after the given folders. It needs a C compiler and nm, not nvcc.

    python fakegpu/build.py --major 13 --include /usr/local/cuda/include --out build/fakegpu

Objects are rebuilt only when older than their sources; the libraries are linked every time.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Sequence

HERE = Path(__file__).resolve().parent
HEADERS = ("cuda_runtime_api.h", "cuda.h")  # cublas_api.h is read where present (fakegpu/cublas/common.c)
# -Wno-format-zero-length: a failed call without arguments logs them with the format "" (fakegpu/include/fg_log.h).
CFLAGS = ["-O2", "-g", "-fPIC", "-Wall", "-Wextra", "-Werror", "-Wno-format-zero-length", "-std=gnu11"]


class BuildError(RuntimeError):
    """A set could not be built; the message is one line."""


def runtime_major(include_dir: Path) -> int | None:
    """The CUDA major of cuda_runtime_api.h in `include_dir` (CUDART_VERSION 12080 -> 12), or None."""
    try:
        text = (include_dir / "cuda_runtime_api.h").read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        words = line.split()
        if len(words) >= 3 and words[:2] == ["#define", "CUDART_VERSION"] and words[2].isdigit():
            return int(words[2]) // 1000
    return None


def missing_headers(include_dirs: Sequence[Path]) -> list[str]:
    """The headers the sources read that none of `include_dirs` holds."""
    return [h for h in HEADERS if not any((Path(d) / h).is_file() for d in include_dirs)]


def check_headers(major: int, include_dirs: Sequence[Path]) -> None:
    """Raises BuildError unless `include_dirs` hold CUDA `major`'s runtime headers and cuda.h."""
    found = [runtime_major(Path(d)) for d in include_dirs]
    if major not in found:
        raise BuildError(f"no CUDA {major} cuda_runtime_api.h in {', '.join(map(str, include_dirs)) or 'no folder'}")
    missing = missing_headers(include_dirs)
    if missing:
        raise BuildError(f"{', '.join(missing)} not found in {', '.join(map(str, include_dirs))}")


class SetBuilder:
    """The compile and link steps of one set into `out`."""

    def __init__(self, major: int, include_dirs: Sequence[Path], out: Path, cc: str = "cc") -> None:
        self.major = major
        self.out = out
        self.cc = cc
        self.includes = [f"-I{d}" for d in include_dirs] + ["-idirafter", str(HERE / "include" / "crt12")]
        self.includes += self.blas_version(include_dirs)
        self.suffix = "12" if major == 12 else ""  # the symbol lists: cudart12_symbols.txt for CUDA 12

    def run(self, args: Sequence[str]) -> None:
        proc = subprocess.run(list(args), capture_output=True, text=True)
        if proc.returncode != 0:
            detail = (proc.stderr or proc.stdout).strip().splitlines()
            raise BuildError(f"{' '.join(args[:2])} ... failed: {detail[0] if detail else proc.returncode}")

    def blas_version(self, include_dirs: Sequence[Path]) -> list[str]:
        """-DCUBLAS_VER_MAJOR=... and its siblings, read from the first cublas_api.h found."""
        for folder in include_dirs:
            try:
                text = (Path(folder) / "cublas_api.h").read_text(errors="replace")
            except OSError:
                continue
            found = re.findall(r"^#define\s+(CUBLAS_VER_(?:MAJOR|MINOR|PATCH))\s+(\d+)", text, re.MULTILINE)
            return [f"-D{name}={value}" for name, value in found]
        return []

    def compile(self, source: Path, obj: Path, depends: Sequence[Path]) -> Path:
        if obj.is_file() and all(obj.stat().st_mtime >= p.stat().st_mtime for p in (source, *depends)):
            return obj
        obj.parent.mkdir(parents=True, exist_ok=True)
        self.run([self.cc, *CFLAGS, *self.includes, "-c", str(source), "-o", str(obj)])
        return obj

    def shared(self, target: str, inputs: Sequence[str], *flags: str) -> None:
        self.run([self.cc, *CFLAGS, *self.includes, "-shared", "-o", str(self.out / target), *inputs, *flags])

    def build(self) -> list[Path]:
        """Compiles and links the set; returns the libraries' paths."""
        self.out.mkdir(parents=True, exist_ok=True)
        log_header = HERE / "include" / "fg_log.h"
        runtime_headers = [*sorted((HERE / "cudart").glob("*.h")), HERE / "include" / "fakegpu.h", log_header]
        blas_headers = [HERE / "cublas" / "common.h", log_header]
        jobs = [(s, self.out / "obj" / f"{s.stem}.o", runtime_headers) for s in sorted((HERE / "cudart").glob("*.c"))]
        jobs += [(HERE / "cublas" / f"{n}.c", self.out / "blas" / f"{n}.o", blas_headers)
                 for n in ("common", "cublas", "cublasLt")]
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
            objects = list(pool.map(lambda job: self.compile(*job), jobs))
        runtime_objects = [str(o) for o in objects if o.parent.name == "obj"]
        self.link_runtime(runtime_objects)
        self.shared("libcuda.so.1", [str(HERE / "libcuda" / "libcuda.c")], "-Wl,-soname,libcuda.so.1", "-ldl")
        link = self.out / "libcuda.so"  # the name a link step asks for: Triton 3.2 (torch 2.6) links with -lcuda
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to("libcuda.so.1")
        self.shared("libnvidia-ml.so.1", [str(HERE / "nvml" / "nvml.c")], "-Wl,-soname,libnvidia-ml.so.1")
        self.shared("libnccl.so.2", [str(HERE / "nccl" / "nccl.c")], "-Wl,-soname,libnccl.so.2", "-ldl", "-lpthread")
        for name in ("cublas", "cublasLt"):
            self.link_blas(name)
        return [self.out / n for n in libraries(self.major)]

    def link_runtime(self, objects: list[str]) -> None:
        gen = self.out / "gen"
        self.run([sys.executable, str(HERE / "cudart" / "gen_stubs.py"), str(HERE / "cudart" / f"cudart{self.suffix}_symbols.txt"),
                  f"libcudart.so.{self.major}", str(gen), *objects])
        self.run([self.cc, *CFLAGS, "-c", str(gen / "stubs.c"), "-o", str(gen / "stubs.o")])
        self.shared("libtorchmem_fakecudart.so", [*objects, str(gen / "stubs.o")],
                    f"-Wl,--version-script={gen / 'cudart.map'}", "-Wl,-soname,libtorchmem_fakecudart.so",
                    "-lpthread")

    def link_blas(self, name: str) -> None:
        soname = f"lib{name}.so.{self.major}"
        gen = self.out / "blas" / f"gen-{name}"
        own = self.out / "blas" / f"{name}.o"
        self.run([sys.executable, str(HERE / "cublas" / "gen_stubs.py"),
                  str(HERE / "cublas" / f"{name}{self.suffix}_symbols.txt"), soname, str(gen), str(own)])
        self.run([self.cc, *CFLAGS, "-c", str(gen / "stubs.c"), "-o", str(gen / "stubs.o")])
        self.run([self.cc, "-shared", "-o", str(self.out / soname), str(own), str(self.out / "blas" / "common.o"),
                  str(gen / "stubs.o"), f"-Wl,--version-script={gen / 'exports.map'}", f"-Wl,-soname,{soname}"])


def libraries(major: int) -> tuple[str, ...]:
    """The files of one set (torchmem.fakegpu.libraries says the same to the launcher)."""
    return ("libtorchmem_fakecudart.so", "libcuda.so.1", "libnvidia-ml.so.1", f"libcublas.so.{major}",
            f"libcublasLt.so.{major}", "libnccl.so.2")


def build_set(major: int, include_dirs: Sequence[Path], out: Path, cc: str | None = None) -> list[Path]:
    """Builds CUDA `major`'s set into `out` with the headers of `include_dirs`; BuildError says why not."""
    include_dirs = [Path(d) for d in include_dirs]
    check_headers(major, include_dirs)
    return SetBuilder(major, include_dirs, Path(out), cc or os.environ.get("CC", "cc")).build()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Builds one set of the fake GPU's stand-ins.")
    parser.add_argument("--major", type=int, choices=(12, 13), required=True)
    parser.add_argument("--include", action="append", default=[], help="a folder of CUDA headers (repeatable)")
    parser.add_argument("--out", required=True, help="the folder the libraries go to")
    args = parser.parse_args(argv)
    try:
        built = build_set(args.major, [Path(d) for d in args.include if d], Path(args.out))
    except BuildError as exc:
        print(f"fakegpu: CUDA {args.major} set: {exc}", file=sys.stderr)
        return 1
    print(f"fakegpu: CUDA {args.major} set in {built[0].parent}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
