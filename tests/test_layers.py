"""The layering rules of ARCHITECTURE.md: import-linter contracts, an acyclic folder graph,
and a worker that loads neither the planner nor SQL."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from importlinter.cli import lint_imports

ROOT = Path(__file__).resolve().parent.parent
#: The top-level packages of the design, bottom (the core) to top (the application).
PACKAGES = ("autoscaler", "provisioners", "executor", "state", "simulator", "app")


def test_the_import_contracts_of_pyproject_are_kept(monkeypatch):
    monkeypatch.chdir(ROOT)
    # lint_imports reads pyproject.toml from the working directory and returns 0 when kept.
    assert lint_imports(no_cache=True) == 0, "run `lint-imports` to see the broken contract"


def folder_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Which top-level package imports which, from every import statement of the code
    (lazy imports inside functions included)."""
    edges: dict[str, set[str]] = defaultdict(set)
    for package in PACKAGES:
        for path in (root / package).rglob("*.py"):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top in PACKAGES and top != package:
                        edges[package].add(top)
    return edges


def cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """A cycle of the graph as a path (first node repeated at the end), or None."""
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_cycle_finder_finds_a_cycle_and_only_a_cycle():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_the_folders_import_each_other_without_a_cycle():
    edges = folder_graph()
    assert cycle(edges) is None, f"import cycle between folders: {' -> '.join(cycle(edges))}"
    # The core is at the bottom and the application at the top.
    assert edges.get("autoscaler", set()) == set()
    assert not any("app" in targets for targets in edges.values())


def test_the_worker_entry_point_imports_no_planner_and_no_sql():
    # What `autoscaler-worker` loads before it parses its flags (`python -X importtime`).
    run = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import executor.cli, executor.agent"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=True,
    )
    loaded = {line.split("|")[-1].strip() for line in run.stderr.splitlines() if "|" in line}
    assert "executor.agent" in loaded  # the measurement saw the agent load
    heavy = {m for m in loaded if m.split(".")[0] in ("numpy", "highspy", "sqlalchemy", "scipy")}
    assert not heavy, f"the worker imports {sorted(heavy)[:5]}"
