"""The README's architecture map is true: each ``grpo_train`` subpackage imports only what the map's
"may import" column names, so the subpackages form one order from ``parallel`` up to the trainer.

Every import counts: at module level, inside functions (lazy) and under ``if TYPE_CHECKING:``.
The map is read from README.md's "Architecture" table, so the document and the code cannot drift.
The size rules of the layout are checked here too: a few entry modules at the top of
``grpo_train``, at most 14 modules in a subpackage.
"""

from __future__ import annotations

import re
from pathlib import Path

from test_import_graph import import_graph

import grpo_train

ROOT = Path(__file__).resolve().parents[1]
GRPO_TRAIN = Path(grpo_train.__file__ or "").resolve().parent
#: The modules at the top of grpo_train: the loop and the command lines.
TOP_LEVEL_MODULES = {"__init__", "trainer", "cli", "train_cli", "eval_cli"}
MAX_MODULES_PER_SUBPACKAGE = 14


def architecture_table() -> dict[str, set[str]]:
    """``grpo_train`` subpackage -> the subpackages the README's map says it may import."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Architecture", 1)[1].split("\n## ", 1)[0]
    allowed: dict[str, set[str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        match = re.fullmatch(r"`grpo_train/(\w+)/`", cells[0]) if len(cells) == 3 else None
        if match:
            allowed[match.group(1)] = set(re.findall(r"`(\w+)`", cells[2]))
    return allowed


def subpackage_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "grpo_train" or len(parts) < 2:
        return None
    return parts[1] if (GRPO_TRAIN / parts[1]).is_dir() else None


def subpackage_edges() -> dict[tuple[str, str], list[str]]:
    """(importer subpackage, imported subpackage) -> the importing modules, for every crossing.

    The graph is ``test_import_graph``'s with type-only imports counted: every import at any
    level, lazy ones inside functions included.
    """
    edges: dict[tuple[str, str], list[str]] = {}
    for module, imported in sorted(import_graph(type_checking=True).items()):
        source = subpackage_of(module)
        if source is None:
            continue
        for target in {subpackage_of(name) for name in imported}:
            if target is not None and target != source:
                edges.setdefault((source, target), []).append(module)
    return edges


def test_the_map_lists_every_subpackage_of_grpo_train() -> None:
    subpackages = {p.name for p in GRPO_TRAIN.iterdir() if (p / "__init__.py").is_file()}
    assert set(architecture_table()) == subpackages


def test_each_subpackage_imports_only_what_the_map_allows() -> None:
    allowed = architecture_table()
    wrong = {
        f"{source} -> {target} (in {', '.join(modules)})"
        for (source, target), modules in subpackage_edges().items()
        if target not in allowed.get(source, set())
    }
    assert not wrong, "imports the README's architecture map does not allow:\n" + "\n".join(
        sorted(wrong)
    )


def test_the_map_is_one_order_with_no_cycle() -> None:
    """What the map allows is itself acyclic: the subpackages can be read from the bottom up."""
    allowed = architecture_table()
    placed: list[str] = []
    remaining = dict(allowed)
    while remaining:
        ready = sorted(name for name, deps in remaining.items() if deps <= set(placed))
        assert ready, f"the map allows a cycle among {sorted(remaining)}"
        placed += ready
        for name in ready:
            del remaining[name]
    assert placed[0] in {"parallel", "models"}


def test_the_top_level_holds_the_trainer_and_a_few_entry_modules() -> None:
    top = {p.stem for p in GRPO_TRAIN.glob("*.py")}
    assert top == TOP_LEVEL_MODULES


def test_no_subpackage_holds_more_than_fourteen_modules() -> None:
    crowded = {
        p.name: n
        for p in GRPO_TRAIN.iterdir()
        if p.is_dir()
        and (n := len([m for m in p.glob("*.py") if m.name != "__init__.py"]))
        > MAX_MODULES_PER_SUBPACKAGE
    }
    assert not crowded
