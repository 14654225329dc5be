"""The package's layers: each row of torchmem's folders imports only from the rows below it.

The rows, top to bottom, are those docs/design.md draws. The command line drives everything; the face
(`import torchmem`) loads the runtime's names; preflight runs the tools; the tools (replay, viz, the fake
GPU) read what the runtime wrote; the runtime is what a training job loads; the planner, the file formats
and the base helpers sit below. Folders in one row import nothing of each other. An edge is any import, at
module level or inside a function, as tests/package/test_import_circles.py reads them; an import under
TYPE_CHECKING is not one. The compiled modules (torchmem._core, torchmem._C) are below every row.
"""
from __future__ import annotations

import ast
import os

from tests.package.test_import_circles import import_graph, package_modules

ROWS: tuple[tuple[str, ...], ...] = (
    ("torchmem.cli", "torchmem.__main__"),  # __main__ is `python -m torchmem`: the command line's entry
    ("torchmem",),  # the face, torchmem/__init__.py
    ("torchmem.preflight",),
    ("torchmem.replay", "torchmem.viz", "torchmem.fakegpu"),
    ("torchmem.runtime",),
    ("torchmem.plan",),
    ("torchmem.formats",),
    ("torchmem.sizes", "torchmem.pytorch_env", "torchmem._extension"),
)
COMPILED = ("torchmem._core", "torchmem._C")
SAME_FOLDER = {"torchmem.__main__": "torchmem.cli"}  # `python -m torchmem` is the command line's own entry


def group_of(module: str) -> tuple[int, str] | None:
    """The row of a module and the folder (or base module) it is in; None for the compiled modules."""
    if module in COMPILED:
        return None
    for row, prefixes in enumerate(ROWS):
        for prefix in prefixes:
            if prefix == "torchmem" and module == "torchmem":
                return row, prefix
            if prefix != "torchmem" and (module == prefix or module.startswith(prefix + ".")):
                return row, SAME_FOLDER.get(prefix, prefix)
    raise AssertionError(f"{module} is in no row of ROWS: give it a folder of a layer")


def upward_edges(graph: dict[str, dict[str, int]]) -> list[str]:
    """Each import of a module in the same row's other folder or in a row above, as 'a (line n) -> b'."""
    found = []
    for a, targets in sorted(graph.items()):
        for b, line in sorted(targets.items()):
            ga, gb = group_of(a), group_of(b)
            if ga is None or gb is None or ga[1] == gb[1]:
                continue
            if gb[0] <= ga[0]:
                found.append(f"{a} (line {line}) -> {b}")
    return found


def test_every_module_is_in_a_row():
    graph = import_graph()
    assert "torchmem.formats.traces" in graph and "torchmem.runtime.cuda" in graph
    for module in graph:
        group_of(module)


def test_every_import_runs_down_the_rows():
    found = upward_edges(import_graph())
    assert not found, "imports that run up the layers or across a row:\n  " + "\n  ".join(found)


def test_the_check_finds_an_import_up_or_across():
    graph = {"torchmem.formats.traces": {"torchmem.replay.snapshot_trace": 3, "torchmem._core": 4},
             "torchmem.replay.runner": {"torchmem.viz.html": 9, "torchmem.formats.traces": 2},
             "torchmem.runtime.memory": {"torchmem.runtime.devices": 5}}
    assert upward_edges(graph) == ["torchmem.formats.traces (line 3) -> torchmem.replay.snapshot_trace",
                                   "torchmem.replay.runner (line 9) -> torchmem.viz.html"]


def imports_in_functions(source: str) -> list[int]:
    """The lines of the imports of torchmem's own modules that sit inside a function body, outside TYPE_CHECKING."""
    found = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if in_function and isinstance(child, ast.ImportFrom):
                if child.level > 0 or (child.module or "").split(".")[0] == "torchmem":
                    found.append(child.lineno)
            elif in_function and isinstance(child, ast.Import):
                if any(a.name.split(".")[0] == "torchmem" for a in child.names):
                    found.append(child.lineno)
            visit(child, inside)

    visit(ast.parse(source), False)
    return found


def test_torchmem_imports_sit_at_module_level():
    # A function may import torch or matplotlib late (the command line runs without them); torchmem's own
    # modules are imported at the top, so each module's dependencies are read in one place.
    found = []
    for name, (path, _) in sorted(package_modules().items()):
        with open(path) as f:
            found += [f"{os.path.relpath(path)}:{line}" for line in imports_in_functions(f.read())]
    assert not found, "imports of torchmem inside functions:\n  " + "\n  ".join(found)


def test_the_check_finds_an_import_inside_a_function():
    source = ("import torchmem.sizes\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from torchmem.x import T\n"
              "def f():\n    import torch\n    from torchmem.formats import traces\n    from . import y\n")
    assert imports_in_functions(source) == [7, 8]
