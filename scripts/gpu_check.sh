#!/usr/bin/env bash
# One pass on a GPU machine: build torchmem against the torch already
# installed (never reinstalls it), run tests/cuda, then the GPU benchmark
# (benchmarks/bench_cuda.py) and policy:stitch's device calls
# (benchmarks/bench_stitch_cuda.py), with logs and results under $OUT.
#
#   OUT=/some/dir bash scripts/gpu_check.sh       # about 5 minutes on an H200
#   DRY_RUN=1 bash scripts/gpu_check.sh           # check the script where no GPU is: stops cleanly
#
# Environment: PYTHON (default python3), OUT (default out/gpu_check),
# TORCH_CUDA_ARCH_LIST (default 9.0), MAX_JOBS (default 16), CUDA_HOME
# (default: nvcc's prefix, else /usr/local/cuda), BUDGET_S (default 460: the
# whole run, so it ends within 8 minutes; each stage also has its own cap).
# Exit status: 0 when every stage passed, the number of failed stages
# otherwise; with no GPU, 0 under DRY_RUN=1, else 3.
set -uo pipefail

cd "$(dirname "$0")/.."
ROOT=$(pwd)
PY=${PYTHON:-python3}
OUT=${OUT:-$ROOT/out/gpu_check}
mkdir -p "$OUT"
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
START=$(date +%s)
FAILED=0

say() { echo "[gpu_check $(($(date +%s) - START))s] $*" | tee -a "$SUMMARY"; }

# The whole run stays under 8 minutes: each stage gets its own cap or what
# is left of BUDGET_S, whichever is smaller.
BUDGET_S=${BUDGET_S:-460}
left() { echo $((BUDGET_S - ($(date +%s) - START))); }

# stage NAME CAP_SECONDS COMMAND...: runs COMMAND with a time limit, output to $OUT/NAME.log.
stage() {
  local name=$1 limit=$2
  shift 2
  local budget
  budget=$(left)
  [ "$budget" -lt "$limit" ] && limit=$budget
  if [ "$limit" -lt 15 ]; then
    say "$name: SKIPPED, only ${budget}s of the ${BUDGET_S}s budget left"
    FAILED=$((FAILED + 1))
    return 124
  fi
  say "$name: start (limit ${limit}s)"
  local t0=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  local took=$(($(date +%s) - t0))
  if [ $rc -eq 0 ]; then
    say "$name: ok in ${took}s"
  else
    [ $rc -eq 124 ] && say "$name: TIMED OUT after ${limit}s" || say "$name: FAILED (exit $rc) after ${took}s"
    tail -n 40 "$OUT/$name.log" | sed "s/^/  $name| /" | tee -a "$SUMMARY"
    FAILED=$((FAILED + 1))
  fi
  return $rc
}

# --- environment -------------------------------------------------------------
{
  echo "date: $(date -u +%FT%TZ)"
  echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)"
  "$PY" - <<'EOF'
import sys
print("python:", sys.version.split()[0])
try:
    import torch
    print("torch:", torch.__version__, "cuda:", torch.version.cuda)
    print("gpu available:", torch.cuda.is_available(), "count:", torch.cuda.device_count())
    if torch.cuda.is_available():
        print("gpu:", torch.cuda.get_device_name(0))
except Exception as e:  # no torch: reported, the GPU test below stops the script
    print("torch: not importable:", e)
import importlib.util
missing = [m for m in ("setuptools", "ninja", "pytest", "numpy") if importlib.util.find_spec(m) is None]
print("python modules missing:", ", ".join(missing) or "none",
      "(setuptools is needed to build; the rest have fallbacks)" if missing else "")
EOF
  command -v nvcc >/dev/null && nvcc --version | tail -n 2
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt" | tee -a "$SUMMARY"

if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.version.cuda and torch.cuda.is_available() else 1)" 2>/dev/null; then
  if [ "${DRY_RUN:-0}" = 1 ]; then
    say "no CUDA GPU (or no CUDA build of torch) here: dry run stops before building"
    exit 0
  fi
  say "no CUDA GPU (or no CUDA build of torch) here: nothing to check"
  exit 3
fi

# --- build ---------------------------------------------------------------------
if [ -z "${CUDA_HOME:-}" ]; then
  if command -v nvcc >/dev/null; then
    CUDA_HOME=$(dirname "$(dirname "$(command -v nvcc)")")
  else
    CUDA_HOME=/usr/local/cuda
  fi
fi
export CUDA_HOME
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
export MAX_JOBS=${MAX_JOBS:-16}
say "build: CUDA_HOME=$CUDA_HOME TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST MAX_JOBS=$MAX_JOBS"

# In place, against the installed torch (no build isolation, no dependency
# install). Without ninja, torch compiles one source at a time; the build then
# runs setup.py with distutils' compile() spread over MAX_JOBS threads.
if "$PY" -c "import torch.utils.cpp_extension as c, sys; sys.exit(0 if c.is_ninja_available() else 1)" 2>/dev/null; then
  say "build: ninja found, $MAX_JOBS jobs"
  build() { stage build 200 "$PY" setup.py build_ext --inplace; }
else
  say "build: no ninja here: compiling $MAX_JOBS sources at a time through distutils"
  build() {
    stage build 260 "$PY" - build_ext --inplace <<'EOF'
import os, runpy, sys
from concurrent.futures import ThreadPoolExecutor

import setuptools  # noqa: F401  (its distutils)
from distutils import ccompiler


def parallel_compile(self, sources, output_dir=None, macros=None, include_dirs=None, debug=0,
                     extra_preargs=None, extra_postargs=None, depends=None):
    macros, objects, extra_postargs, pp_opts, build = self._setup_compile(
        output_dir, macros, include_dirs, sources, depends, extra_postargs)
    cc_args = self._get_cc_args(pp_opts, debug, extra_preargs)

    def one(obj):
        src, ext = build[obj]
        self._compile(obj, src, ext, cc_args, extra_postargs, pp_opts)

    jobs = int(os.environ.get("MAX_JOBS", "8"))
    print(f"gpu_check: compiling {len(build)} objects, {jobs} at a time", flush=True)
    with ThreadPoolExecutor(jobs) as pool:
        list(pool.map(one, [o for o in objects if o in build]))
    return objects


ccompiler.CCompiler.compile = parallel_compile
sys.argv = ["setup.py"] + sys.argv[1:]
runpy.run_path("setup.py", run_name="__main__")
EOF
  }
fi
if build; then
  stage import 40 "$PY" -c "
import torch, torchmem, torchmem._C as C
from torchmem import cuda
assert cuda.cuda_glue_built(), 'torchmem._C was built without its CUDA part'
print('torchmem', torchmem.__version__, 'CUDA part built; torch', torch.__version__)
"
else
  say "build failed: skipping tests and benchmark"
  say "done: $FAILED stage(s) failed; logs in $OUT"
  exit "$FAILED"
fi

# --- tests ---------------------------------------------------------------------
# With pytest if it is installed; otherwise with the small runner in tests/cuda.
# About 15 interpreters, each swapping the allocator (install, planned steps).
if "$PY" -c "import pytest" 2>/dev/null; then
  stage tests 200 "$PY" -m pytest -q -rs tests/cuda --junitxml="$OUT/tests.xml" -p no:cacheprovider
else
  say "tests: no pytest here, using tests/cuda/run_without_pytest.py"
  stage tests 200 "$PY" tests/cuda/run_without_pytest.py --junitxml "$OUT/tests.xml"
fi
grep -E "passed|failed|error" "$OUT/tests.log" | tail -n 3 | tee -a "$SUMMARY"

# --- benchmarks ----------------------------------------------------------------
# policy:stitch: what a 2 MiB page map/unmap costs here, and the policy on cuMem* pages.
stage stitch 60 "$PY" benchmarks/bench_stitch_cuda.py --out "$OUT/stitch"
[ -f "$OUT/stitch/bench_stitch_cuda.md" ] && cat "$OUT/stitch/bench_stitch_cuda.md" | tee -a "$SUMMARY"

stage bench "$(left)" "$PY" benchmarks/bench_cuda.py --out "$OUT/bench" --timeout 60
[ -f "$OUT/bench/bench_cuda.md" ] && cat "$OUT/bench/bench_cuda.md" | tee -a "$SUMMARY"
# bench_cuda.md ends with the native history replayed through torchmem's
# simulator; the snapshots stay for later replays.
ls "$OUT/bench"/*_snapshot.pickle 2>/dev/null | sed 's/^/native history kept: /' | tee -a "$SUMMARY"

say "done in $(($(date +%s) - START))s: $FAILED stage(s) failed; logs in $OUT"
exit "$FAILED"
