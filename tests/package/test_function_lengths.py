"""No function in torchmem/ runs over 60 lines: a long function hides its steps (docs/design.md)."""
from __future__ import annotations

import ast
import os

from tests.package.test_import_circles import package_modules

LIMIT = 60


def long_functions(source: str, limit: int = LIMIT) -> list[tuple[str, int, int]]:
    """(name, line, length) of each function or method over `limit` lines, decorators left out."""
    return [(node.name, node.lineno, node.end_lineno - node.lineno + 1) for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > limit]


def test_no_function_in_torchmem_runs_over_60_lines():
    found = []
    for _, (path, _) in sorted(package_modules().items()):
        with open(path) as f:
            found += [f"{os.path.relpath(path)}:{line} {name} ({n} lines)" for name, line, n in long_functions(f.read())]
    assert not found, "functions over 60 lines:\n  " + "\n  ".join(found)


def test_the_check_counts_a_function_from_its_def_to_its_last_line():
    fits = "@decorated\ndef fits():\n" + "".join(f"    x{i} = {i}\n" for i in range(LIMIT - 1))
    over = "class C:\n    def over(self):\n" + "".join(f"        x{i} = {i}\n" for i in range(LIMIT))
    assert long_functions(fits) == []
    assert long_functions(over) == [("over", 2, LIMIT + 1)]
