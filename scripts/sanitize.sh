#!/usr/bin/env bash
# Builds the C++ drivers of the core (tests/cpp/core_driver.cpp with its
# component files tests/cpp/core/*.cpp, tests/cpp/stitch_driver.cpp and
# tests/cpp/device_memory_driver.cpp, each linked with every
# csrc/core/**/*.cpp)
# under AddressSanitizer + UndefinedBehaviorSanitizer (LeakSanitizer on)
# and, separately, ThreadSanitizer, and runs them.
#
#   scripts/sanitize.sh                 full run
#   TORCHMEM_QUICK=1 scripts/sanitize.sh   quick run for CI (smaller loops, -O0 builds)
#   SANITIZERS="asan" scripts/sanitize.sh  only one of: asan tsan (plain: no sanitizer)
#
# Objects are cached under build/sanitize/<flavour>/ and rebuilt when a
# source or header changes. Exit status: 0 when every run is clean; 2 when
# the compiler lacks a sanitizer runtime (the message says which).
# Environment: CXX (default g++), MAX_JOBS (parallel compiles, default 2).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
CXX="${CXX:-g++}"
JOBS="${MAX_JOBS:-2}"
QUICK="${TORCHMEM_QUICK:-0}"
SANITIZERS="${SANITIZERS:-asan tsan}"
[ "$QUICK" = "0" ] && QUICK=""

if [ -n "$QUICK" ]; then OPT="-O0"; DRIVER_ARGS="--quick"; else OPT="-O1"; DRIVER_ARGS=""; fi
COMMON="-std=c++17 -g $OPT -fno-omit-frame-pointer -pthread -Icsrc"

flags_for() {
  case "$1" in
    asan) echo "-fsanitize=address,undefined -fno-sanitize-recover=undefined" ;;
    tsan) echo "-fsanitize=thread" ;;
    plain) echo "" ;;  # no sanitizer: the quick build behind tests/package/test_sanitizers.py
    *) echo "unknown sanitizer $1" >&2; exit 1 ;;
  esac
}

# Can the compiler link a program with this sanitizer?
probe() {
  local flags="$1" dir
  dir="$(mktemp -d)"
  printf '#include <thread>\nint main(){int x=0;std::thread t([&]{x=1;});t.join();return x-1;}\n' > "$dir/p.cpp"
  if "$CXX" $flags -pthread "$dir/p.cpp" -o "$dir/p" >"$dir/log" 2>&1 && "$dir/p" >>"$dir/log" 2>&1; then
    rm -rf "$dir"; return 0
  fi
  cat "$dir/log" >&2; rm -rf "$dir"; return 1
}

SOURCES=$(find csrc/core -name '*.cpp' | sort)
DRIVERS="core_driver stitch_driver device_memory_driver"  # tests/cpp/<name>.cpp, each with its own main()
# A driver's own files: tests/cpp/<name>.cpp, and for <x>_driver the
# component files tests/cpp/<x>/*.cpp when that folder exists.
parts_of() {
  echo "tests/cpp/$1.cpp"
  local dir="tests/cpp/${1%_driver}"
  if [ -d "$dir" ]; then find "$dir" -name '*.cpp' | sort; fi
}
HEADERS=$(find csrc/core tests/cpp -name '*.h' | sort)
HEADER_STAMP=$(cat $HEADERS | sha256sum | cut -c1-16)

build() {
  local name="$1" flags
  flags="$(flags_for "$name")"
  local dir="build/sanitize/$name${QUICK:+-quick}"
  mkdir -p "$dir"
  # Objects are keyed by the flags and the headers; sources by mtime (make-like).
  local stamp="$dir/.stamp"
  local key="$CXX $COMMON $flags $HEADER_STAMP"
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$key" ]; then rm -f "$dir"/*.o; echo "$key" > "$stamp"; fi
  local jobs=()
  local drivers=""
  for d in $DRIVERS; do drivers="$drivers $(parts_of "$d" | tr '\n' ' ')"; done
  for src in $SOURCES $drivers; do
    local obj="$dir/$(echo "$src" | tr / _).o"
    if [ ! -f "$obj" ] || [ "$src" -nt "$obj" ]; then jobs+=("$src|$obj"); fi
  done
  if [ ${#jobs[@]} -gt 0 ]; then
    echo "== $name: compiling ${#jobs[@]} files ($OPT, $JOBS jobs)" >&2
    printf '%s\n' "${jobs[@]}" | xargs -P "$JOBS" -I{} sh -c \
      'src="${1%%|*}"; obj="${1##*|}"; '"$CXX $COMMON $flags"' -c "$src" -o "$obj.tmp" && mv "$obj.tmp" "$obj"' _ {} >&2 \
      || return 1
  fi
  local core_objs=()
  for src in $SOURCES; do core_objs+=("$dir/$(echo "$src" | tr / _).o"); done
  for d in $DRIVERS; do
    local driver_objs=()
    for src in $(parts_of "$d"); do driver_objs+=("$dir/$(echo "$src" | tr / _).o"); done
    rm -f "$dir/$d"
    "$CXX" $COMMON $flags "${core_objs[@]}" "${driver_objs[@]}" -o "$dir/$d" >&2 || return 1
  done
  echo "$dir"
}

status=0
for name in $SANITIZERS; do
  if ! probe "$(flags_for "$name")" 2>/tmp/torchmem_sanitize_probe.$$; then
    echo "sanitize.sh: $CXX cannot build with $(flags_for "$name"):" >&2
    cat /tmp/torchmem_sanitize_probe.$$ >&2
    rm -f /tmp/torchmem_sanitize_probe.$$
    echo "sanitize.sh: install the runtime (Debian: libasan/libubsan/libtsan for g++, or clang with libclang-rt-dev)" >&2
    exit 2
  fi
  rm -f /tmp/torchmem_sanitize_probe.$$
  if ! dir="$(build "$name")" || [ ! -d "$dir" ]; then
    echo "== $name: BUILD FAILED" >&2
    status=1
    continue
  fi
  case "$name" in
    asan)
      export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:halt_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1"
      export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
      export LSAN_OPTIONS="report_objects=1"
      ;;
    tsan)
      export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1"
      ;;
  esac
  clean=1
  for d in $DRIVERS; do
    echo "== $name: $dir/$d $DRIVER_ARGS"
    if ! "$dir/$d" $DRIVER_ARGS; then
      echo "== $name: $d FAILED" >&2
      clean=0
    fi
  done
  if [ "$clean" = 1 ]; then
    echo "== $name: clean"
  else
    echo "== $name: FAILED" >&2
    status=1
  fi
done
exit $status
