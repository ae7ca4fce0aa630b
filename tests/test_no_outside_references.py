"""Code and docs state facts themselves: nothing in the repository points at an issue tracker,
a numbered report, or notes and folders that only exist outside the repository.

Every tracked source and doc file is scanned (``git ls-files``; a copy without git metadata is
walked instead). This file is scanned too, so the pattern is assembled from pieces that do not
match it literally.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".sh", ".cfg", ".txt"}
SKIP_DIRS = {".git", ".venv", "runs", "build", "__pycache__", ".mypy_cache", ".ruff_cache"}

# Each piece is split so that this file's own source text does not match it.
_PIECES = [
    r"\.\./" + "shared/",  # a sibling folder of the checkout
    "anchors" + r"\.md",  # a notes file outside the repository
    "pain" + " point",
    "[Ii]" + r"ssue #?[0-9]+",  # a numbered report
    "[Tt]he" + " issue's",
    "this" + " issue",
]
OUTSIDE = re.compile("|".join(f"(?:{p})" for p in _PIECES))


def _files() -> list[Path]:
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60
        ).stdout.decode()
        paths = [ROOT / name for name in out.split("\0") if name]
    except (OSError, subprocess.SubprocessError):
        paths = [
            p
            for p in ROOT.rglob("*")
            if p.is_file() and not SKIP_DIRS.intersection(p.relative_to(ROOT).parts)
        ]
    return sorted(p for p in paths if p.suffix in SUFFIXES and p.is_file())


def outside_references(text: str) -> list[tuple[int, str]]:
    """Return ``(line number, line)`` for each line that points outside the repository.

    >>> [number for number, _ in outside_references("fine\\nsee " + "Issue" + " #12 for it\\n")]
    [2]
    >>> outside_references("a leaf in an issue-free tree")
    []
    """
    return [
        (number, line.strip())
        for number, line in enumerate(text.splitlines(), start=1)
        if OUTSIDE.search(line)
    ]


@pytest.mark.parametrize(
    "line",
    [
        "see ../" + "shared/notes/x.md",
        "as in " + "anchors" + ".md",
        "the users' main " + "pain" + " points",
        "fixed in issue" + " 41",
        "Issue" + " #3 asks for it",
        "The" + " issue's reference run",
        "what " + "this" + " issue" + " wants",
    ],
)
def test_pattern_catches_each_kind(line: str) -> None:
    assert outside_references(line) == [(1, line)]


def test_pattern_leaves_ordinary_words_alone() -> None:
    text = "a child issues the syscalls\nthe resource tracker\nissues raised by the sandbox\n"
    assert outside_references(text) == []


def test_no_file_points_outside_the_repository() -> None:
    files = _files()
    assert len(files) > 50, "the scan found almost no files: is ROOT right?"
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line}"
        for path in files
        for number, line in outside_references(path.read_text(encoding="utf-8", errors="replace"))
    ]
    assert not found, "state the fact itself instead of pointing outside the repository:\n" + (
        "\n".join(found)
    )
