#!/usr/bin/env bash
# Compiles torchmem's CUDA glue against the headers of given torch builds,
# without a GPU and without installing them: syntax, types and the virtual
# signatures the glue overrides (-fsyntax-only, -Werror=suggest-override on
# the glue).
#
#   scripts/check_cuda_build.sh TORCH [TORCH ...]
#
# TORCH: a torch wheel (a CUDA build, e.g. from `pip download --no-deps
# torch==2.11.0`), or a directory holding torch/include (an unpacked wheel or
# an installed torch's site-packages). CUDA headers: $CUDA_HOME/include
# (default /usr/local/cuda). Python headers: this python3's. Exit status 0
# when every file compiles against every torch; the errors otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { sed -n '2,13p' "$0"; exit 2; }
CXX="${CXX:-g++}"
CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
PY_INCLUDE="$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"
[ -f "$CUDA_HOME/include/cuda_runtime.h" ] || { echo "check_cuda_build: no CUDA headers in $CUDA_HOME/include" >&2; exit 2; }
# Every file compiled with TORCHMEM_WITH_CUDA that includes CUDA or c10/cuda headers.
GLUE="csrc/torch/cuda_allocator.cpp csrc/cuda/cuda_device.cpp csrc/bindings/cuda_bindings.cpp csrc/bindings/oom_bindings.cpp csrc/bindings/module.cpp"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
status=0
for torch_src in "$@"; do
  if [ -f "$torch_src" ]; then
    dir="$work/$(basename "$torch_src")"
    mkdir -p "$dir"
    unzip -q "$torch_src" 'torch/include/*' 'torch/version.py' -d "$dir"
  else
    dir="$torch_src"
  fi
  include="$dir/torch/include"
  [ -f "$include/c10/cuda/impl/cuda_cmake_macros.h" ] || { echo "$torch_src: not a CUDA build of torch (no c10/cuda)" >&2; status=1; continue; }
  minor="$(sed -n "s/^__version__ = '2\.\([0-9]*\)\..*/\1/p" "$dir/torch/version.py")"
  std="c++17"; [ "${minor:-0}" -ge 14 ] && std="c++20"  # what torch.utils.cpp_extension picks
  echo "== $torch_src (torch 2.$minor, -std=$std)"
  for src in $GLUE; do
    extra=""
    case "$src" in csrc/torch/*) extra="-Werror=suggest-override" ;; esac
    if "$CXX" -std="$std" -fsyntax-only -Wall $extra -DTORCHMEM_WITH_CUDA=1 -Icsrc -I"$include" \
        -I"$include/torch/csrc/api/include" -I"$CUDA_HOME/include" -I"$PY_INCLUDE" "$src" 2>"$work/err"; then
      echo "   ok      $src"
    else
      echo "   FAILED  $src"; sed 's/^/     /' "$work/err" | head -40; status=1
    fi
  done
done
exit $status
