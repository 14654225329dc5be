"""The fake GPU's runtime sources (fakegpu/cudart/): which file calls which, and no circle among them.

A file calls another when it calls a function the other defines. state.c is the base every file reads (it
calls only errors.c, a leaf); the control API (control.c) sits above the rest, and nothing calls into it.
"""
from __future__ import annotations

import os
import re

from tests.support.subprocess_runner import ROOT

CUDART = os.path.join(ROOT, "fakegpu", "cudart")
DEFINITION = re.compile(r"^(?!static\b)[A-Za-z_][\w \*]*?\b([A-Za-z_]\w*)\s*\([^;]*?\)\s*\{", re.M)
CALL = re.compile(r"\b([A-Za-z_]\w*)\s*\(")


def calls_between(sources: dict[str, str]) -> dict[str, set[str]]:
    """{file: the other files whose (non-static) functions it calls}."""
    home = {name: f for f, text in sources.items() for name in DEFINITION.findall(text)}
    return {f: {home[c] for c in CALL.findall(text) if c in home and home[c] != f} for f, text in sources.items()}


def circle(graph: dict[str, set[str]]) -> list[str]:
    """One circle of the graph, as the files along it, or []."""
    state: dict[str, int] = {}

    def visit(f: str, path: list[str]) -> list[str]:
        state[f] = 1
        for g in sorted(graph.get(f, ())):
            if state.get(g) == 1:
                return path[path.index(g):] + [g]
            if g not in state:
                found = visit(g, path + [g])
                if found:
                    return found
        state[f] = 2
        return []

    for f in sorted(graph):
        if f not in state:
            found = visit(f, [f])
            if found:
                return found
    return []


def runtime_sources() -> dict[str, str]:
    return {f: open(os.path.join(CUDART, f)).read() for f in sorted(os.listdir(CUDART)) if f.endswith(".c")}


def test_the_runtime_files_call_each_other_without_a_circle():
    graph = calls_between(runtime_sources())
    assert not circle(graph), " -> ".join(circle(graph))


def test_state_calls_only_the_error_names_and_no_file_calls_the_control_api():
    graph = calls_between(runtime_sources())
    assert graph["state.c"] == {"errors.c"} and graph["errors.c"] == set()
    assert not [f for f, targets in graph.items() if "control.c" in targets]


def test_the_check_finds_a_circle():
    sources = {"a.c": "int fa(void) { return fb(); }\n", "b.c": "int fb(void) { return fa(); }\n",
               "c.c": "static int own(void) { return 0; }\nint fc(void) { return own() + fa(); }\n"}
    graph = calls_between(sources)
    assert graph == {"a.c": {"b.c"}, "b.c": {"a.c"}, "c.c": {"a.c"}}
    assert circle(graph) == ["a.c", "b.c", "a.c"]
