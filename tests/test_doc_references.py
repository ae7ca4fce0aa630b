"""What the docs name exists: files, folders and dotted Python names.

The scan covers every tracked ``*.md`` and YAML file and the docstrings of ``sandbox``,
``grpo_envs``, ``grpo_train`` and ``benchmarks``. Three kinds of mention are checked:

- a path from the repository root (``grpo_train/learner/update.py``, ``tests/sandbox/``,
  ``examples/accelerate/fsdp.yaml``) names a file or folder that exists;
- a dotted name (``grpo_train.algorithm.objective.grpo_loss``) resolves: its longest importable
  module prefix is imported and the rest are attributes (a dataclass's fields count);
- ``grpo_train/README.md`` writes names from ``grpo_train`` (``learner.update.grpo_update``,
  ``collect/pipeline.py``): each resolves there, and a name that starts at a module deeper down
  (``update.grpo_update``, which a regrouping would silently orphan) is asked to say where it is.

A module moved or renamed in a regrouping leaves such mentions behind; this test lists each one
as ``file:line: reference``.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import re
import subprocess
from collections.abc import Iterator
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("sandbox", "grpo_envs", "grpo_train")
DOCSTRING_FOLDERS = (*PACKAGES, "benchmarks")
PATH_ROOTS = (*PACKAGES, "tests", "benchmarks", "examples")

#: A path from the repository root: a file of a kind docs name, or a folder (trailing ``/``).
PATH = re.compile(
    r"(?<![\w./~-])((?:" + "|".join(PATH_ROOTS) + r")/(?:[\w.-]+/)*"
    r"(?:[\w.-]+\.(?:py|md|yaml|jsonl)(?![\w-])|(?<=/)(?![\w-])))"
)
#: A dotted name in one of the packages: a module, or an attribute of one.
DOTTED = re.compile(r"(?<![\w./-])((?:" + "|".join(PACKAGES) + r")(?:\.[A-Za-z_]\w*)+)")
#: A code span of grpo_train/README.md that starts with a dotted name or a relative file path.
CODE_SPAN = re.compile(r"`([A-Za-z_][\w./]*)")
#: Last parts that make ``config.yaml`` a file name rather than a Python name.
FILE_SUFFIXES = {"py", "md", "yaml", "yml", "json", "jsonl", "pt", "png", "jinja", "csv", "txt"}
#: Dotted names that cannot be imported on a CPU machine, with why. Empty: every module the docs
#: name imports on a CPU (GPU-only libraries are imported inside the functions that use them).
NEEDS_A_GPU: dict[str, str] = {}


@dataclasses.dataclass(frozen=True)
class Mention:
    """One reference found in a document: where it is and what it names."""

    file: str
    line: int
    text: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.text}"


#: Text that documents: Markdown pages, and YAML configs (their comments name modules and files).
DOC_PATTERNS = ("*.md", "*.yaml", "*.yml")


def tracked_docs() -> list[Path]:
    """The repository's documents (``git ls-files``; a walk where there is no git)."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", *DOC_PATTERNS],
            cwd=ROOT, capture_output=True, check=True, timeout=60,
        ).stdout.decode()  # fmt: skip
        paths = [ROOT / name for name in out.split("\0") if name]
    except (OSError, subprocess.SubprocessError):
        skip = {".git", ".venv", "runs", "build"}
        paths = [
            p
            for pattern in DOC_PATTERNS
            for p in ROOT.rglob(pattern)
            if not skip.intersection(p.relative_to(ROOT).parts)
        ]
    return sorted(p for p in paths if p.is_file())


def docstrings(path: Path) -> Iterator[tuple[int, str]]:
    """``(first line, text)`` of the module's, its classes' and its functions' docstrings."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        first = node.body[0] if node.body else None
        if (
            isinstance(first, ast.Expr)
            and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str)
        ):
            yield first.lineno, first.value.value


@cache
def documents() -> tuple[tuple[str, int, str], ...]:
    """``(file, line number, line)`` of every scanned line: Markdown files, then docstrings."""
    return tuple(_scanned_lines())


def _scanned_lines() -> Iterator[tuple[str, int, str]]:
    for path in tracked_docs():
        name = str(path.relative_to(ROOT))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            yield name, number, line
    for folder in DOCSTRING_FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            name = str(path.relative_to(ROOT))
            for first, text in docstrings(path):
                for offset, line in enumerate(text.splitlines()):
                    yield name, first + offset, line


def mentions(pattern: re.Pattern[str]) -> list[Mention]:
    return [
        Mention(name, number, match.group(1))
        for name, number, line in documents()
        for match in pattern.finditer(line)
    ]


def path_exists(reference: str) -> bool:
    return (ROOT / reference).exists()


def _is_missing_module(error: ModuleNotFoundError, module: str) -> bool:
    """True when ``module`` itself (or a parent of it) does not exist, not one of its imports."""
    return error.name is not None and (module == error.name or module.startswith(error.name + "."))


def _has_attribute(owner: object, name: str) -> bool:
    if hasattr(owner, name):
        return True
    if isinstance(owner, type):  # a dataclass field or an annotated attribute without a default
        if dataclasses.is_dataclass(owner) and name in {f.name for f in dataclasses.fields(owner)}:
            return True
        return any(name in getattr(klass, "__annotations__", {}) for klass in owner.__mro__)
    return False


@cache
def resolve(reference: str) -> str | None:
    """``None`` when ``reference`` names a module or an attribute of one, else why not.

    >>> resolve("grpo_train.algorithm.objective.grpo_loss") is None
    True
    >>> resolve("grpo_train.loss.grpo_loss")
    'grpo_train has no module or attribute loss'
    >>> resolve("grpo_envs.math.verify.no_such_name")
    'grpo_envs.math.verify has no attribute no_such_name'
    """
    parts = reference.split(".")
    owner: object = None
    end = len(parts)
    while end > 0:
        module_name = ".".join(parts[:end])
        try:
            owner = importlib.import_module(module_name)
            break
        except ModuleNotFoundError as error:
            if not _is_missing_module(error, module_name):
                return f"importing {module_name} failed: {error!r}"
        end -= 1
    if end == 0:
        return f"no module {parts[0]}"
    for position in range(end, len(parts)):
        name, prefix = parts[position], ".".join(parts[:position])
        if not _has_attribute(owner, name):
            kind = "module or attribute" if hasattr(owner, "__path__") else "attribute"
            return f"{prefix} has no {kind} {name}"
        owner = getattr(owner, name, None)
    return None


def test_the_patterns_find_what_docs_write() -> None:
    line = (
        "see `grpo_train/learner/update.py`, tests/sandbox/ and examples/README.md; "
        "`grpo_train.learner.update.grpo_update(...)`, runs/x/config.yaml, "
        "a/tests/x.py, grpo_train/learner/update, grpo_train.cli."
    )
    assert [m.group(1) for m in PATH.finditer(line)] == [
        "grpo_train/learner/update.py",
        "tests/sandbox/",
        "examples/README.md",
    ]
    assert [m.group(1) for m in DOTTED.finditer(line)] == [
        "grpo_train.learner.update.grpo_update",
        "grpo_train.cli",
    ]


def test_the_scan_reads_markdown_and_docstrings() -> None:
    files = {name for name, _, _ in documents()}
    assert {"README.md", "grpo_train/README.md", "grpo_train/trainer.py"} <= files
    assert len(mentions(PATH)) > 100 and len(mentions(DOTTED)) > 50


def test_every_path_in_the_docs_exists() -> None:
    missing = [str(m) for m in mentions(PATH) if not path_exists(m.text)]
    assert not missing, "these paths name nothing in the repository:\n" + "\n".join(missing)


def test_every_dotted_name_in_the_docs_resolves() -> None:
    broken = []
    for mention in mentions(DOTTED):
        why = None if mention.text in NEEDS_A_GPU else resolve(mention.text)
        if why is not None:
            broken.append(f"{mention} ({why})")
    assert not broken, "these names do not resolve:\n" + "\n".join(broken)


def grpo_train_names() -> tuple[set[str], set[str]]:
    """``grpo_train``'s top-level names (subpackages, modules) and its deeper modules' names."""
    package = ROOT / "grpo_train"
    top = {p.stem for p in package.glob("*.py")} | {
        p.parent.name for p in package.glob("*/__init__.py")
    }
    deeper = {p.stem for p in package.glob("*/**/*.py") if p.stem != "__init__"}
    return top - {"__init__"}, deeper - top


def grpo_train_readme_problems(text: str) -> list[str]:
    """Each name of grpo_train/README.md's ``text`` that ``grpo_train`` lacks, and why."""
    top, deeper = grpo_train_names()
    tracked = {p.name for p in ROOT.rglob("*.py") if not {".venv", ".git"} & set(p.parts)}
    problems = []
    for number, line in enumerate(text.splitlines(), start=1):
        for match in CODE_SPAN.finditer(line):
            raw = match.group(1)
            name = raw.rstrip(".")
            where = f"grpo_train/README.md:{number}: {name}"
            if "/" in name:  # a path; metric names (``eval/accuracy``) look alike
                is_file = name.endswith(".py") or raw.endswith("/")
                if (
                    is_file
                    and name.split("/")[0] in top
                    and not (ROOT / "grpo_train" / name).exists()
                ):
                    problems.append(f"{where} (no file grpo_train/{name})")
                continue
            parts = name.split(".")
            if len(parts) < 2:
                continue
            if parts[-1] in FILE_SUFFIXES:  # a file name
                if parts[-1] == "py" and len(parts) == 2 and name not in tracked:
                    problems.append(f"{where} (no such file in the repository)")
                continue
            if parts[0] in top:
                why = resolve("grpo_train." + name)
                if why is not None:
                    problems.append(f"{where} ({why})")
            elif parts[0] in deeper:
                problems.append(f"{where} (write it from grpo_train: which subpackage?)")
    return problems


def test_the_grpo_train_readme_rule_catches_stale_names() -> None:
    text = (
        "`learner.update.grpo_update(learner, ...)`, `collect/pipeline.py`, `trainer.py`, "
        "`config.yaml`, `eval/accuracy`, `Trainer.train_step`\n"
        "`update.grpo_update`, `collect.Collector`, `rollout_pipeline.py`, "
        "`learner/loss.py`, `episodes/`"
    )
    assert [problem.split(" (")[0] for problem in grpo_train_readme_problems(text)] == [
        "grpo_train/README.md:2: update.grpo_update",
        "grpo_train/README.md:2: collect.Collector",
        "grpo_train/README.md:2: rollout_pipeline.py",
        "grpo_train/README.md:2: learner/loss.py",
    ]


def test_grpo_train_readme_names_resolve_from_the_package() -> None:
    text = (ROOT / "grpo_train" / "README.md").read_text(encoding="utf-8")
    problems = grpo_train_readme_problems(text)
    assert not problems, "grpo_train/README.md names what is not there:\n" + "\n".join(problems)
