"""Loading rows for the code environments: the Hugging Face hub or local files, one error style."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import datasets


def resolve_files(data_files: str | Path | Mapping[str, str | Path]) -> dict[str, str]:
    """Split name -> file path; a single path is the ``test`` split.

    Raises FileNotFoundError naming the missing file.
    """
    files = {"test": data_files} if isinstance(data_files, str | Path) else dict(data_files)
    if not files:
        raise ValueError("data_files is empty; give a path or a {split: path} mapping")
    for split, path in files.items():
        if not Path(path).exists():
            raise FileNotFoundError(f"data file for split {split!r} not found: {path}")
    return {split: str(path) for split, path in files.items()}


def load_local(files: Mapping[str, str], split: str) -> list[dict[str, object]]:
    """Read the rows of ``split`` from local files: JSON lines, a JSON array, or parquet.

    JSON is read with the ``json`` module rather than ``datasets``: rows of one file may differ in
    shape (optional columns, a field that is a string in one row and an object in another), which
    Arrow's schema inference rejects.
    """
    if split not in files:
        raise ValueError(
            f"no data file for split {split!r}; the files given cover {sorted(files)}. Pass "
            "data_files={'train': ..., 'test': ...} to name each split's file"
        )
    path = files[split]
    if path.endswith(".parquet"):
        return list(datasets.load_dataset("parquet", data_files={split: path}, split=split))
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    try:
        if text.lstrip().startswith("["):
            rows = json.loads(text)
        else:
            rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON lines or a JSON array: {exc}") from exc
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise ValueError(f"{path}: every row must be a JSON object")
    return rows


def load_hub(repo: str, name: str | None, split: str) -> datasets.Dataset:
    """``datasets.load_dataset(repo, name, split=split)`` with a fix-it message when offline."""
    try:
        return datasets.load_dataset(repo, name, split=split)
    except (ConnectionError, OSError, ValueError) as exc:
        raise RuntimeError(
            f"could not load {repo} ({name}, split {split!r}) from the Hugging Face hub: {exc}. "
            "Without hub access, download the files elsewhere and pass data_files=PATH or "
            "data_files={split: PATH}"
        ) from exc
