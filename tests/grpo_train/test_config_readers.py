"""Only the code that assembles a run reads the whole configuration (``grpo_train.config``).

Every other component takes its own small settings dataclass, built in ``grpo_train.setup``; this
test scans ``grpo_train`` with ``ast`` for imports of the configuration package: plain and
relative imports, ``if TYPE_CHECKING:`` ones and the docstring examples' alike.
"""

from __future__ import annotations

import ast
import doctest
from collections.abc import Iterator
from pathlib import Path

from test_import_graph import imported_names

PACKAGE = Path(__file__).resolve().parents[2] / "grpo_train"
CONFIG = "grpo_train.config"

#: The modules that assemble a run, and may read the whole configuration.
ASSEMBLERS = frozenset(
    {
        "grpo_train.cli",  # the ``grpo`` command (dispatches to the ones below)
        "grpo_train.train_cli",  # ``grpo train``: parses the flags into a TrainConfig
        "grpo_train.eval_cli",  # ``grpo eval``: reads a training run's prompt format
        "grpo_train.setup.run",  # builds the run
        "grpo_train.setup.settings",  # builds every component's settings
        "grpo_train.setup.engines",  # builds the rollout engine the run asks for
        "grpo_train.trainer",  # the loop: holds the run's TrainConfig
    }
)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _examples(tree: ast.AST) -> Iterator[ast.AST]:
    """Yield the parsed source of every docstring example (``>>>`` lines)."""
    parser = doctest.DocTestParser()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=True)
            for example in parser.get_examples(doc or ""):
                try:
                    yield ast.parse(example.source)
                except SyntaxError:  # pragma: no cover - doctest runs them anyway
                    continue


def config_readers() -> dict[str, Path]:
    """Map each module outside the configuration package that imports it to its file."""
    readers: dict[str, Path] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module_name(path)
        if module == CONFIG or module.startswith(CONFIG + "."):
            continue
        tree = ast.parse(path.read_text())
        is_package = path.name == "__init__.py"
        trees = [tree, *_examples(tree)]
        names = {name for t in trees for name in imported_names(t, module, is_package)}
        if any(n == CONFIG or n.startswith(CONFIG + ".") for n in names):
            readers[module] = path
    return readers


def test_the_scan_sees_every_kind_of_import(tmp_path: Path) -> None:
    plain = ast.parse("import grpo_train.config.loading")
    relative = ast.parse("from ..config import TrainConfig")
    package = ast.parse("from grpo_train import config")
    assert CONFIG + ".loading" in set(imported_names(plain, "grpo_train.run.x", False))
    assert CONFIG in set(imported_names(relative, "grpo_train.run.x", False))
    assert CONFIG in set(imported_names(package, "grpo_train.x", False))
    example = ast.parse('def f():\n    """Do.\n\n    >>> from grpo_train.config import X\n    """')
    (parsed,) = _examples(example)
    assert CONFIG in set(imported_names(parsed, "grpo_train.x", False))


def test_only_the_modules_that_assemble_a_run_read_the_configuration() -> None:
    readers = config_readers()
    assert {"grpo_train.setup.run", "grpo_train.trainer"} <= set(readers)  # the scan finds them
    violators = sorted(set(readers) - ASSEMBLERS)
    assert violators == [], (
        "these modules import grpo_train.config; give them a settings dataclass of their own, "
        f"built in grpo_train.setup.settings: {violators}"
    )
