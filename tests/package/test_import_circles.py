"""No import circle in the torchmem package.

The package's imports are read with the standard library's ``ast`` (nothing
is imported to find them) and every circle among its modules is a failure
that names the modules, one import each.

What counts as an edge from module A to module B:

- every ``import`` and ``from ... import`` statement in A, at module level
  or inside a function (a lazy import). A lazy import that dodges a circle
  at load time is still a circle of design: A calls B and B calls A, so
  neither can be read, tested or moved alone.
- but not an import under ``if TYPE_CHECKING:`` of public names: it names,
  for annotations, the type of an object a caller hands A, and runs no code
  of B. A module that works on an object it is given (a callback, a public
  type) is how a lower module serves a higher one without depending on it.
  A type-only import of a private name (``_Builder``) counts: A then works
  on B's insides, and the two cannot be read apart.
- ``from torchmem.x import y`` is an edge to ``torchmem.x.y`` when that is a
  module of the package, else to ``torchmem.x`` (the module, or the
  package's ``__init__``, that defines ``y``). Relative imports are resolved
  the same way.
- the ``__init__`` of a package that Python runs before any of its
  submodules is not an edge of its own: ``from torchmem.replay.runner import
  replay`` depends on ``runner``, not on everything ``torchmem.replay``
  re-exports. Importing a name that ``__init__`` re-exports is an edge to
  ``__init__``, so the package's entry point cannot be imported back by the
  modules it gathers.
- ``torchmem._C`` and ``torchmem._core``, the compiled extensions, import nothing of the package.
"""
from __future__ import annotations

import ast
import os

from tests.support.subprocess_runner import ROOT

PACKAGE = "torchmem"
LEAVES = {"torchmem._C", "torchmem._core"}  # compiled: no Python imports of the package


def package_modules(root: str = os.path.join(ROOT, PACKAGE)) -> dict[str, tuple[str, bool]]:
    """Module name -> (path, whether it is a package's __init__), for every .py file of the package."""
    modules = {}
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            parts = os.path.relpath(os.path.join(folder, name), os.path.dirname(root))[:-3].split(os.sep)
            is_init = parts[-1] == "__init__"
            modules[".".join(parts[:-1] if is_init else parts)] = (os.path.join(folder, name), is_init)
    return modules


def imports_of(name: str, path: str, is_init: bool, modules: dict) -> dict[str, int]:
    """The package's modules that module `name` imports -> the line of the first such import."""
    package = name if is_init else name.rpartition(".")[0]
    known = set(modules) | LEAVES
    found: dict[str, int] = {}
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    type_only = {id(node) for block in ast.walk(tree) if isinstance(block, ast.If) and _is_type_checking(block.test)
                 for statement in block.body for node in ast.walk(statement)}
    for node in ast.walk(tree):
        if id(node) in type_only and not (isinstance(node, ast.ImportFrom)
                                          and any(alias.name.startswith("_") for alias in node.names)):
            continue
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(parts + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                targets.append(sub if sub in known else base)
        for target in targets:
            if target in modules and target != name:
                found.setdefault(target, node.lineno)
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def import_graph() -> dict[str, dict[str, int]]:
    modules = package_modules()
    return {name: imports_of(name, path, is_init, modules) for name, (path, is_init) in modules.items()}


def circles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One circle (a list of modules, the first repeated at the end) per strongly connected component."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm; the package is small enough to recurse
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    found = []
    for component in components:  # a shortest way back to the component's first module
        start = min(component)
        paths = {start: [start]}
        frontier = [start]
        while frontier and start not in [w for v in frontier for w in graph[v]]:
            nxt = []
            for v in frontier:
                for w in sorted(graph[v]):
                    if w in component and w not in paths:
                        paths[w] = paths[v] + [w]
                        nxt.append(w)
            frontier = nxt
        last = next(v for v in frontier if start in graph[v])
        found.append(paths[last] + [start])
    return found


def describe(circle: list[str], graph: dict[str, dict[str, int]]) -> str:
    return " -> ".join(f"{a} (line {graph[a][b]})" for a, b in zip(circle, circle[1:])) + f" -> {circle[-1]}"


def test_the_package_has_no_import_circle():
    graph = import_graph()
    found = circles(graph)
    assert not found, "import circles in torchmem/:\n  " + "\n  ".join(describe(c, graph) for c in found)


def test_the_walk_sees_every_kind_of_import(tmp_path):
    """The reader finds module-level, lazy and relative imports, leaves out type-only ones of public names,
    and finds a circle."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from pkg.a import f\n")
    (pkg / "a.py").write_text("def f():\n    from pkg.sub import b\n    return b\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import a\n"
                                      "    from pkg.d import _Inside\nfrom ..c import C\n")
    (pkg / "d.py").write_text("")
    (pkg / "c.py").write_text("import pkg.a\nfrom pkg import f\n")
    modules = package_modules(str(pkg))
    graph = {name: imports_of(name, path, is_init, modules) for name, (path, is_init) in modules.items()}
    assert graph == {"pkg": {"pkg.a": 1}, "pkg.a": {"pkg.sub.b": 2}, "pkg.sub": {},
                     "pkg.sub.b": {"pkg.d": 4, "pkg.c": 5}, "pkg.c": {"pkg.a": 1, "pkg": 2}, "pkg.d": {}}
    assert circles(graph) == [["pkg", "pkg.a", "pkg.sub.b", "pkg.c", "pkg"]]


def private_imports(root: str = os.path.join(ROOT, PACKAGE)) -> list[str]:
    """Each `from torchmem.X import _name` of a private name that is not a module: 'file:line: X._name'."""
    modules = package_modules(root)
    known = set(modules) | LEAVES
    found = []
    for name, (path, is_init) in modules.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom) or node.level or not (node.module or "").startswith(PACKAGE):
                continue
            for alias in node.names:
                private = alias.name.startswith("_") and not alias.name.endswith("__")  # __all__ is public
                if private and f"{node.module}.{alias.name}" not in known:
                    found.append(f"{os.path.relpath(path, ROOT)}:{node.lineno}: {node.module}.{alias.name}")
    return found


def test_no_module_reads_another_modules_private_names():
    """A private name is its module's own: a module that imports one works on another's insides."""
    found = private_imports()
    assert not found, "private names imported across modules:\n  " + "\n  ".join(found)


def test_a_private_import_is_found(tmp_path):
    pkg = tmp_path / PACKAGE
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("_inside = 1\n")
    (pkg / "b.py").write_text("def f():\n    from torchmem.a import _inside\n    from torchmem import _C\n")
    assert private_imports(str(pkg)) == [f"{os.path.relpath(str(pkg / 'b.py'), ROOT)}:2: torchmem.a._inside"]
