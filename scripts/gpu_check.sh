#!/usr/bin/env bash
# One pass on a GPU machine, one call, within 8 minutes: build torchmem against
# the torch already installed (never reinstalls it), run tests/cuda (the
# allocator's semantics under PyTorch's features: CUDA graphs, MemPool,
# record_stream races, native history replayed exactly, ...), then
# expandable segments under memory pressure alone on the GPU, then the GPU
# benchmark (benchmarks/bench_cuda.py: native vs torchmem, alternating), with
# policy:stitch's page maps timed first (benchmarks/bench_stitch_cuda.py), and
# last the benchmark's native runs recorded again on the fake GPU and compared
# with the card's, event by event (benchmarks/fake_vs_card.py).
#
#   OUT=/some/dir bash scripts/gpu_check.sh       # 6.5 minutes on an H200 (BENCHMARKS.md, "Real GPU")
#   DRY_RUN=1 bash scripts/gpu_check.sh           # check the script where no GPU is: stops cleanly
#   REHEARSE=1 PYTHON=/venv/with/cuda/torch/bin/python bash scripts/gpu_check.sh
#                                                 # no GPU, but every stage runs (GPU tests skip)
#   FAKEGPU=1 bash scripts/gpu_check.sh           # no GPU: every stage runs on torchmem's fake GPU
#
# FAKEGPU=1 runs the whole check on the fake GPU (fakegpu/, torchmem.fakegpu):
# PyTorch's CUDA build on a fake CUDA runtime, its real caching allocator and
# torchmem's real glue on host memory. It builds the fake GPU (make fakegpu)
# and torchmem into build/cuda-TORCHVERSION (FAKEGPU_BUILD; the in-tree
# extension is left alone, it may be another torch's), loads that build
# through TORCHMEM_EXT_DIR, and runs every stage with the fake runtime
# preloaded. PYTHON defaults to .venv-cuda/bin/python there. Kernels do not
# run on the fake GPU: checks of computed values skip (they say so), and the
# benchmark's step times are the CPU's (PyTorch's dispatch and the
# allocator), not a GPU's.
#
# Leaves at most 7 files in $OUT: summary.txt (what was printed), logs.tar.gz
# (every stage's log, the JUnit XML, env.txt, the benchmark's runs; packed
# again after each stage, so a run cut short still leaves its logs),
# bench_cuda.md and bench_cuda.json (the benchmark's table and results), and
# native_snapshots.tar.gz (the native allocator's recorded histories, the
# ones that fit in 15 MiB), preflight_accuracy.md and .json (preflight against
# the card, benchmarks/preflight_accuracy.py). Standard output stays under 10,000 characters.
#
# Environment: PYTHON (default python3), OUT (default out/gpu_check),
# TORCH_CUDA_ARCH_LIST (default 9.0), MAX_JOBS (default 16), CUDA_HOME
# (default: nvcc's prefix, else /usr/local/cuda), BUDGET_S (default 460: the
# whole run, so it ends within 8 minutes; each stage also has its own cap),
# TEST_WORKERS (default 6: pytest-xdist workers for tests/cuda, where it is
# installed), TESTS_CAP_S (the tests stage's cap: default 240 s, 170 with
# xdist; a small machine on the fake GPU needs more). Exit status: 0 when every stage passed, the number of failed
# stages otherwise; with no GPU, 0 under DRY_RUN=1, else 3.
set -uo pipefail

cd "$(dirname "$0")/.."
ROOT=$(pwd)
FAKEGPU=${FAKEGPU:-0}
if [ "$FAKEGPU" = 1 ] && [ -z "${PYTHON:-}" ] && [ -x "$ROOT/.venv-cuda/bin/python" ]; then
  PYTHON=$ROOT/.venv-cuda/bin/python
fi
PY=${PYTHON:-python3}
OUT=${OUT:-$ROOT/out/gpu_check}
mkdir -p "$OUT"
rm -f "$OUT/summary.txt" "$OUT/logs.tar.gz" "$OUT/bench_cuda.md" "$OUT/bench_cuda.json" "$OUT/native_snapshots.tar.gz"
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
# Logs are written outside $OUT and packed into $OUT/logs.tar.gz.
STAGING=$(mktemp -d)
LOGS=$STAGING/gpu_check
mkdir -p "$LOGS"
trap 'rm -rf "$STAGING"' EXIT
START=$(date +%s)
FAILED=0
FAKEGPU_NOTE=""

# Standard output, and summary.txt with it, stays under SUMMARY_MAX characters
# (the last line is always printed); everything goes to summary_full.txt in
# the logs.
SUMMARY_MAX=${SUMMARY_MAX:-9000}
emit() {
  local text used room
  text=$(cut -c1-300)
  [ -n "$text" ] || return 0
  printf '%s\n' "$text" >>"$LOGS/summary_full.txt"
  used=$(wc -c <"$SUMMARY")
  room=$((SUMMARY_MAX - used))
  if [ $((${#text} + 1)) -le "$room" ]; then
    printf '%s\n' "$text" | tee -a "$SUMMARY"
  elif [ ! -e "$LOGS/.summary_full" ]; then
    : >"$LOGS/.summary_full"
    [ "$room" -gt 200 ] && printf '%s\n' "$text" | head -c $((room - 200)) | sed '$d' | tee -a "$SUMMARY"
    echo "[gpu_check] ... summary cut at $SUMMARY_MAX characters; all of it: summary_full.txt in logs.tar.gz" | tee -a "$SUMMARY"
  fi
}
say() { echo "[gpu_check $(($(date +%s) - START))s] $*" | emit; }

# Packs the logs (not the snapshots) into $OUT/logs.tar.gz.
pack() {
  tar -czf "$OUT/logs.tar.gz.tmp" -C "$STAGING" --exclude='*.pickle' --exclude='.summary_full' gpu_check 2>/dev/null &&
    mv "$OUT/logs.tar.gz.tmp" "$OUT/logs.tar.gz"
}

# The whole run stays under 8 minutes: each stage gets its own cap or what
# is left of BUDGET_S, whichever is smaller.
BUDGET_S=${BUDGET_S:-460}
left() { echo $((BUDGET_S - ($(date +%s) - START))); }

# stage NAME CAP_SECONDS COMMAND...: runs COMMAND with a time limit, output to NAME.log in the logs.
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
  timeout --kill-after=10 "$limit" "$@" >"$LOGS/$name.log" 2>&1
  local rc=$?
  local took=$(($(date +%s) - t0))
  if [ $rc -eq 0 ]; then
    say "$name: ok in ${took}s"
  else
    [ $rc -eq 124 ] && say "$name: TIMED OUT after ${limit}s" || say "$name: FAILED (exit $rc) after ${took}s"
    # pytest's failures when there are, else the end of the log.
    if grep -qE "^(FAILED|ERROR) " "$LOGS/$name.log"; then
      { grep -E "^(FAILED|ERROR) " "$LOGS/$name.log" | head -n 20; tail -n 1 "$LOGS/$name.log"; }
    else
      tail -n 12 "$LOGS/$name.log"
    fi | sed "s/^/  $name| /" | emit
    FAILED=$((FAILED + 1))
  fi
  pack
  return $rc
}

finish() {
  pack
  echo "[gpu_check $(($(date +%s) - START))s] $*" | tee -a "$SUMMARY"
}

# The benchmarks run as scripts from benchmarks/: torchmem (built in place, or
# loaded through TORCHMEM_EXT_DIR) comes from the tree.
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}

# --- the fake GPU (FAKEGPU=1) ---------------------------------------------------
# Its libraries and torchmem's build for this torch, outside the tree; then
# the fake runtime's environment for every later command.
if [ "$FAKEGPU" = 1 ]; then
  FAKEGPU_BUILD=${FAKEGPU_BUILD:-$ROOT/build/cuda-$("$PY" -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null || echo unknown)}
  # TORCHMEM_FAKEGPU_LIBS given: the fake GPU's libraries are there already; else make builds them.
  if [ -z "${TORCHMEM_FAKEGPU_LIBS:-}" ] && ! make -s fakegpu PYTHON="$PY" >"$LOGS/fakegpu_libs.log" 2>&1; then
    echo "[gpu_check 0s] fake GPU: its libraries did not build (make fakegpu):" | tee -a "$SUMMARY"
    tail -n 8 "$LOGS/fakegpu_libs.log" | sed 's/^/  fakegpu| /' | cut -c1-300 | tee -a "$SUMMARY"
    pack
    exit 1
  fi
  export TORCHMEM_FAKEGPU_LIBS=${TORCHMEM_FAKEGPU_LIBS:-$ROOT/build/fakegpu}
  export TORCHMEM_FAKEGPU_DATA=1  # the CUDA tests check that blocks keep their bytes (fakegpu/cudart/contents.c)
  export TORCHMEM_EXT_DIR=$FAKEGPU_BUILD/lib/torchmem
  export TORCHMEM_FAKEGPU_LOG=$LOGS/fakegpu_unimplemented.log
  export TORCHMEM_FAKEGPU_REQUIRED=1
  fake_env=$("$PY" -c '
import shlex
from torchmem.fakegpu import environment
for k, v in environment().items():
    if k.startswith(("TORCHMEM_FAKEGPU", "LD_")):
        print(f"export {k}={shlex.quote(v)}")
' 2>"$LOGS/fakegpu_env.log") || { echo "[gpu_check 0s] fake GPU: no environment (torchmem.fakegpu):" | tee -a "$SUMMARY";
    tail -n 5 "$LOGS/fakegpu_env.log" | tee -a "$SUMMARY"; pack; exit 1; }
  eval "$fake_env"
  FAKEGPU_NOTE=" on the fake GPU"
fi

# --- environment -------------------------------------------------------------
{
  echo "date: $(date -u +%FT%TZ)"
  [ "$FAKEGPU" = 1 ] && echo "device: torchmem's fake GPU (fakegpu/; build $FAKEGPU_BUILD)"
  echo "commit: $(git rev-parse --verify -q HEAD 2>/dev/null || echo unknown)$(git status --porcelain 2>/dev/null | grep -q . && echo ' (with uncommitted changes)')"
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
missing = [m for m in ("setuptools", "ninja", "pytest", "numpy", "xdist") if importlib.util.find_spec(m) is None]
print("python modules missing:", ", ".join(missing) or "none",
      "(setuptools is needed to build; the rest have fallbacks)" if missing else "")
EOF
  command -v nvcc >/dev/null && nvcc --version | tail -n 2
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
} >"$LOGS/env.txt" 2>&1
emit <"$LOGS/env.txt"

HAVE_GPU=1
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.version.cuda and torch.cuda.is_available() else 1)" 2>/dev/null; then
  HAVE_GPU=0
  if [ "${REHEARSE:-0}" = 1 ]; then
    say "no CUDA GPU here: rehearsing, every stage runs (the GPU tests skip, the benchmark measures nothing)"
  elif [ "${DRY_RUN:-0}" = 1 ]; then
    say "no CUDA GPU (or no CUDA build of torch) here: dry run stops before building"
    finish "done: dry run"
    exit 0
  else
    say "no CUDA GPU (or no CUDA build of torch) here: nothing to check"
    finish "done: nothing checked"
    exit 3
  fi
fi

# --- build ---------------------------------------------------------------------
# The first toolkit with CUDA's headers: nvcc's prefix (through links; nvcc
# may also be a wrapper script elsewhere), /usr/local/cuda, torch's guess.
if [ -z "${CUDA_HOME:-}" ]; then
  nvcc_prefix=""
  command -v nvcc >/dev/null && nvcc_prefix=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
  for candidate in "$nvcc_prefix" /usr/local/cuda \
      "$("$PY" -c 'from torch.utils.cpp_extension import CUDA_HOME; print(CUDA_HOME or "")' 2>/dev/null)"; do
    if [ -n "$candidate" ] && [ -f "$candidate/include/cuda_runtime.h" ]; then
      CUDA_HOME=$candidate
      break
    fi
  done
  CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
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
  if [ "$FAKEGPU" = 1 ]; then
    build() { stage build 240 "$PY" setup.py -q build_ext --build-temp "$FAKEGPU_BUILD/temp" --build-lib "$FAKEGPU_BUILD/lib"; }
  else
    build() { stage build 240 "$PY" setup.py build_ext --inplace; }
  fi
else
  say "build: no ninja here: compiling $MAX_JOBS sources at a time through distutils"
  build() {
    if [ "$FAKEGPU" = 1 ]; then build_args=(build_ext --build-temp "$FAKEGPU_BUILD/temp" --build-lib "$FAKEGPU_BUILD/lib")
    else build_args=(build_ext --inplace); fi
    stage build 260 "$PY" - "${build_args[@]}" <<'EOF'
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
  finish "done: $FAILED stage(s) failed; logs in $OUT/logs.tar.gz"
  exit "$FAILED"
fi

# --- tests ---------------------------------------------------------------------
# With pytest if it is installed (and pytest-xdist's workers where it is: each
# test runs its GPU work in interpreters of its own); otherwise with the small
# runner in tests/cuda. About 30 interpreters, each swapping the allocator.
# The memory-pressure test takes the whole GPU: a stage of its own, after.
PRESSURE=tests/cuda/test_cuda_pressure.py
export COLUMNS=250  # pytest's short summary lines: wide enough to say what differed
if "$PY" -c "import pytest" 2>/dev/null; then
  extra=()
  cap=240  # one at a time: about 30 interpreters of 5 s, and the CPU-side checks
  if "$PY" -c "import xdist" 2>/dev/null; then extra+=(-n "${TEST_WORKERS:-6}"); cap=170; fi
  cap=${TESTS_CAP_S:-$cap}
  "$PY" -c "import pytest_timeout" 2>/dev/null && extra+=(--timeout 200)
  stage tests "$cap" "$PY" -m pytest -q -rfEs tests/cuda --ignore="$PRESSURE" --junitxml="$LOGS/tests.xml" \
    -p no:cacheprovider "${extra[@]}" && grep -E "passed|failed|error" "$LOGS/tests.log" | tail -n 1 | emit
  stage pressure 100 "$PY" -m pytest -q -rfEs "$PRESSURE" --junitxml="$LOGS/pressure.xml" -p no:cacheprovider &&
    grep -E "passed|failed|error|skipped" "$LOGS/pressure.log" | tail -n 1 | emit
else
  say "tests: no pytest here, using tests/cuda/run_without_pytest.py (the pressure test among the others)"
  stage tests 230 "$PY" tests/cuda/run_without_pytest.py --junitxml "$LOGS/tests.xml" &&
    grep -E "passed|failed|error" "$LOGS/tests.log" | tail -n 1 | emit
fi

# --- policy:stitch ---------------------------------------------------------------
# What a 2 MiB page map/unmap costs here, and the policy on cuMem* pages.
stage stitch 45 "$PY" benchmarks/bench_stitch_cuda.py --out "$LOGS/stitch" &&
  [ -f "$LOGS/stitch/bench_stitch_cuda.md" ] && emit <"$LOGS/stitch/bench_stitch_cuda.md"

# --- preflight against the card ------------------------------------------------------
# The same workloads recorded on the GPU and under torchmem preflight (fake GPU, a card of this one's memory
# and compute capability): peaks and the share of allocations at the same offset (docs/preflight.md).
pf_args=(--out "$LOGS/preflight")
[ "$FAKEGPU" = 1 ] || [ "${REHEARSE:-0}" = 1 ] && pf_args+=(--rehearse)
stage preflight 150 bash -c "make -s fakegpu PYTHON='$PY' >/dev/null && '$PY' benchmarks/preflight_accuracy.py ${pf_args[*]}" &&
  [ -f "$LOGS/preflight/preflight_accuracy.md" ] && emit <"$LOGS/preflight/preflight_accuracy.md" &&
  cp "$LOGS/preflight/preflight_accuracy.md" "$LOGS/preflight/preflight_accuracy.json" "$OUT/" 2>/dev/null

# --- benchmark -----------------------------------------------------------------
# What is left of the budget, less 60 s for fake_vs_card and 15 s to pack the
# results; the benchmark starts only the runs that fit.
stage bench "$(($(left) - 60))" "$PY" benchmarks/bench_cuda.py --out "$LOGS/bench" --timeout 60 --budget $(($(left) - 75))
if [ -f "$LOGS/bench/bench_cuda.md" ]; then
  emit <"$LOGS/bench/bench_cuda.md"
  cp "$LOGS/bench/bench_cuda.md" "$LOGS/bench/bench_cuda.json" "$OUT/" 2>/dev/null
fi
# The same native runs on the fake GPU (built by the preflight stage), event by event against the card's.
if [ -f "$LOGS/bench/bench_cuda.json" ] && [ -f "$ROOT/build/fakegpu/libtorchmem_fakecudart.so" ]; then
  stage fake_vs_card 60 "$PY" benchmarks/fake_vs_card.py --results "$LOGS/bench/bench_cuda.json" \
    --snapshots "$LOGS/bench" --workloads empty_del size_classes empty_del_rs &&
    grep "^|" "$LOGS/fake_vs_card.log" | emit
fi
# The native allocator's recorded histories, for later replays: the ones that fit in 15 MiB, packed.
snaps=()
for snap in $(ls -S -r "$LOGS/bench"/*_snapshot.pickle 2>/dev/null); do
  tar -czf "$STAGING/try.tar.gz" -C "$LOGS/bench" "${snaps[@]}" "$(basename "$snap")" 2>/dev/null
  if [ "$(wc -c <"$STAGING/try.tar.gz")" -le $((15 * 1024 * 1024)) ]; then
    snaps+=("$(basename "$snap")")
    mv "$STAGING/try.tar.gz" "$OUT/native_snapshots.tar.gz"
  else
    say "native history $(basename "$snap") left out: over 15 MiB packed"
  fi
done
[ ${#snaps[@]} -gt 0 ] && say "native histories kept in native_snapshots.tar.gz: ${snaps[*]}"

if [ "$FAKEGPU" = 1 ] && [ -s "$TORCHMEM_FAKEGPU_LOG" ]; then
  say "fake GPU: entry points it does not implement were called: $(sort -u "$TORCHMEM_FAKEGPU_LOG" | head -c 400 | tr '\n' ' ')"
fi
finish "done in $(($(date +%s) - START))s$FAKEGPU_NOTE: $FAILED stage(s) failed; $(ls "$OUT" | wc -l) files in $OUT"
exit "$FAILED"
