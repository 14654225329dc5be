"""The package's layers: the formats and the runtime import no tool, and only the command line imports it.

The formats (torchmem/formats/) read files: they import neither the runtime nor a tool.
The runtime is what a training job loads: `import torchmem`, the swap (install,
memory, snapshot, arena, paged, planned, oom) and what it stands on. The tools read what the
runtime wrote: replay and advise, viz, preflight, the fake GPU and the command
line. An edge is any import, at module level or inside a function, as
tests/package/test_import_circles.py reads them; an import under TYPE_CHECKING is not
one. The walk follows edges through the runtime's own helpers, so a tool
reached through one of them is found too.
"""
from __future__ import annotations

from test_import_circles import import_graph

RUNTIME = ("torchmem._install", "torchmem.memory", "torchmem.snapshot", "torchmem.arena", "torchmem.paged",
           "torchmem.planned", "torchmem.oom")
TOOLS = ("torchmem.replay", "torchmem.sim", "torchmem.viz", "torchmem.preflight", "torchmem.fakegpu",
         "torchmem.cli", "torchmem.__main__")
FORMATS = ("torchmem.formats",)  # the files read: above the core, below the tools and the runtime
CLI = ("torchmem.cli", "torchmem.__main__")  # __main__ is `python -m torchmem`: the command line's entry


def within(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def paths_to(graph: dict[str, dict[str, int]], start: str, forbidden: tuple[str, ...]) -> list[list[str]]:
    """Each way from `start` into a `forbidden` module, walking only through modules that are not."""
    found, seen, stack = [], {start}, [[start]]
    while stack:
        path = stack.pop()
        for target in sorted(graph[path[-1]]):
            if target in seen:
                continue
            seen.add(target)
            if within(target, forbidden):
                found.append(path + [target])
            else:
                stack.append(path + [target])
    return found


def describe(path: list[str], graph: dict[str, dict[str, int]]) -> str:
    return " -> ".join(f"{a} (line {graph[a][b]})" for a, b in zip(path, path[1:])) + f" -> {path[-1]}"


def test_the_runtime_imports_no_tool():
    graph = import_graph()
    runtime = ["torchmem"] + [m for m in graph if within(m, RUNTIME)]  # `import torchmem` too
    assert all(any(within(m, (name,)) for m in runtime) for name in RUNTIME)  # each name is a module here
    found = [p for m in runtime for p in paths_to(graph, m, TOOLS)]
    assert not found, "the runtime reaches a tool:\n  " + "\n  ".join(describe(p, graph) for p in found)


def test_the_formats_import_no_tool_and_no_runtime():
    graph = import_graph()
    formats = [m for m in graph if within(m, FORMATS)]
    assert "torchmem.formats.traces" in formats
    found = [p for m in formats for p in paths_to(graph, m, TOOLS + RUNTIME)]
    assert not found, "the formats reach a tool or the runtime:\n  " + "\n  ".join(describe(p, graph) for p in found)


def test_nothing_outside_the_command_line_imports_it():
    graph = import_graph()
    found = [[a, b] for a, targets in graph.items() if not within(a, CLI) for b in targets if within(b, CLI)]
    assert not found, "imports of the command line:\n  " + "\n  ".join(describe(p, graph) for p in found)


def test_the_walk_finds_a_tool_behind_a_helper():
    graph = {"torchmem.memory": {"torchmem.helper": 3}, "torchmem.helper": {"torchmem.replay.runner": 7},
             "torchmem.replay.runner": {}}
    assert paths_to(graph, "torchmem.memory", TOOLS) == [["torchmem.memory", "torchmem.helper", "torchmem.replay.runner"]]
    assert describe(paths_to(graph, "torchmem.memory", TOOLS)[0], graph) == (
        "torchmem.memory (line 3) -> torchmem.helper (line 7) -> torchmem.replay.runner")
