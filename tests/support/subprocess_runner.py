"""The one way the tests run something in a fresh interpreter.

Tests that swap PyTorch's allocator, fork, abort or need a clean environment
run their code in a child. Every test imports it as ``tests.support.subprocess_runner``;
tests/cuda/run_without_pytest.py runs the CUDA tests without pytest through the same import.

- ``run_python(code)``: ``python -c code`` (dedented, after ``prelude``);
- ``run_args(args)``: ``python *args`` (a module with ``-m``, a script);
- ``run_torchmem(*argv)``: ``python -m torchmem *argv``, the command line;
- ``torchmem_here(*argv)``: the command line's ``main`` in this process, for
  tests of what a command prints (a fresh interpreter costs seconds of
  ``import torch``); tests of exit paths and environments use run_torchmem;
- ``ok(proc)``: asserts exit status 0, naming it, with the ends of stdout
  and stderr; ``last_json(proc)``: ok() and the JSON on the last line;
- ``run_ok`` and ``run_python_json``: run_python, then ok() or last_json().

Each child runs from the repository root with it first on PYTHONPATH, in
this process's environment (or ``base_env``) updated with ``env``, less the
keys in ``drop_env``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from typing import Any, Iterable, Mapping, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/support/ -> the checkout


def child_env(env: Mapping[str, str] | None = None, base_env: Mapping[str, str] | None = None,
              drop_env: Iterable[str] = ()) -> dict[str, str]:
    """The environment of a child: `base_env` (default os.environ) with `env` over it, less `drop_env`,
    the repository root first on PYTHONPATH."""
    full = dict(os.environ if base_env is None else base_env, **(env or {}))
    for key in drop_env:
        full.pop(key, None)
    full["PYTHONPATH"] = ROOT + os.pathsep + full.get("PYTHONPATH", "")
    return full


def run_args(args: Sequence[str], env: Mapping[str, str] | None = None, timeout: float = 300, *,
             cwd: str | os.PathLike = ROOT, base_env: Mapping[str, str] | None = None,
             drop_env: Iterable[str] = (), python: str = sys.executable) -> subprocess.CompletedProcess:
    """Run `python *args`; the output is captured as text."""
    return subprocess.run([python, *args], capture_output=True, text=True,
                          env=child_env(env, base_env, drop_env), timeout=timeout, cwd=cwd)


def run_python(code: str, env: Mapping[str, str] | None = None, timeout: float = 300, *, prelude: str = "",
               **kwargs: Any) -> subprocess.CompletedProcess:
    """Run `prelude` + dedented `code` with ``python -c`` (keywords as run_args)."""
    return run_args(["-c", prelude + textwrap.dedent(code)], env, timeout, **kwargs)


def run_torchmem(*argv: str, env: Mapping[str, str] | None = None, timeout: float = 300,
                 **kwargs: Any) -> subprocess.CompletedProcess:
    """Run the command line, ``python -m torchmem *argv`` (keywords as run_args)."""
    return run_args(["-m", "torchmem", *argv], env, timeout, **kwargs)


def torchmem_here(*argv: Any, cwd: str | os.PathLike | None = None) -> subprocess.CompletedProcess:
    """The command line's main(argv) run in this process, stdout and stderr captured, from `cwd` if given;
    its exit status as a child's would be (SystemExit's code, 0 for None). An exception it raises propagates."""
    import contextlib
    import io

    from torchmem.cli import main

    args = [str(a) for a in argv]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.ExitStack() as stack:
        if cwd is not None:
            stack.enter_context(contextlib.chdir(cwd))
        stack.enter_context(contextlib.redirect_stdout(out))
        stack.enter_context(contextlib.redirect_stderr(err))
        try:
            code = main(args)
        except SystemExit as exc:
            code = exc.code
    if code is None:
        code = 0
    elif not isinstance(code, int):  # sys.exit("message"): printed to stderr, status 1
        err.write(f"{code}\n")
        code = 1
    return subprocess.CompletedProcess(["torchmem", *args], code, out.getvalue(), err.getvalue())


def ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    """`proc`, which must have exited with status 0."""
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc


def last_json(proc: subprocess.CompletedProcess) -> Any:
    """The JSON value on the last line of a child that exited with status 0."""
    return json.loads(ok(proc).stdout.strip().splitlines()[-1])


def run_ok(code: str, env: Mapping[str, str] | None = None, timeout: float = 300, **kwargs: Any) -> str:
    """run_python, which must succeed; its stdout."""
    return ok(run_python(code, env, timeout, **kwargs)).stdout


def run_python_json(code: str, env: Mapping[str, str] | None = None, timeout: float = 300, **kwargs: Any) -> Any:
    """run_python, which must succeed and print JSON on its last line; that value."""
    return last_json(run_python(code, env, timeout, **kwargs))
