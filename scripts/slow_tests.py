"""Writes tests/slow_tests.txt, the tests `make test-fast` leaves out, from measured durations.

    make test PYTEST_ARGS="--durations=0 --durations-min=0.3" 2>&1 | tee durations.log
    python scripts/slow_tests.py durations.log [more.log ...] [--over 1.0]

A test is slow when its setup, call and teardown together took more than
`--over` seconds. A file is slow as a whole when one of its setups did: a
fixture shared by the file's tests is set up by whichever of them runs first.
tests/conftest.py marks each listed test (or every test of a listed file)
with `slow`. The list is measured, not chosen: rerun this after adding tests.
"""
from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from pathlib import Path

LINE = re.compile(r"^\s*(\d+(?:\.\d+)?)s (setup|call|teardown)\s+(\S.*)$")
OUT = Path(__file__).resolve().parent.parent / "tests" / "slow_tests.txt"
HEADER = """\
# The tests `make test-fast` leaves out: each took more than {over} s (setup, call
# and teardown), or is in a file one of whose setups did. Measured with the
# command in scripts/slow_tests.py; regenerate it there, never edit by hand.
"""


def slow(logs: list[str], over: float) -> tuple[set[str], set[str]]:
    """(test ids, file paths) whose measured time passes `over` seconds."""
    total: dict[str, float] = defaultdict(float)
    files: set[str] = set()
    for log in logs:
        for line in Path(log).read_text(errors="replace").splitlines():
            m = LINE.match(line)
            if not m:
                continue
            seconds, phase, node = float(m.group(1)), m.group(2), m.group(3).strip()
            total[node] += seconds
            if phase == "setup" and seconds > over:
                files.add(node.split("::")[0])
    tests = {node for node, seconds in total.items() if seconds > over and node.split("::")[0] not in files}
    return tests, files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="slow_tests.py", description=__doc__.splitlines()[0])
    parser.add_argument("logs", nargs="+", help="pytest output with --durations=0")
    parser.add_argument("--over", type=float, default=1.0, help="seconds above which a test is slow (1.0)")
    args = parser.parse_args(argv)
    for log in args.logs:
        if not Path(log).is_file():
            print(f"slow_tests.py: error: {log}: no such file", file=sys.stderr)
            return 1
    tests, files = slow(args.logs, args.over)
    if not tests and not files:
        print("slow_tests.py: error: no durations found (run pytest with --durations=0)", file=sys.stderr)
        return 1
    OUT.write_text(HEADER.format(over=args.over) + "".join(f"{n}\n" for n in sorted(files | tests)))
    print(f"{OUT}: {len(files)} files and {len(tests)} tests over {args.over} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
