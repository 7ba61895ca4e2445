"""The api package's modules import each other without cycles, deferred (in-function) imports included:
a cycle hidden behind a function-level import still ties the modules together."""

from __future__ import annotations

import ast
from pathlib import Path

API = Path(__file__).resolve().parents[2] / "api"


def module_name(path: Path) -> str:
    parts = path.relative_to(API.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    modules = {module_name(path): path for path in API.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                targets.add(node.module)
                targets.update(f"{node.module}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
        graph[name] = {target for target in targets if target in modules and target != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a path of module names, or None."""
    state: dict[str, str] = {}  # "open" while on the current path, "done" after

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = "open"
        for target in sorted(graph[node]):
            if state.get(target) == "open":
                return [*path[path.index(target) :], target]  # open nodes are the current path
            if target not in state and (cycle := visit(target, [*path, target])):
                return cycle
        state[node] = "done"
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start, [start])):
            return cycle
    return None


def test_the_api_package_has_no_import_cycle() -> None:
    graph = import_graph()
    assert "api.weights.hub" in graph
    assert "api.engine.batched" in graph
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def test_a_cycle_is_found() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def engine_imports_under(package: str, graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Each module of `package` that imports api.engine (or one of its modules), deferred imports included."""
    found = {
        name: {target for target in targets if target == "api.engine" or target.startswith("api.engine.")}
        for name, targets in graph.items()
        if name == package or name.startswith(f"{package}.")
    }
    return {name: targets for name, targets in found.items() if targets}


def test_the_weights_import_nothing_from_the_engine() -> None:
    """The engine loads weights; the weights (sources, converter, layout) sit below it."""
    graph = import_graph()
    assert "api.weights.convert" in graph
    assert engine_imports_under("api.weights", graph) == {}


def test_an_import_of_the_engine_is_found() -> None:
    graph = {"api.weights.x": {"api.engine.stages", "api.weights.layout"}, "api.engine.y": {"api.weights"}}
    assert engine_imports_under("api.weights", graph) == {"api.weights.x": {"api.engine.stages"}}
