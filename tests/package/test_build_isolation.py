"""A build that cannot use the user's torch stops at once, in one line that says why and what to type.

torchmem links the torch it is built against, so it is built with `pip install --no-build-isolation`.
pyproject.toml lists no torch among its build requirements: under pip's default build isolation the build
sees none. Nothing here compiles: each build stops before the extension is configured.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WHAT_TO_TYPE = "pip install --no-build-isolation"

pytestmark = pytest.mark.slow


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "LD_PRELOAD", "VIRTUAL_ENV") and not k.startswith("TORCHMEM_")}
    env.update(extra)
    return env


def what_torchmem_said(proc: subprocess.CompletedProcess) -> str:
    """The one line setup.py wrote (pip indents it inside its own report)."""
    said = [line.strip() for line in (proc.stdout + proc.stderr).splitlines() if line.strip().startswith("torchmem:")]
    assert proc.returncode != 0 and len(said) == 1, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return said[0]


def pip_wheel(python: Path | str, out: Path) -> subprocess.CompletedProcess:
    """`pip wheel` of the checkout under pip's default build isolation (a wheel, so no environment changes)."""
    return subprocess.run([str(python), "-m", "pip", "wheel", "--no-deps", "-w", str(out), str(ROOT)],
                          capture_output=True, text=True, timeout=300, env=clean_env(), cwd=out)


def test_isolation_hides_the_installed_torch(tmp_path):
    import torch

    proc = pip_wheel(sys.executable, tmp_path)
    said = what_torchmem_said(proc)
    assert "build isolation hides your torch" in said and WHAT_TO_TYPE in said
    assert os.path.dirname(os.path.realpath(torch.__file__)) in said
    assert not list(tmp_path.glob("*.whl"))


def test_an_environment_without_torch_is_told_to_install_it_first(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=clean_env())
    said = what_torchmem_said(pip_wheel(venv / "bin" / "python", tmp_path))
    assert "no torch in this environment" in said and "install torch first" in said and WHAT_TO_TYPE in said


def test_a_torch_from_an_isolated_build_environment_is_refused(tmp_path):
    """A torch installed into pip's throw-away build environment (an older pyproject.toml asked for one) is
    another torch than the user's: the build refuses it instead of linking it."""
    import torch

    isolated = tmp_path / "pip-build-env-test" / "overlay" / "site-packages"
    isolated.mkdir(parents=True)
    (isolated / "torch").symlink_to(Path(torch.__file__).parent, target_is_directory=True)
    proc = subprocess.run([sys.executable, "setup.py", "--version"], capture_output=True, text=True, timeout=300,
                          cwd=ROOT, env=clean_env(PYTHONPATH=str(isolated)))
    said = what_torchmem_said(proc)
    assert "installed for the build alone" in said and str(isolated) in said and WHAT_TO_TYPE in said
