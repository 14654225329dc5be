"""scripts/gpu_check.sh's shell logic, on any machine: a dry run without a GPU
stops cleanly, and with a stand-in interpreter the stages run in order, time
limits apply, failures are counted and reported, results land in $OUT (at
most 8 files, the logs packed) and standard output stays under 10,000
characters."""
import os
import pathlib
import shutil
import subprocess
import tarfile
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None,
                                reason="needs bash and coreutils timeout")

# A stand-in for python: answers the GPU probe, "builds", runs a failing test
# stage and a benchmark that writes its table, and records every call.
FAKE_PYTHON = textwrap.dedent(
    """\
    #!/usr/bin/env bash
    echo "$*" >> "$FAKE_LOG"
    args="$*"
    case "$args" in
      *"sys.exit(0 if torch.version.cuda"*) exit "${FAKE_GPU:-0}" ;;
      -) cat >/dev/null; echo "torch: fake"; exit 0 ;;
      *"is_ninja_available"*) exit "${FAKE_NO_NINJA:-0}" ;;
      *"setup.py build_ext --inplace"*) echo built; exit "${FAKE_BUILD_RC:-0}" ;;
      "- build_ext --inplace") cat > "$FAKE_LOG.stdin"; echo built; exit "${FAKE_BUILD_RC:-0}" ;;
      *"cuda_glue_built"*) exit 0 ;;
      *"import pytest"*) exit "${FAKE_NO_PYTEST:-0}" ;;
      *"import xdist"*) exit "${FAKE_NO_XDIST:-0}" ;;
      *"-rfEs tests/cuda/test_cuda_pressure.py"*) echo "1 passed in 20.0s"; exit 0 ;;
      *"-m pytest"*|*"run_without_pytest.py"*)
        echo "FAILED tests/cuda/test_x.py::test_1 - AssertionError: $(head -c 400 /dev/zero | tr '\\0' x)"
        for i in $(seq 20); do echo "SKIPPED [1] tests/cuda/test_y.py:$i: needs a CUDA GPU"; done
        echo "1 failed, 12 passed, 20 skipped in 3.0s"; exit 1 ;;
      *"bench_cuda.py"*) out=$(echo "$args" | sed 's/.*--out \\([^ ]*\\).*/\\1/'); mkdir -p "$out";
                         echo "| gpt2 | torchmem | 1.0 |" > "$out/bench_cuda.md"; echo "{}" > "$out/bench_cuda.json";
                         for i in $(seq "${FAKE_BENCH_ROWS:-0}"); do echo "| row $i | $(head -c 200 /dev/zero | tr '\\0' y) |"; done >> "$out/bench_cuda.md";
                         echo run > "$out/gpt2_native.log"; : > "$out/gpt2_native_snapshot.pickle"; exit 0 ;;
      *) exit 0 ;;
    esac
    """
)


SCRIPT_SETTINGS = ("PYTHON", "OUT", "DRY_RUN", "REHEARSE", "BUDGET_S", "SUMMARY_MAX", "TEST_WORKERS", "CUDA_HOME",
                   "MAX_JOBS", "TORCH_CUDA_ARCH_LIST", "FAKEGPU", "FAKEGPU_BUILD", "TESTS_CAP_S",
                   "TORCHMEM_FAKEGPU_LIBS", "TORCHMEM_EXT_DIR", "TORCHMEM_FAKEGPU_LOG")


def run_script(tmp_path, **env):
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    # A stand-in for make too: the preflight stage builds the fake GPU's libraries, which a fresh
    # checkout does not have and which the stand-in python cannot generate.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "make").write_text('#!/usr/bin/env bash\necho "make $*" >> "$FAKE_LOG"\n')
    (bin_dir / "make").chmod(0o755)
    out = tmp_path / "out"
    # The script's own settings are not inherited (these tests also run inside a gpu_check.sh run).
    inherited = {k: v for k, v in os.environ.items() if k not in SCRIPT_SETTINGS}
    full_env = dict(inherited, PYTHON=str(fake), OUT=str(out), FAKE_LOG=str(tmp_path / "calls.log"),
                    PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", **env)
    proc = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, env=full_env, timeout=120)
    calls = (tmp_path / "calls.log").read_text() if (tmp_path / "calls.log").exists() else ""
    return proc, out, calls


def test_script_parses():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


def test_dry_run_without_gpu_stops_cleanly(tmp_path):
    proc, out, calls = run_script(tmp_path, FAKE_GPU="1", DRY_RUN="1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "dry run stops before building" in proc.stdout
    assert "setup.py" not in calls
    assert "env.txt" in archived(out)


def test_without_gpu_and_not_dry_run_exits_3(tmp_path):
    proc, _, calls = run_script(tmp_path, FAKE_GPU="1")
    assert proc.returncode == 3
    assert "setup.py" not in calls


def test_fake_gpu_mode_builds_outside_the_tree_and_says_so(tmp_path):
    """FAKEGPU=1: torchmem is built into FAKEGPU_BUILD (never in place: the tree's
    extension may be another torch's), loaded from there, and every stage runs."""
    libs = tmp_path / "libs"
    libs.mkdir()
    build = tmp_path / "build"
    proc, out, calls = run_script(tmp_path, FAKE_GPU="0", FAKEGPU="1", FAKEGPU_BUILD=str(build),
                                  TORCHMEM_FAKEGPU_LIBS=str(libs), TESTS_CAP_S="100")
    assert proc.returncode == 1, proc.stdout + proc.stderr  # the stand-in's test stage fails, the rest pass
    build_call = next(line for line in calls.splitlines() if "setup.py" in line)
    assert f"--build-lib {build}/lib" in build_call and "--inplace" not in calls
    assert "from torchmem.fakegpu import environment" in calls
    summary = (out / "summary.txt").read_text()
    assert "device: torchmem's fake GPU" in summary and "tests: start (limit 100s)" in summary
    assert "build: ok" in summary and "pressure: ok" in summary and "bench: ok" in summary
    assert "on the fake GPU: 1 stage(s) failed" in summary


def archived(out: pathlib.Path) -> set[str]:
    with tarfile.open(out / "logs.tar.gz") as tar:
        return {pathlib.Path(m).name for m in tar.getnames()}


def test_stages_run_in_order_and_failures_are_counted(tmp_path):
    proc, out, calls = run_script(tmp_path, FAKE_GPU="0")
    assert proc.returncode == 1, proc.stdout + proc.stderr  # the test stage failed, the rest passed
    stages = ["setup.py build_ext --inplace", "cuda_glue_built", "-m pytest", "test_cuda_pressure.py",
              "make -s fakegpu", "preflight_accuracy.py", "bench_cuda.py"]
    assert sorted((calls.index(c) for c in stages if c in calls)) == [calls.index(c) for c in stages]
    assert calls.index("setup.py") < calls.index("-m pytest") < calls.index("bench_cuda.py")
    tests_call = next(line for line in calls.splitlines() if "-m pytest" in line and "--ignore" in line)
    assert "--ignore=tests/cuda/test_cuda_pressure.py" in tests_call and "-n 6" in tests_call
    assert "--budget" in next(line for line in calls.splitlines() if "bench_cuda.py" in line)
    summary = (out / "summary.txt").read_text()
    assert summary == proc.stdout
    assert "tests: FAILED (exit 1)" in summary and "FAILED tests/cuda/test_x.py::test_1" in summary
    assert "tests| 1 failed, 12 passed, 20 skipped" in summary and "SKIPPED" not in summary
    assert "build: ok" in summary and "pressure: ok" in summary and "bench: ok" in summary
    assert "| gpt2 | torchmem |" in summary
    assert "native histories kept in native_snapshots.tar.gz: gpt2_native_snapshot.pickle" in summary
    files = sorted(p.name for p in out.iterdir())
    assert files == ["bench_cuda.json", "bench_cuda.md", "logs.tar.gz", "native_snapshots.tar.gz", "summary.txt"]
    assert {"env.txt", "build.log", "import.log", "tests.log", "pressure.log", "bench.log", "gpt2_native.log",
            "summary_full.txt"} <= archived(out)
    assert not any(name.endswith(".pickle") for name in archived(out))


def test_output_stays_under_10000_characters_and_the_last_line_is_printed(tmp_path):
    proc, out, _ = run_script(tmp_path, FAKE_GPU="0", FAKE_BENCH_ROWS="80")
    assert len(proc.stdout) < 10_000, len(proc.stdout)
    assert "summary cut at 9000 characters" in proc.stdout
    assert proc.stdout.rstrip().splitlines()[-1].startswith("[gpu_check") and "stage(s) failed" in proc.stdout.splitlines()[-1]
    assert (out / "summary.txt").read_text() == proc.stdout
    assert all(len(line) <= 300 for line in proc.stdout.splitlines())
    assert "summary_full.txt" in archived(out)


def test_a_rerun_replaces_the_files_of_the_last(tmp_path):
    run_script(tmp_path, FAKE_GPU="0")
    (tmp_path / "out" / "native_snapshots.tar.gz").write_bytes(b"stale")
    proc, out, _ = run_script(tmp_path, FAKE_GPU="1", DRY_RUN="1")
    assert sorted(p.name for p in out.iterdir()) == ["logs.tar.gz", "summary.txt"]


def test_rehearsal_without_gpu_runs_every_stage(tmp_path):
    proc, out, calls = run_script(tmp_path, FAKE_GPU="1", REHEARSE="1")
    assert "rehearsing" in proc.stdout
    assert "setup.py build_ext" in calls and "-m pytest" in calls and "bench_cuda.py" in calls


def test_build_failure_skips_tests_and_benchmark(tmp_path):
    proc, out, calls = run_script(tmp_path, FAKE_GPU="0", FAKE_BUILD_RC="2")
    assert proc.returncode == 1
    assert "-m pytest" not in calls and "bench_cuda.py" not in calls
    assert "build failed: skipping" in (out / "summary.txt").read_text()
    assert "build.log" in archived(out)


def test_stages_past_the_time_budget_are_skipped_and_counted(tmp_path):
    proc, out, calls = run_script(tmp_path, FAKE_GPU="0", BUDGET_S="10")
    assert proc.returncode >= 1
    assert "setup.py" not in calls
    assert "build: SKIPPED" in (out / "summary.txt").read_text()


def test_without_pytest_the_small_runner_runs_the_tests(tmp_path):
    proc, out, calls = run_script(tmp_path, FAKE_GPU="0", FAKE_NO_PYTEST="1")
    assert "run_without_pytest.py --junitxml" in calls and "-m pytest" not in calls
    assert "no pytest here" in (out / "summary.txt").read_text()


def test_without_xdist_the_tests_run_in_one_process(tmp_path):
    proc, out, calls = run_script(tmp_path, FAKE_GPU="0", FAKE_NO_XDIST="1")
    assert "-m pytest" in calls and " -n " not in calls


def test_without_ninja_the_build_compiles_in_parallel_threads(tmp_path):
    proc, out, calls = run_script(tmp_path, FAKE_GPU="0", FAKE_NO_NINJA="1")
    assert "- build_ext --inplace" in calls and "setup.py build_ext" not in calls
    code = (tmp_path / "calls.log.stdin").read_text()
    assert "ThreadPoolExecutor" in code and 'runpy.run_path("setup.py"' in code
    compile(code, "build-wrapper", "exec")
    assert "no ninja here" in (out / "summary.txt").read_text()
    assert "-m pytest" in calls  # the build passed, so the tests ran
