"""No package imports itself in a cycle: not at module level, and not through imports inside
functions (a lazy import that closes a cycle fails at the first call that takes that path).

The graph spans grpo_envs, grpo_train and sandbox together, so a cycle through two packages is
found too. Imports under ``if TYPE_CHECKING:`` are left out (they never run). An import of a
package's submodule (``from grpo_envs import executor``) is an edge to that submodule; other names
imported from a package (``from grpo_envs import make``) are an edge to the package's
``__init__``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import grpo_envs
import grpo_train
import sandbox

PACKAGES = {
    pkg.__name__: Path(pkg.__file__ or "").resolve().parent
    for pkg in (grpo_envs, grpo_train, sandbox)
}


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, here: str, is_package: bool, modules: set[str]) -> set[str]:
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here if is_package else here.rpartition(".")[0]
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                source = f"{base}.{node.module}" if node.module else base
            else:
                source = node.module or ""
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                found.add(sub if sub in modules else source)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return {m for m in found if m in modules}


def import_graph() -> dict[str, set[str]]:
    """Module -> the project's modules it imports (at any level, TYPE_CHECKING excluded)."""
    files = {_module_name(p, root): p for root in PACKAGES.values() for p in root.rglob("*.py")}
    modules = set(files)
    return {
        name: _imports(ast.parse(path.read_text()), name, path.name == "__init__.py", modules)
        - {name}
        for name, path in files.items()
    }


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of the graph as a path (first == last), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def dfs(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (cycle := dfs(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := dfs(node)):
            return cycle
    return None


def test_finder_sees_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_graph_sees_lazy_relative_and_cross_package_imports():
    graph = import_graph()
    assert "grpo_envs.wrappers" in graph["grpo_envs.registration"]  # inside a function
    assert "grpo_train.rollout.base" in graph["grpo_train.rollout.hf"]
    assert "grpo_train.eval.runner" in graph["grpo_train.eval.cli"]
    assert "sandbox._spawn" in graph["sandbox._slot_state"]
    assert any(m.startswith("grpo_envs") for m in graph["grpo_train.trainer"])  # across packages


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_no_import_cycle(package):
    graph = import_graph()
    assert any(m.startswith(f"{package}.") for m in graph)
    cycle = find_cycle({m: deps for m, deps in graph.items() if m.split(".")[0] == package})
    assert cycle is None, " -> ".join(cycle or [])


def test_no_import_cycle_across_packages():
    cycle = find_cycle(import_graph())
    assert cycle is None, " -> ".join(cycle or [])
