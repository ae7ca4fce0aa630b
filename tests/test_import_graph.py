"""No package imports itself in a cycle: not at module level, and not through imports inside
functions (a lazy import that closes a cycle fails at the first call that takes that path).

The graph spans grpo_envs, grpo_train and sandbox together, so a cycle through two packages is
found too. ``import_graph()`` leaves out imports under ``if TYPE_CHECKING:`` (they never run);
``import_graph(type_checking=True)`` counts them and has no cycle either: a type-only cycle is
still two modules that cannot be read, or moved, one without the other. An import of a package's
submodule (``from grpo_envs import executor``) is an edge to that submodule; other names imported
from a package (``from grpo_envs import make``) are an edge to the package's ``__init__``.

The packages are layered ``sandbox`` <- ``grpo_envs`` <- ``grpo_train``: no module imports a
package above its own in any form (at module level, inside a function, for types only, or by its
name through ``importlib.import_module``/``__import__``). No module is over ``MAX_MODULE_LINES``.
"""

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
#: The packages above each one, which it must never import.
ABOVE = {"sandbox": ("grpo_envs", "grpo_train"), "grpo_envs": ("grpo_train",), "grpo_train": ()}
#: A module longer than this holds more than one concern: it is split by stage, not by length.
MAX_MODULE_LINES = 1_000
#: The calls that import a module named by a string.
_STRING_IMPORTERS = ("import_module", "__import__")


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _module_files() -> dict[str, Path]:
    return {_module_name(p, root): p for root in PACKAGES.values() for p in root.rglob("*.py")}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(
    tree: ast.AST, here: str, is_package: bool, modules: set[str], *, type_checking: bool = False
) -> set[str]:
    """The project's modules that the module imports (``type_checking``: TYPE_CHECKING too)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node) and not type_checking:
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


def import_graph(*, type_checking: bool = False) -> dict[str, set[str]]:
    """Module -> the project's modules it imports, at any level.

    ``type_checking``: count the imports under ``if TYPE_CHECKING:`` too (left out by default).
    """
    files = _module_files()
    modules = set(files)
    return {
        name: _imports(
            ast.parse(path.read_text()),
            name,
            path.name == "__init__.py",
            modules,
            type_checking=type_checking,
        )
        - {name}
        for name, path in files.items()
    }


def imported_names(tree: ast.AST, here: str, is_package: bool) -> set[str]:
    """Every module name the code may import, at any level and under TYPE_CHECKING too.

    The sources of ``import``/``from`` statements (relative ones resolved) with each name a
    ``from`` takes from them (``from grpo_train import config`` names ``grpo_train.config``),
    and string constants passed to ``importlib.import_module`` or ``__import__``
    (``"grpo_train.config"`` is an import of ``grpo_train.config``, however it is spelled).
    """
    found: set[str] = set()
    for node in ast.walk(tree):
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
            found.add(source)
            found.update(f"{source}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Call):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if called in _STRING_IMPORTERS:
                found.update(
                    arg.value
                    for arg in (*node.args, *(k.value for k in node.keywords))
                    if isinstance(arg, ast.Constant) and isinstance(arg.value, str)
                )
    return found


def upward_imports() -> list[str]:
    """``module -> imported name`` for each import of a package above the module's own."""
    found = []
    for name, path in sorted(_module_files().items()):
        above = ABOVE[name.split(".")[0]]
        tree = ast.parse(path.read_text())
        for imported in sorted(imported_names(tree, name, path.name == "__init__.py")):
            if imported.split(".")[0] in above:
                found.append(f"{name} -> {imported}")
    return found


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
    assert "grpo_train.eval.runner" in graph["grpo_train.eval_cli"]
    assert "sandbox._spawn" in graph["sandbox._slot_state"]
    assert any(m.startswith("grpo_envs") for m in graph["grpo_train.trainer"])  # across packages


def test_the_type_checking_graph_adds_type_only_imports():
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from grpo_envs import base\n"
    modules = {"grpo_envs", "grpo_envs.base", "grpo_envs.x"}
    tree = ast.parse(source)
    assert _imports(tree, "grpo_envs.x", False, modules) == set()
    assert _imports(tree, "grpo_envs.x", False, modules, type_checking=True) == {"grpo_envs.base"}
    # The real graph: the package's __init__ names its lazy exports for the type checker only.
    runtime, typed = import_graph(), import_graph(type_checking=True)
    assert "grpo_envs.checker" not in runtime["grpo_envs"]
    assert "grpo_envs.checker" in typed["grpo_envs"]
    assert all(runtime[m] <= typed[m] for m in runtime)


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_no_import_cycle(package):
    graph = import_graph()
    assert any(m.startswith(f"{package}.") for m in graph)
    cycle = find_cycle({m: deps for m, deps in graph.items() if m.split(".")[0] == package})
    assert cycle is None, " -> ".join(cycle or [])


def test_no_import_cycle_across_packages():
    cycle = find_cycle(import_graph())
    assert cycle is None, " -> ".join(cycle or [])


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_no_import_cycle_counting_type_only_imports(package):
    graph = import_graph(type_checking=True)
    cycle = find_cycle({m: deps for m, deps in graph.items() if m.split(".")[0] == package})
    assert cycle is None, "cycle (TYPE_CHECKING imports counted): " + " -> ".join(cycle or [])


def test_no_import_cycle_across_packages_counting_type_only_imports():
    cycle = find_cycle(import_graph(type_checking=True))
    assert cycle is None, "cycle (TYPE_CHECKING imports counted): " + " -> ".join(cycle or [])


def test_the_layering_check_sees_every_form_of_import():
    source = (
        "import importlib\nfrom typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from grpo_train.config import TrainConfig\n"
        "def f():\n    from ..collect import batch\n"
        "    return importlib.import_module('grpo_train.trainer'), __import__(name='grpo_train')\n"
    )
    names = imported_names(ast.parse(source), "grpo_train.eval.x", False)
    assert {"grpo_train.config", "grpo_train.collect", "grpo_train.trainer", "grpo_train"} <= names


def test_no_package_imports_a_package_above_it():
    upward = upward_imports()
    assert not upward, "imports of a package above the module's own (sandbox <- grpo_envs <- " + (
        "grpo_train):\n" + "\n".join(upward)
    )


def test_no_module_is_over_the_line_limit():
    long = {
        name: n
        for name, path in _module_files().items()
        if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split them by stage): " + ", ".join(
        f"{name} ({n} lines)" for name, n in sorted(long.items())
    )
