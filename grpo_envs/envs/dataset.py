r"""Bring your own dataset, no code: ``math/dataset-v0`` and ``code/dataset-v0``.

Both are ``SingleTurnEnv`` compositions built from a table: a local JSONL/JSON/Parquet/CSV file,
a folder or ``{split}`` pattern of such files, or a Hugging Face dataset id. From YAML::

    env:
      - id: math/dataset-v0
        kwargs: {path: data/questions.jsonl, question: problem, answer: solution}

or ``grpo train --env math/dataset-v0`` with ``kwargs``, ``grpo eval --suite math/dataset-v0
--env_kwargs '{"math/dataset-v0": {"path": ...}}'``, ``grpo envs show/score ID --kwargs ...``.

Splits (``splits=``): ``"train,test"`` names the splits; ``"train=train,test=validation"`` maps
each to the source's split name (a hub split, the ``{split}`` of a path pattern, or
``{split}.jsonl`` in a folder). A single file has no split names: its rows are divided into
``train`` and a held-out ``test`` (``test_fraction`` of them, at least one, chosen by a hash of
each row, so the division does not depend on row order); ``splits="test"`` keeps the whole file as
one split.

Errors name the file and the row: a missing column lists the columns there are, an empty split
says which, a row without an answer (or tests) gives its row number (1-based). With
``HF_DATASETS_OFFLINE=1`` (or ``HF_HUB_OFFLINE=1``) a hub id fails at once, without retries.

Why one module over 500 lines: both dataset environments share the table reader, the split
rule and the column mapping, which are most of the module.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo_envs.base import SingleTurnEnv, render_template
from grpo_envs.code.extract import ExtractedCode, extract_code
from grpo_envs.code.languages import (
    DISPLAY_NAMES,
    FENCES,
    PYTHON,
    check_language,
    reference_fence,
    require_toolchain,
)
from grpo_envs.code.scoring import CodeEnvironment, CodeTask
from grpo_envs.envs._common import extra_components, math_correctness, reference_answer
from grpo_envs.envs.mbpp import entry_point_of
from grpo_envs.format import FORMATS
from grpo_envs.rubric import Rubric
from grpo_envs.types import DataUnavailableError, JSONValue, Sample

MATH_TEMPLATE = "{question}\n\nPut your final answer within \\boxed{}."
CODE_TEMPLATE = (
    "{question}\n\nReply with your complete Python solution in a single ```python code block."
)
#: The default prompt of a task in another language (``{language}``: its display name).
LANGUAGE_CODE_TEMPLATE = (
    "{question}\n\nReply with your complete {language} solution in a single ```{fence} code "
    "block. It reads standard input and writes standard output."
)
FILE_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv")
_OFFLINE_VARS = ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")


# --- reading tables ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One raw row and where it came from (for error messages)."""

    number: int  # 1-based position in its source
    values: Mapping[str, object]
    source: str


def _offline() -> str | None:
    for var in _OFFLINE_VARS:
        if os.environ.get(var, "").strip().lower() in ("1", "true", "yes", "on"):
            return var
    return None


def _read_file(path: Path) -> list[dict[str, object]]:
    suffix = path.suffix.lower()
    if suffix == ".csv":
        with path.open(encoding="utf-8", newline="") as handle:
            return [dict(r) for r in csv.DictReader(handle)]
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        return [dict(r) for r in pq.read_table(path).to_pylist()]
    text = path.read_text(encoding="utf-8")
    try:
        if text.lstrip().startswith("["):
            rows = json.loads(text)
        else:
            rows = []
            for number, line in enumerate(text.splitlines(), 1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as exc:
                        raise ValueError(f"{path}, line {number}: not JSON ({exc})") from exc
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON lines or a JSON array ({exc})") from exc
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise ValueError(f"{path}: every row must be a JSON object")
    return rows


@dataclass(frozen=True)
class Table:
    """Where the rows of each split come from (see the module docstring).

    Attributes:
        path: a file, a folder, a path pattern with ``{split}``, or a hub dataset id.
        splits: (our split name, the source's split name) pairs.
        config: the hub dataset's configuration name.
        test_fraction: share of a single file's rows held out as ``test``.
        limit: keep the first ``limit`` rows of each split.
    """

    path: str
    splits: tuple[tuple[str, str], ...]
    config: str | None = None
    test_fraction: float = 0.1
    limit: int | None = None

    @classmethod
    def parse(
        cls,
        path: str,
        splits: str | Sequence[str] | Mapping[str, str] | None,
        config: str | None,
        test_fraction: float,
        limit: int | None,
    ) -> Table:
        """Validate the options; a missing local file or an offline hub id fails here, at once."""
        if not isinstance(path, str) or not path.strip():
            raise ValueError("path is required: a JSONL/Parquet/CSV file, a folder or a hub id")
        if isinstance(splits, Mapping):
            pairs = [(str(k), str(v)) for k, v in splits.items()]
        else:
            items = splits.split(",") if isinstance(splits, str) else list(splits or [])
            pairs = []
            for item in (str(i).strip() for i in items):
                if item:
                    ours, _, theirs = item.partition("=")
                    pairs.append((ours.strip(), (theirs or ours).strip()))
        if splits is not None and not pairs:
            raise ValueError(f"splits={splits!r} names no split; e.g. splits='train,test'")
        if not 0.0 < test_fraction < 1.0:
            raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
        if limit is not None and limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        default = (("train", "train"), ("test", "test"))
        table = cls(path, tuple(pairs) or default, config, test_fraction, limit)
        kind = table.kind
        if kind == "missing":
            raise FileNotFoundError(
                f"data file missing: {path} (the environment's path= option): no such file or "
                "folder; a local dataset is a .jsonl, .json, .parquet or .csv file, a folder of "
                "{split}.jsonl files, or a pattern with {split}"
            )
        if kind == "hub" and (var := _offline()):
            raise ValueError(
                f"path {path!r} is not a local file, and {var} is set, so the Hugging Face hub "
                "cannot be reached: pass a local .jsonl/.parquet/.csv file (or unset "
                f"{var} to download {path!r})"
            )
        return table

    @property
    def kind(self) -> str:
        """``file``, ``folder``, ``pattern``, ``hub`` or ``missing``."""
        if "{split}" in self.path:
            return "pattern"
        local = Path(self.path).expanduser()
        if local.is_file():
            return "file"
        if local.is_dir():
            return "folder"
        looks_local = (
            self.path.lower().endswith(FILE_SUFFIXES)
            or self.path.startswith(("/", ".", "~"))
            or os.sep in self.path.strip("/").replace("/", "", 1)  # more than one slash
        )
        return "missing" if looks_local else "hub"

    @property
    def names(self) -> tuple[str, ...]:
        """Our split names."""
        return tuple(ours for ours, _ in self.splits)

    def rows(self, split: str) -> list[Row]:
        """Return the raw rows of ``split`` (``limit`` applied); ValueError when there are none."""
        source_split = dict(self.splits)[split]
        kind = self.kind
        if kind == "file":
            rows, source = self._single_file(split)
        elif kind in ("folder", "pattern"):
            source = self._split_file(source_split)
            rows = list(enumerate(_read_file(Path(source)), 1))
        else:
            rows, source = self._hub(source_split), f"{self.path} (hub, split {source_split!r})"
        found = [Row(n, r, source) for n, r in rows]
        if self.limit is not None:
            found = found[: self.limit]
        if not found:
            raise ValueError(f"{source}: split {split!r} is empty (no rows)")
        return found

    def _single_file(self, split: str) -> tuple[list[tuple[int, dict[str, object]]], str]:
        path = Path(self.path).expanduser()
        rows = list(enumerate(_read_file(path), 1))
        if len(self.splits) == 1:
            return rows, str(path)
        if {s for s, _ in self.splits} != {"train", "test"}:
            raise ValueError(
                f"{path} is one file: it can be split into 'train' and 'test' (test_fraction) or "
                f"kept whole as one split (splits='test'), not into {list(self.names)}"
            )
        if len(rows) < 2:
            raise ValueError(
                f"{path} has {len(rows)} row(s): too few to hold out a test split; add rows or "
                "keep the file whole with splits='train' (or 'test')"
            )
        # Rank rows by a hash of their content: the held-out rows do not depend on file order.
        ranked = sorted(
            rows,
            key=lambda r: (
                hashlib.sha256(json.dumps(r[1], sort_keys=True, default=str).encode())
                .digest()
                .hex()
            ),
        )
        n_test = max(1, min(len(rows) - 1, round(len(rows) * self.test_fraction)))
        held_out = {number for number, _ in ranked[:n_test]}
        keep = [r for r in rows if (r[0] in held_out) == (split == "test")]
        return keep, str(path)

    def _split_file(self, source_split: str) -> str:
        if self.kind == "pattern":
            path = Path(self.path.replace("{split}", source_split)).expanduser()
            if not path.is_file():
                raise FileNotFoundError(
                    f"data file missing: {path} for split {source_split!r} (the environment's "
                    f"path= option, {self.path!r})"
                )
            return str(path)
        folder = Path(self.path).expanduser()
        for suffix in FILE_SUFFIXES:
            candidate = folder / f"{source_split}{suffix}"
            if candidate.is_file():
                return str(candidate)
        raise FileNotFoundError(
            f"data file missing: {folder} holds no {source_split}.jsonl, .json, .parquet or .csv "
            f"file for split {source_split!r} (the environment's path= option; splits= maps "
            "split names)"
        )

    def _hub(self, source_split: str) -> list[tuple[int, dict[str, object]]]:
        if var := _offline():
            raise ValueError(f"{self.path!r} is a hub id and {var} is set: use a local file")
        import datasets

        try:
            loaded = datasets.load_dataset(self.path, self.config, split=source_split)
        except Exception as exc:
            raise DataUnavailableError(
                f"could not load {self.path!r} (config {self.config!r}, split {source_split!r}) "
                f"from the Hugging Face hub ({type(exc).__name__}: {exc}); offline, pass a local "
                ".jsonl/.parquet/.csv file as path"
            ) from exc
        return list(enumerate((dict(r) for r in loaded), 1))  # type: ignore[arg-type]


def _column(row: Row, name: str, what: str, *, required: bool = True) -> object:
    if name not in row.values:
        raise ValueError(
            f"{row.source}: no column {name!r} for the {what} (columns: "
            f"{', '.join(sorted(map(str, row.values)))}); set {what}=<column name>"
        )
    value = row.values[name]
    if required and (value is None or (isinstance(value, str) and not value.strip())):
        raise ValueError(f"{row.source}, row {row.number}: the {what} (column {name!r}) is empty")
    return value


def _row_id(row: Row, id_column: str | None, split: str) -> str:
    if id_column is None:
        return f"{split}-{row.number}"
    return str(_column(row, id_column, "id"))


def _fields(row: Row) -> dict[str, object]:
    return {str(k): v for k, v in row.values.items()}


def _lazy(
    table: Table, split: str, build: Callable[[Row], Mapping[str, object]]
) -> Callable[[], Iterator[Mapping[str, object]]]:
    def rows() -> Iterator[Mapping[str, object]]:
        for row in table.rows(split):
            yield build(row)

    return rows


# --- math/dataset-v0 --------------------------------------------------------------------------


def math_dataset(
    path: str,
    *,
    question: str = "question",
    answer: str = "answer",
    id: str | None = None,
    splits: str | Sequence[str] | Mapping[str, str] | None = None,
    config: str | None = None,
    test_fraction: float = 0.1,
    limit: int | None = None,
    prompt_template: str = MATH_TEMPLATE,
    system_prompt: str | None = None,
    verify: str = "loose",
    format: str = "none",
    format_weight: float = 0.0,
    timeout_s: float = 5.0,
) -> SingleTurnEnv:
    r"""Math questions with answers from a table, scored by ``grpo_envs.math.verify``.

    Args:
        path: a .jsonl/.json/.parquet/.csv file, a folder or ``{split}`` pattern, or a hub id.
        question: the column holding the question.
        answer: the column holding the gold answer (a bare answer, a ``\boxed{}`` solution or a
            GSM8K solution ending in ``#### N``).
        id: the column of stable row ids (default: ``<split>-<row number>``).
        splits: split names, optionally mapped to the source's (see the module docstring).
        config: the hub dataset's configuration.
        test_fraction: share of a single file held out as ``test``.
        limit: keep the first ``limit`` rows of each split.
        prompt_template: the user message; ``{question}`` and any ``{column}`` are filled in.
        system_prompt: a system message before every prompt.
        verify: ``loose`` (the final stated answer of prose counts too) or ``strict`` (only
            ``\boxed{}``, ``<answer>`` tags or ``#### N``).
        format: ``none``, ``boxed`` or ``think_answer``: a format reward component.
        format_weight: its weight (0: logged only).
        timeout_s: per-answer bound of the symbolic comparison.
    """
    if verify not in ("loose", "strict"):
        raise ValueError(f"verify must be 'loose' or 'strict', got {verify!r}")
    if format not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {format!r}")
    table = Table.parse(path, splits, config, test_fraction, limit)

    def build(split: str) -> Callable[[], Iterator[Mapping[str, object]]]:
        def item(row: Row) -> Mapping[str, object]:
            text = _column(row, question, "question")
            gold = _column(row, answer, "answer")
            return {
                **_fields(row),
                "id": _row_id(row, id, split),
                "question": str(text),
                "answer": str(gold),
                "prompt": None,
                "metadata": {"row": row.number},
            }

        return _lazy(table, split, item)

    def reference(sample: Sample) -> str:
        from grpo_envs.math.extract import gold_answer

        return reference_answer(format, gold_answer(sample.answer) or sample.answer)

    return SingleTurnEnv(
        {name: build(name) for name in table.names},
        Rubric(
            [
                math_correctness(timeout_s, verify == "strict"),
                *extra_components(format, format_weight),
            ]
        ),
        system_prompt=system_prompt,
        prompt_template=prompt_template,
        reference=reference,
    )


# --- code/dataset-v0 --------------------------------------------------------------------------


def _as_list(value: object, row: Row, what: str) -> list[object]:
    if isinstance(value, str):
        stripped = value.strip()
        if stripped.startswith("["):
            try:
                value = json.loads(stripped)
            except json.JSONDecodeError as exc:
                raise ValueError(
                    f"{row.source}, row {row.number}: {what} is not JSON ({exc})"
                ) from exc
        else:
            value = [line for line in stripped.splitlines() if line.strip()]
    if hasattr(value, "tolist"):  # numpy arrays from parquet
        value = value.tolist()
    if not isinstance(value, list | tuple) or not value:
        raise ValueError(f"{row.source}, row {row.number}: {what} must be a non-empty list")
    return list(value)


class DatasetCodeEnv(CodeEnvironment):
    """``code/dataset-v0``: problems with tests from a table, run in the sandbox.

    Each sample carries its tests in its metadata, so scoring needs no file: either assert
    statements that call the solution's function (``metadata["asserts"]``, with the function's
    name), or stdin/stdout pairs (``metadata["io"]``).
    """

    def __init__(
        self,
        path: str,
        *,
        question: str = "question",
        tests: str | None = "tests",
        inputs: str | None = None,
        outputs: str | None = None,
        solution: str | None = "solution",
        id: str | None = None,
        splits: str | Sequence[str] | Mapping[str, str] | None = None,
        config: str | None = None,
        test_fraction: float = 0.1,
        limit: int | None = None,
        prompt_template: str = CODE_TEMPLATE,
        system_prompt: str | None = None,
        reward: str = "binary",
        language: str = PYTHON,
        language_column: str | None = None,
        **options: Any,
    ) -> None:
        """Configure the environment (see ``code_dataset`` for the arguments)."""
        super().__init__(reward=reward, **options)
        if (inputs is None) != (outputs is None):
            raise ValueError(
                "give both inputs= and outputs= columns (stdin/stdout cases), or neither"
            )
        self.table = Table.parse(path, splits, config, test_fraction, limit)
        self.splits = self.table.names
        self.columns = {"question": question, "tests": tests, "inputs": inputs, "outputs": outputs}
        self.solution, self.id_column = solution, id
        self.prompt_template = prompt_template
        self.language = check_language(language)
        self.language_column = language_column
        if system_prompt is not None:
            self.system_prompt = system_prompt
        self._sources = {name: self._rows_of(name) for name in self.splits}

    def _rows_of(self, split: str) -> Callable[[], Iterator[Mapping[str, object]]]:
        return _lazy(self.table, split, lambda row: self._item(row, split))

    def _item(self, row: Row, split: str) -> Mapping[str, object]:
        text = _column(row, str(self.columns["question"]), "question")
        reference = ""
        # The default column is read when the file has it (check_env then runs each reference
        # solution against its tests); a column named explicitly must exist.
        if self.solution is not None and (
            self.solution in row.values or self.solution != "solution"
        ):
            reference = str(_column(row, self.solution, "solution", required=False) or "")
        meta: dict[str, JSONValue]
        if self.columns["inputs"] is not None:
            ins = _as_list(_column(row, str(self.columns["inputs"]), "inputs"), row, "inputs")
            outs = _as_list(_column(row, str(self.columns["outputs"]), "outputs"), row, "outputs")
            if len(ins) != len(outs):
                raise ValueError(
                    f"{row.source}, row {row.number}: {len(ins)} inputs but {len(outs)} outputs"
                )
            meta = {"io": [[str(i), str(o)] for i, o in zip(ins, outs)]}
        else:
            if self.columns["tests"] is None:
                raise ValueError("give tests= (assert statements) or inputs= and outputs= columns")
            cases = _as_list(_column(row, self.columns["tests"], "tests"), row, "tests")
            if all(isinstance(c, Mapping) for c in cases):  # [{input, output}, ...]
                pairs = [c for c in cases if isinstance(c, Mapping)]
                meta = {"io": [[str(c.get("input", "")), str(c.get("output", ""))] for c in pairs]}
            else:
                asserts = [str(c) for c in cases]
                try:
                    entry = entry_point_of(asserts, reference)
                except (ValueError, SyntaxError) as exc:
                    raise ValueError(f"{row.source}, row {row.number}: tests: {exc}") from exc
                meta = {"asserts": list(asserts), "entry_point": entry}
        meta["row"] = row.number
        column = self.language_column
        language = (row.values.get(column) if column else None) or self.language
        try:
            language = check_language(language)
        except ValueError as exc:
            raise ValueError(f"{row.source}, row {row.number}: {exc}") from None
        prompt: list[dict[str, str]] | None = None
        if language != PYTHON:  # Python items stay exactly as they were
            if "asserts" in meta:
                raise ValueError(
                    f"{row.source}, row {row.number}: {language} tasks need stdin/stdout tests "
                    "(assert tests call a Python function)"
                )
            meta["language"] = language
            if self.prompt_template == CODE_TEMPLATE:
                values = {**_fields(row), "question": str(text)}
                values |= {"language": DISPLAY_NAMES[language], "fence": FENCES[language]}
                prompt = [
                    {"role": "user", "content": render_template(LANGUAGE_CODE_TEMPLATE, values)}
                ]
        return {
            **_fields(row),
            "id": _row_id(row, self.id_column, split),
            "question": str(text),
            "answer": reference,
            "prompt": prompt,
            "metadata": meta,
        }

    def task(self, sample: Sample) -> CodeTask:
        """Assert tests calling the entry point, or one stdin/stdout test per pair."""
        from sandbox import CallTest, IOTest

        meta = sample.metadata
        asserts, io, entry = meta.get("asserts"), meta.get("io"), meta.get("entry_point")
        if isinstance(asserts, list) and asserts and isinstance(entry, str):
            tests = tuple(CallTest(str(t), name=f"test[{i}]") for i, t in enumerate(asserts))
            return CodeTask(sample.id, tests, entry, reference=sample.answer or None)
        if isinstance(io, list) and io:
            pairs = tuple(
                IOTest(stdin=str(p[0]), expected_stdout=str(p[1]), name=f"io[{i}]")  # type: ignore[index]
                for i, p in enumerate(io)
            )
            language = require_toolchain(_language_of(sample))
            return CodeTask(sample.id, pairs, reference=sample.answer or None, language=language)
        raise ValueError(f"sample {sample.id!r} carries no tests (metadata 'asserts' or 'io')")

    def extract(self, completion: str, task: CodeTask, sample: Sample) -> ExtractedCode | None:
        """Take the last fenced block of the task's language (Python: one defining the function)."""
        return extract_code(completion, task.entry_point, task.language)

    def reference_completion(self, sample: Sample) -> str | None:
        """Return the reference solution as a fenced block of its language."""
        return reference_fence(sample.answer, _language_of(sample)) if sample.answer else None


def _language_of(sample: Sample) -> str:
    """Return the language of a sample (``metadata['language']``; Python when absent)."""
    return check_language(sample.metadata.get("language", PYTHON))


def code_dataset(path: str, **kwargs: Any) -> DatasetCodeEnv:
    """Programming problems with tests from a table, scored in the sandbox.

    Args:
        path: a .jsonl/.json/.parquet/.csv file, a folder or ``{split}`` pattern, or a hub id.
        question: the column holding the problem statement.
        tests: the column of tests: assert statements calling the solution's function (a list,
            a JSON list or one per line), or a list of ``{input, output}`` stdin/stdout cases.
        inputs, outputs: instead of ``tests``, two columns of stdin / expected stdout lists.
        solution: the column of a reference solution (default ``solution``, read when the file
            has it; ``None`` ignores it): calibrates time limits, and ``check_env`` runs it
            against its tests, so a wrong reference fails the check.
        id, splits, config, test_fraction, limit, prompt_template, system_prompt: as for
            ``math/dataset-v0``.
        reward: ``binary`` (all tests pass: 1, else 0) or ``fraction`` (share of tests passed).
        language: the language of the tasks (``sandbox.Language``: python, cpp, java, nodejs,
            rust, bash); other than Python needs stdin/stdout tests. A task whose toolchain is
            not installed is a clear error when it is built.
        language_column: a column naming each row's language (empty cells: ``language``).
        **kwargs: the arguments above, and ``CodeConfig`` fields (``memory_mb``...).
    """
    return DatasetCodeEnv(path, **kwargs)
