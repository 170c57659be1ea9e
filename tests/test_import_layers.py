"""The import layers of docs/architecture.md, read from the source (every import, at any depth of a file).

The compiler and the engine each form a graph without circles; inside the engine, the batch type
sits below everyone, the rollout backends never reach into the FSDP workers, and the worker folders
import downwards only (roles -> passes -> sequence -> fsdp -> cluster).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# engine/workers/<folder>: a module may import its own folder and the ones after it, never one before.
WORKER_LAYERS = ("roles", "passes", "sequence", "fsdp", "cluster")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, known: set[str]) -> set[str]:
    """The project modules `path` imports: `from pkg import sub` counts as sub when sub is a module."""
    here = module_name(path)
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = here.split(".")[: len(here.split(".")) - node.level + (path.name == "__init__.py")]
                base = ".".join([*package, base] if base else package)
            submodules = [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in known]
            targets = submodules if len(submodules) == len(node.names) else [base, *submodules]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != here:
                found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    files = [path for top in ("rlconf", "engine") for path in (ROOT / top).rglob("*.py")]
    known = {module_name(path) for path in files}
    return {module_name(path): imported_modules(path, known) for path in files}


GRAPH = import_graph()


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_the_circle_finder_finds_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle_in_the_compiler_or_the_engine():
    assert circles(GRAPH) == []


def test_the_batch_type_imports_nothing_of_the_engine():
    assert {m for m in GRAPH["engine.batch"] if m.startswith("engine")} == set()


@pytest.mark.parametrize("below", ["engine.rollout", "engine.algos", "engine.models", "engine.data", "engine.rewards"])
def test_packages_below_the_workers_never_import_them(below):
    offenders = {(module, target) for module, targets in GRAPH.items() if module.startswith(below)
                 for target in targets if target.startswith("engine.workers")}
    assert offenders == set()


def worker_layer(module: str) -> int | None:
    parts = module.split(".")
    if parts[:2] != ["engine", "workers"] or len(parts) < 3:
        return None
    return WORKER_LAYERS.index(parts[2])


def test_worker_folders_import_downwards_only():
    upward = sorted((module, target) for module, targets in GRAPH.items() if worker_layer(module) is not None
                    for target in targets
                    if worker_layer(target) is not None and worker_layer(target) < worker_layer(module))
    assert upward == []


def test_every_worker_module_lives_in_a_named_folder():
    loose = [path.name for path in (ROOT / "engine" / "workers").glob("*.py") if path.name != "__init__.py"]
    assert loose == []
    assert {path.name for path in (ROOT / "engine" / "workers").iterdir() if path.is_dir()
            and path.name != "__pycache__"} == set(WORKER_LAYERS)
