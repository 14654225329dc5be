#!/usr/bin/env bash
# Compiles torchmem's CUDA glue against the headers of given torch builds,
# without a GPU and without installing them: syntax, types and the virtual
# signatures the glue overrides (-fsyntax-only, -Werror=suggest-override on
# the glue).
#
#   scripts/check_cuda_build.sh TORCH [TORCH ...]
#
# TORCH: a torch wheel (a CUDA build, e.g. from `pip download --no-deps
# torch==2.11.0`; only its include/ is unpacked), a directory of such wheels
# (each torch-*.whl in it), or a directory holding torch/include (an unpacked
# wheel or an installed torch's site-packages). CUDA headers:
# $CUDA_HOME/include (default /usr/local/cuda). Python headers: this
# python3's. JOBS (default: the CPU count) files compile at a time. Ends
# with one line per torch, "compiles" or "FAILS"; exit status 0 when every
# file compiles against every torch, 1 otherwise (the errors above).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { sed -n '2,16p' "$0"; exit 2; }
CXX="${CXX:-g++}"
CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
JOBS="${JOBS:-$(nproc 2>/dev/null || echo 4)}"
PY_INCLUDE="$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"
[ -f "$CUDA_HOME/include/cuda_runtime.h" ] || { echo "check_cuda_build: no CUDA headers in $CUDA_HOME/include" >&2; exit 2; }
# Every file compiled with TORCHMEM_WITH_CUDA that includes CUDA or c10/cuda
# headers: the CUDA glue as setup.py picks it, and the bindings that use it.
GLUE="$(ls csrc/cuda/*.cpp csrc/torch/cuda_*.cpp 2>/dev/null; grep -l TORCHMEM_WITH_CUDA csrc/bindings/*.cpp || true)"
[ -n "$GLUE" ] || { echo "check_cuda_build: no CUDA glue found under csrc" >&2; exit 2; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# The torches named: a directory of wheels stands for its wheels.
torches=()
for arg in "$@"; do
  if [ -d "$arg" ] && [ ! -d "$arg/torch/include" ]; then
    found=0
    for whl in "$arg"/torch-*.whl; do [ -f "$whl" ] && { torches+=("$whl"); found=1; }; done
    [ $found = 1 ] || { echo "$arg: no torch/include and no torch-*.whl in it" >&2; torches+=("$arg"); }
  else
    torches+=("$arg")
  fi
done

status=0
verdicts=()
n=0
for torch_src in "${torches[@]}"; do
  n=$((n + 1))
  if [ -f "$torch_src" ]; then
    dir="$work/torch$n"
    mkdir -p "$dir"
    unzip -q "$torch_src" 'torch/include/*' 'torch/version.py' -d "$dir"
  else
    dir="$torch_src"
  fi
  include="$dir/torch/include"
  if [ ! -f "$include/c10/cuda/impl/cuda_cmake_macros.h" ]; then
    echo "$torch_src: not a CUDA build of torch (no c10/cuda)" >&2
    verdicts+=("FAILS      $torch_src: not a CUDA build of torch")
    status=1
    continue
  fi
  version="$(sed -n "s/^__version__ = '\(.*\)'/\1/p" "$dir/torch/version.py" 2>/dev/null || true)"
  minor="$(echo "$version" | sed -n 's/^2\.\([0-9]*\)\..*/\1/p')"
  std="c++17"; [ "${minor:-0}" -ge 14 ] && std="c++20"  # what torch.utils.cpp_extension picks
  echo "== $torch_src (torch ${version:-unknown}, -std=$std)"
  # Each file on its own, JOBS at a time; reported in order.
  i=0
  for src in $GLUE; do
    i=$((i + 1))
    extra=""
    case "$src" in csrc/torch/*) extra="-Werror=suggest-override" ;; esac
    (
      if "$CXX" -std="$std" -fsyntax-only -Wall $extra -DTORCHMEM_WITH_CUDA=1 -Icsrc -I"$include" \
          -I"$include/torch/csrc/api/include" -I"$CUDA_HOME/include" -I"$PY_INCLUDE" "$src" 2>"$work/err$i"; then
        echo 0 >"$work/rc$i"
      else
        echo 1 >"$work/rc$i"
      fi
    ) &
    if [ $((i % JOBS)) -eq 0 ]; then wait; fi
  done
  wait
  i=0
  failed=0
  for src in $GLUE; do
    i=$((i + 1))
    if [ "$(cat "$work/rc$i")" = 0 ]; then
      echo "   ok      $src"
    else
      echo "   FAILED  $src"; sed 's/^/     /' "$work/err$i" | head -40; failed=$((failed + 1))
    fi
  done
  if [ $failed = 0 ]; then
    verdicts+=("compiles   torch ${version:-unknown} ($torch_src): $i files")
  else
    verdicts+=("FAILS      torch ${version:-unknown} ($torch_src): $failed of $i files")
    status=1
  fi
  if [ -f "$torch_src" ]; then rm -rf "$dir"; fi
done
echo "== summary"
printf '%s\n' "${verdicts[@]}"
exit $status
