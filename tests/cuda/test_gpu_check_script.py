"""scripts/gpu_check.sh's shell logic, on any machine: a dry run without a GPU
stops cleanly, and with a stand-in interpreter the stages run in order, time
limits apply, failures are counted and reported, and results land in $OUT."""
import os
import pathlib
import shutil
import subprocess
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
      *"-m pytest"*|*"run_without_pytest.py"*) echo "1 failed, 12 passed in 3.0s"; exit 1 ;;
      *"bench_cuda.py"*) out=$(echo "$args" | sed 's/.*--out \\([^ ]*\\).*/\\1/'); mkdir -p "$out";
                         echo "| gpt2 | torchmem | 1.0 |" > "$out/bench_cuda.md"; : > "$out/gpt2_native_snapshot.pickle"; exit 0 ;;
      *) exit 0 ;;
    esac
    """
)


def run_script(tmp_path, **env):
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    out = tmp_path / "out"
    full_env = dict(os.environ, PYTHON=str(fake), OUT=str(out), FAKE_LOG=str(tmp_path / "calls.log"), **env)
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
    assert (out / "env.txt").exists()


def test_without_gpu_and_not_dry_run_exits_3(tmp_path):
    proc, _, calls = run_script(tmp_path, FAKE_GPU="1")
    assert proc.returncode == 3
    assert "setup.py" not in calls


def test_stages_run_in_order_and_failures_are_counted(tmp_path):
    proc, out, calls = run_script(tmp_path, FAKE_GPU="0")
    assert proc.returncode == 1, proc.stdout + proc.stderr  # the test stage failed, the rest passed
    order = [c for c in ("setup.py build_ext --inplace", "cuda_glue_built", "-m pytest", "bench_cuda.py") if c in calls]
    assert order == ["setup.py build_ext --inplace", "cuda_glue_built", "-m pytest", "bench_cuda.py"]
    assert calls.index("setup.py") < calls.index("-m pytest") < calls.index("bench_cuda.py")
    summary = (out / "summary.txt").read_text()
    assert "tests: FAILED (exit 1)" in summary
    assert "build: ok" in summary and "bench: ok" in summary
    assert "| gpt2 | torchmem |" in summary
    assert "native history kept: " in summary
    assert (out / "tests.log").exists() and (out / "build.log").exists()


def test_build_failure_skips_tests_and_benchmark(tmp_path):
    proc, out, calls = run_script(tmp_path, FAKE_GPU="0", FAKE_BUILD_RC="2")
    assert proc.returncode == 1
    assert "-m pytest" not in calls and "bench_cuda.py" not in calls
    assert "build failed: skipping" in (out / "summary.txt").read_text()


def test_stages_past_the_time_budget_are_skipped_and_counted(tmp_path):
    proc, out, calls = run_script(tmp_path, FAKE_GPU="0", BUDGET_S="10")
    assert proc.returncode >= 1
    assert "setup.py" not in calls
    assert "build: SKIPPED" in (out / "summary.txt").read_text()


def test_without_pytest_the_small_runner_runs_the_tests(tmp_path):
    proc, out, calls = run_script(tmp_path, FAKE_GPU="0", FAKE_NO_PYTEST="1")
    assert "run_without_pytest.py --junitxml" in calls and "-m pytest" not in calls
    assert "no pytest here" in (out / "summary.txt").read_text()


def test_without_ninja_the_build_compiles_in_parallel_threads(tmp_path):
    proc, out, calls = run_script(tmp_path, FAKE_GPU="0", FAKE_NO_NINJA="1")
    assert "- build_ext --inplace" in calls and "setup.py build_ext" not in calls
    code = (tmp_path / "calls.log.stdin").read_text()
    assert "ThreadPoolExecutor" in code and 'runpy.run_path("setup.py"' in code
    compile(code, "build-wrapper", "exec")
    assert "no ninja here" in (out / "summary.txt").read_text()
    assert "-m pytest" in calls  # the build passed, so the tests ran
