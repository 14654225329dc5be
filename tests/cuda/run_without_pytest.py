"""Run tests/cuda where pytest is not installed (a GPU machine with no network).

Supports what the GPU tests use: pytest.mark.skipif (on functions and as a
module's `pytestmark`), pytest.skip, pytest.raises(match=), pytest.approx and
the tmp_path fixture. Tests that take other fixtures or parameters
(pytest.fixture, pytest.mark.parametrize: the CPU-side checks) are skipped as
needing pytest. Prints one line per test and a closing
"N passed, N failed, N skipped" line; exits 1 when a test failed.

    python tests/cuda/run_without_pytest.py [--junitxml PATH]
"""
from __future__ import annotations

import importlib
import inspect
import math
import os
import re
import sys
import tempfile
import time
import traceback
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent


class Skipped(Exception):
    pass


class _SkipIf:
    def __init__(self, condition, reason=""):
        self.condition, self.reason = bool(condition), reason

    def __call__(self, fn):
        fn.__dict__.setdefault("_skipif", []).append(self)
        return fn


class _Raises:
    def __init__(self, expected, match=None):
        self.expected, self.match = expected, match

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            raise AssertionError(f"DID NOT RAISE {self.expected}")
        if not issubclass(exc_type, self.expected):
            return False
        if self.match and not re.search(self.match, str(exc)):
            raise AssertionError(f"{str(exc)!r} does not match {self.match!r}")
        return True


class _Approx:
    def __init__(self, expected, rel=1e-6, abs=1e-12):
        self.expected, self.rel, self.abs = expected, rel, abs

    def __eq__(self, other):
        return math.isclose(other, self.expected, rel_tol=self.rel, abs_tol=self.abs)

    def __repr__(self):
        return f"approx({self.expected!r}, rel={self.rel})"


def _skip(reason=""):
    raise Skipped(reason)


def _passthrough(*args, **kwargs):
    if len(args) == 1 and callable(args[0]) and not kwargs:
        return args[0]
    return lambda fn: fn


def install_shim() -> None:
    shim = types.ModuleType("pytest")
    shim.mark = types.SimpleNamespace(skipif=_SkipIf, parametrize=_passthrough)
    shim.fixture = _passthrough
    shim.skip = _skip
    shim.raises = _Raises
    shim.approx = _Approx
    sys.modules["pytest"] = shim


def run() -> tuple[int, int, int, list]:
    passed = failed = skipped = 0
    cases = []
    sys.path[:0] = [str(HERE.parents[1])]  # the checkout: torchmem in place, and the tests as tests.cuda.NAME
    for path in sorted(HERE.glob("test_*.py")):
        module = importlib.import_module(f"tests.cuda.{path.stem}")
        module_marks = getattr(module, "pytestmark", [])
        module_marks = module_marks if isinstance(module_marks, list) else [module_marks]
        for name, fn in inspect.getmembers(module, inspect.isfunction):
            if not name.startswith("test_") or fn.__module__ != module.__name__:
                continue
            label = f"{path.name}::{name}"
            marks = module_marks + fn.__dict__.get("_skipif", [])
            reason = next((m.reason for m in marks if m.condition), None)
            needs = [p for p in inspect.signature(fn).parameters if p != "tmp_path"]
            if reason is None and needs:
                reason = f"needs pytest (takes {', '.join(needs)})"
            start = time.perf_counter()
            outcome, detail = "passed", ""
            if reason is not None:
                outcome, detail = "skipped", reason
            else:
                try:
                    with tempfile.TemporaryDirectory() as tmp:
                        kwargs = {"tmp_path": Path(tmp)} if "tmp_path" in inspect.signature(fn).parameters else {}
                        fn(**kwargs)
                except Skipped as e:
                    outcome, detail = "skipped", str(e)
                except Exception:
                    outcome, detail = "failed", traceback.format_exc()
            seconds = time.perf_counter() - start
            passed += outcome == "passed"
            failed += outcome == "failed"
            skipped += outcome == "skipped"
            print(f"{outcome.upper():8s} {label} ({seconds:.1f}s){': ' + detail.strip().splitlines()[-1] if detail else ''}")
            if outcome == "failed":
                print(detail)
            cases.append((label, outcome, detail, seconds))
    return passed, failed, skipped, cases


def write_junit(path: str, cases: list) -> None:
    from xml.sax.saxutils import escape

    lines = [f'<testsuite name="tests/cuda" tests="{len(cases)}">']
    for label, outcome, detail, seconds in cases:
        lines.append(f'  <testcase name="{escape(label)}" time="{seconds:.3f}">')
        if outcome == "failed":
            lines.append(f'    <failure>{escape(detail)}</failure>')
        elif outcome == "skipped":
            lines.append(f'    <skipped message="{escape(detail)}"/>')
        lines.append("  </testcase>")
    lines.append("</testsuite>")
    Path(path).write_text("\n".join(lines) + "\n")


def main() -> int:
    install_shim()
    os.chdir(HERE.parents[1])
    passed, failed, skipped, cases = run()
    if "--junitxml" in sys.argv:
        write_junit(sys.argv[sys.argv.index("--junitxml") + 1], cases)
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
