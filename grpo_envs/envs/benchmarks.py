r"""Benchmark sets as papers report them: AIME 2024 / 2025 and AMC 2023, plus the shared loader.

| id | hub dataset (split) | local copy |
| --- | --- | --- |
| ``math/aime24-v0`` | ``HuggingFaceH4/aime_2024`` (``train``, 30 problems) | ``$GRPO_AIME24_DIR`` |
| ``math/aime25-v0`` | ``math-ai/aime25`` (``test``, 30) | ``$GRPO_AIME25_DIR`` |
| ``math/amc23-v0`` | ``math-ai/amc23`` (``test``, 40) | ``$GRPO_AMC23_DIR`` |

The answers are integers (AIME: 0-999), graded by the math verifier like MATH-500, so these are
ordinary math environments: usable for training too (e.g. train on AIME 2024, evaluate on 2025).

Every benchmark loads its rows from, in order: ``data_path=`` (a data file, ``.jsonl``/``.json``/
``.parquet``/``.csv``, or a folder holding ``{split}.jsonl`` or the hub split's name), the
environment variable, else the Hugging Face hub (``hub_id=``, ``revision=`` to pin a commit).
Offline, the error names the dataset, the command that saves it as a file, and where to put it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from grpo_envs.base import SingleTurnEnv
from grpo_envs.envs._common import (
    _set_hub_offline,
    extra_components,
    hub_reachable,
    math_correctness,
    reference_answer,
    user_prompt,
)
from grpo_envs.rubric import Rubric
from grpo_envs.types import DataUnavailableError, Sample

#: DeepSeek-R1's recommended math prompt (its model card's usage recommendations).
R1_MATH_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
_LOCAL_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv")


@dataclass(frozen=True)
class HubSource:
    """Where a benchmark lives on the Hugging Face hub, and its local override."""

    name: str
    """The suite name used in messages and ``--data_dir NAME=DIR``."""
    hub_id: str
    config: str | None
    hub_split: str
    env_var: str
    revision: str | None = None
    data_files: tuple[str, ...] | None = None
    """Files inside the hub repository to load (repositories whose loading script is gone)."""


def _read_file(path: Path) -> list[dict[str, object]]:
    """Rows of a local data file (JSON lines, a JSON array, parquet or CSV)."""
    suffix = path.suffix.lower()
    if suffix in (".parquet", ".csv"):
        import datasets

        builder = "parquet" if suffix == ".parquet" else "csv"
        loaded = datasets.load_dataset(builder, data_files=str(path), split="train")
        return [dict(r) for r in loaded]
    text = path.read_text(encoding="utf-8")
    try:
        rows = (
            json.loads(text)
            if text.lstrip().startswith("[")
            else [json.loads(line) for line in text.splitlines() if line.strip()]
        )
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not JSON lines or a JSON array: {err}") from err
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise ValueError(f"{path}: every row must be a JSON object")
    return rows


def _local_file(source: Path, split: str, hub_split: str) -> Path:
    if source.is_file():
        return source
    if not source.is_dir():
        raise FileNotFoundError(f"{source} does not exist (give a data file or a folder)")
    names = dict.fromkeys([split, hub_split])
    for name in names:
        for suffix in _LOCAL_SUFFIXES:
            if (source / f"{name}{suffix}").is_file():
                return source / f"{name}{suffix}"
    wanted = ", ".join(f"{n}.jsonl" for n in names)
    raise FileNotFoundError(f"no {wanted} (or .parquet/.csv) in {source}")


def download_hint(src: HubSource, split: str) -> str:
    """How to get ``src`` onto a machine without hub access."""
    extra = f", data_files={list(src.data_files)!r}" if src.data_files else ""
    config = f"{src.config!r}, " if src.config else ""
    revision = f", revision={src.revision!r}" if src.revision else ""
    return (
        f'on a machine with hub access run `python -c "import datasets; datasets.load_dataset('
        f"{src.hub_id!r}, {config}split={src.hub_split!r}{extra}{revision}).to_json("
        f"'{src.name}/{split}.jsonl')\"`, copy the {src.name}/ folder here and set "
        f"${src.env_var}=<folder> (or `grpo eval --data_dir {src.name}=<folder>`, or "
        "data_path= in make)"
    )


def load_benchmark_rows(
    src: HubSource, split: str, data_path: str | os.PathLike[str] | None = None
) -> tuple[list[dict[str, object]], str]:
    """Return the raw rows of a benchmark and a description of where they came from.

    ``data_path`` or ``$env_var`` (a file or a folder), else the hub. Offline, the hub is not
    retried: the error says at once what to download and where to put it.
    """
    local = data_path if data_path is not None else os.environ.get(src.env_var)
    if local:
        path = _local_file(Path(local), split, src.hub_split)
        return _read_file(path), f"file {path}"
    offline = not hub_reachable()
    if offline:
        _set_hub_offline()
    import datasets

    kwargs: dict[str, object] = {"split": src.hub_split}
    if src.revision:
        kwargs["revision"] = src.revision
    if src.data_files:
        kwargs["data_files"] = list(src.data_files)
    try:
        loaded = datasets.load_dataset(src.hub_id, src.config, **kwargs)  # type: ignore[arg-type]
    except Exception as exc:
        why = (
            "the Hugging Face hub is not reachable (offline?) and it is not in the local cache"
            if offline
            else f"loading it failed ({type(exc).__name__}: {str(exc)[:200]})"
        )
        raise DataUnavailableError(
            f"{src.name}: cannot load {src.hub_id}"
            f"{f' ({src.config})' if src.config else ''}: {why}. To run offline, "
            f"{download_hint(src, split)}"
        ) from None
    where = f"hub {src.hub_id}" + (f" {src.config}" if src.config else "")
    fingerprint = getattr(loaded, "_fingerprint", None)
    where += f" @{src.revision or 'main'}" + (
        f" (fingerprint {fingerprint})" if fingerprint else ""
    )
    return [dict(r) for r in loaded], where


def integer_text(value: object) -> str:
    r"""Return a gold answer as text; integer-valued floats (``27.0``) as ``27``.

    >>> integer_text(27.0), integer_text("033"), integer_text("\\\\frac{1}{2}")
    ('27', '033', '\\\\frac{1}{2}')
    """
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value).strip()


def first_field(row: Mapping[str, object], keys: Sequence[str], where: str) -> object:
    """Return the first of ``keys`` present (not None) in ``row``; ``ValueError`` names them."""
    for key in keys:
        if row.get(key) is not None:
            return row[key]
    raise ValueError(f"{where}: none of the columns {list(keys)} (columns: {sorted(row)})")


class CompetitionMathEnv(SingleTurnEnv):
    """A fixed set of competition problems with short final answers, graded by the math verifier.

    Args:
        source: where the data lives (hub id, split, local override).
        data_path: a data file or a folder (see the module docstring); default ``$env_var``.
        hub_id / hub_split / revision: another hub copy in the same schema (e.g.
            ``yentinglin/aime_2025``, split ``train``), or a pinned commit.
        instruction: appended to each problem (default: DeepSeek-R1's boxed-answer prompt).
        format / format_weight: ``none``, ``boxed`` or ``think_answer`` format component.
        timeout_s / strict: passed to ``grpo_envs.math.verify``.
        limit: keep only the first ``limit`` problems.
    """

    def __init__(
        self,
        source: HubSource,
        *,
        data_path: str | os.PathLike[str] | None = None,
        hub_id: str | None = None,
        hub_split: str | None = None,
        revision: str | None = None,
        instruction: str = R1_MATH_INSTRUCTION,
        format: str = "none",
        format_weight: float = 0.0,
        timeout_s: float = 5.0,
        strict: bool = False,
        limit: int | None = None,
    ) -> None:
        if hub_id is not None or hub_split is not None or revision is not None:
            from dataclasses import replace

            source = replace(
                source,
                hub_id=hub_id or source.hub_id,
                hub_split=hub_split or source.hub_split,
                revision=revision,
            )
        self.source = source
        self.data_path = data_path
        self.instruction = instruction
        self.limit = limit
        self._where: dict[str, str] = {}
        rubric = Rubric(
            [math_correctness(timeout_s, strict), *extra_components(format, format_weight)]
        )
        super().__init__(
            rubric=rubric,
            reference=lambda sample: reference_answer(format, sample.answer),
            splits=tuple(dict.fromkeys(["test", source.hub_split])),
        )

    def load_split(self, split: str) -> Iterator[Sample]:
        """Yield the problems (every split name is the one set: a benchmark has no train part)."""
        rows, self._where[split] = load_benchmark_rows(self.source, split, self.data_path)
        for index, row in enumerate(rows[: self.limit] if self.limit is not None else rows):
            where = f"{self.source.name} row {index}"
            problem = str(first_field(row, ("problem", "question", "Problem"), where))
            answer = integer_text(first_field(row, ("answer", "Answer"), where))
            ident = row.get("id", row.get("ID", index))
            meta = {k: str(row[k]) for k in ("url", "year") if row.get(k) is not None}
            yield Sample(
                id=f"{self.source.name}/{ident}",
                prompt=user_prompt(f"{problem.strip()}\n\n{self.instruction}".strip()),
                answer=answer,
                metadata=meta,  # type: ignore[arg-type]
            )

    def data_source(self, split: str) -> str:
        """Where the rows of ``split`` came from (hub id and revision, or the file)."""
        self.dataset(split)
        return self._where.get(split, "cached")


AIME24 = HubSource("aime24", "HuggingFaceH4/aime_2024", None, "train", "GRPO_AIME24_DIR")
AIME25 = HubSource("aime25", "math-ai/aime25", None, "test", "GRPO_AIME25_DIR")
AMC23 = HubSource("amc23", "math-ai/amc23", None, "test", "GRPO_AMC23_DIR")


def _factory(source: HubSource) -> Callable[..., CompetitionMathEnv]:
    def make(**kwargs: object) -> CompetitionMathEnv:
        return CompetitionMathEnv(source, **kwargs)  # type: ignore[arg-type]

    make.__doc__ = (
        f"Build {source.name}: hub {source.hub_id} (split {source.hub_split}) or "
        f"${source.env_var}; keyword arguments as ``CompetitionMathEnv``."
    )
    return make


aime24_env = _factory(AIME24)
aime25_env = _factory(AIME25)
amc23_env = _factory(AMC23)
