"""``code/stdio-v0``: competitive-programming tasks judged on stdin/stdout pairs, in the sandbox.

Rows come from a jsonl (or parquet) file the user provides, in any of these shapes:

- this project's: ``{"id", "prompt", "tests": [{"input", "output"}, ...], "solution"?,
  "language"?}`` (``language``: one of ``sandbox.Language``, default the env's ``language=``,
  itself Python by default; ``grpo_envs.data.CPP_STDIO`` is a C++ set in this shape)
- LiveCodeBench: ``question_content``, ``public_test_cases`` / ``private_test_cases`` (JSON, or
  LiveCodeBench's base64+zlib+pickle encoding of that JSON), ``testtype`` ``stdin`` only
- CodeContests: ``description``, ``public_tests`` / ``private_tests`` / ``generated_tests`` as
  ``{"input": [...], "output": [...]}``, ``solutions`` (Python 3 ones used as the reference)
- APPS: ``question``, ``input_output`` (JSON ``{"inputs", "outputs"}``), ``solutions`` (JSON list)

The sandbox compares outputs (trailing whitespace per line normalized, every line counted, so a
prefix of the expected output fails).
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import pickle
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import datasets

from grpo_envs.code.data import load_local, resolve_files
from grpo_envs.code.extract import ExtractedCode, extract_code
from grpo_envs.code.languages import (
    DISPLAY_NAMES,
    FENCES,
    PYTHON,
    check_language,
    reference_fence,
    require_toolchain,
    stdio_instruction,
)
from grpo_envs.code.scoring import CodeConfig, CodeEnvironment, CodeTask
from grpo_envs.types import JSONValue, Message, Sample

if TYPE_CHECKING:
    from sandbox import Sandbox

DEFAULT_INSTRUCTION = stdio_instruction(PYTHON)
"""The Python prompt; a task in another language gets ``stdio_instruction(language)``."""
_STATEMENT_KEYS = ("prompt", "question", "question_content", "description", "problem")
_ID_KEYS = ("id", "question_id", "problem_id", "task_id", "name")
_CODECONTESTS_TEST_KEYS = ("public_tests", "private_tests", "generated_tests")
_CODECONTESTS_PYTHON3 = 3  # CodeContests' `Language` enum: 3 is PYTHON3
#: CodeContests' ``Language`` enum value of the references usable per task language.
_CODECONTESTS_LANGUAGES = {PYTHON: _CODECONTESTS_PYTHON3, "cpp": 2, "java": 4}


@dataclass(frozen=True)
class StdioProblem:
    """One task in the normalized form: statement, (stdin, expected stdout) pairs, reference."""

    id: str
    statement: str
    tests: tuple[tuple[str, str], ...]
    reference: str | None = None
    language: str = PYTHON
    """The language of the reference and of the programs asked for (``sandbox.Language``)."""


class _NoGlobalsUnpickler(pickle.Unpickler):
    """Unpickles plain data only: any class or function reference is refused (no code runs)."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a data file")


def _decode_json_field(value: object, what: str) -> object:
    """Decode a field holding JSON text, decoded JSON, or LiveCodeBench's compressed form.

    LiveCodeBench stores private tests as base64(zlib(pickle(json_text))); the pickle holds only a
    string, so it is read with an unpickler that refuses every global (safe on untrusted files).
    """
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        pass
    try:
        raw = zlib.decompress(base64.b64decode(value, validate=True))
        text = _NoGlobalsUnpickler(io.BytesIO(raw)).load()
        if not isinstance(text, str):
            raise ValueError(f"expected a JSON string inside, found {type(text).__name__}")
        return json.loads(text)
    except (binascii.Error, zlib.error, pickle.UnpicklingError, ValueError, EOFError) as exc:
        raise ValueError(f"{what} is neither JSON nor LiveCodeBench's encoded form: {exc}") from exc


def _text(value: object) -> str:
    # APPS sometimes stores an output as a list of lines.
    if isinstance(value, list):
        return "\n".join(str(v) for v in value)
    return str(value)


def _pairs_from_row(row: Mapping[str, object], where: str) -> list[tuple[str, str]]:
    pairs: list[tuple[str, str]] = []
    if "tests" in row and row["tests"] is not None:
        tests = _decode_json_field(row["tests"], f"{where}: 'tests'")
        if not isinstance(tests, list):
            raise ValueError(f"{where}: 'tests' must be a list of {{input, output}} objects")
        for t in tests:
            if not isinstance(t, Mapping) or "input" not in t or "output" not in t:
                raise ValueError(f"{where}: each test needs 'input' and 'output', got {t!r:.80}")
            pairs.append((_text(t["input"]), _text(t["output"])))
    for key in ("public_test_cases", "private_test_cases"):  # LiveCodeBench
        if row.get(key):
            cases = _decode_json_field(row[key], f"{where}: {key!r}")
            if not isinstance(cases, list):
                raise ValueError(f"{where}: {key!r} must decode to a list")
            for case in cases:
                if not isinstance(case, Mapping):
                    raise ValueError(f"{where}: {key!r} holds a non-object test")
                if case.get("testtype", "stdin") == "stdin":  # "functional" ones are call-based
                    pairs.append((_text(case["input"]), _text(case["output"])))
    for key in _CODECONTESTS_TEST_KEYS:
        block = row.get(key)
        if isinstance(block, Mapping):
            inputs, outputs = block.get("input") or [], block.get("output") or []
            if not isinstance(inputs, list) or not isinstance(outputs, list):
                raise ValueError(f"{where}: {key!r} must hold 'input' and 'output' lists")
            if len(inputs) != len(outputs):
                raise ValueError(
                    f"{where}: {key!r} has {len(inputs)} inputs, {len(outputs)} outputs"
                )
            pairs.extend((_text(i), _text(o)) for i, o in zip(inputs, outputs))
    if row.get("input_output"):  # APPS
        io_spec = _decode_json_field(row["input_output"], f"{where}: 'input_output'")
        if not isinstance(io_spec, Mapping):
            raise ValueError(f"{where}: 'input_output' must decode to an object")
        if io_spec.get("fn_name"):
            raise ValueError(f"{where}: a call-based APPS task (fn_name), not stdin/stdout")
        inputs, outputs = io_spec.get("inputs") or [], io_spec.get("outputs") or []
        if (
            not isinstance(inputs, list)
            or not isinstance(outputs, list)
            or len(inputs) != len(outputs)
        ):
            raise ValueError(f"{where}: 'input_output' needs equal-length inputs/outputs lists")
        pairs.extend((_text(i), _text(o)) for i, o in zip(inputs, outputs))
    return pairs


def _reference(row: Mapping[str, object], language: str = PYTHON) -> str | None:
    for key in ("solution", "reference", "canonical_solution"):
        if isinstance(row.get(key), str) and row[key]:
            return str(row[key])
    solutions = row.get("solutions")
    if isinstance(solutions, Mapping):  # CodeContests
        wanted = _CODECONTESTS_LANGUAGES.get(language)
        langs, codes = solutions.get("language") or [], solutions.get("solution") or []
        for lang, code in zip(langs, codes):  # type: ignore[call-overload]
            if lang == wanted and isinstance(code, str):
                return code
        return None
    if language != PYTHON:
        return None  # APPS' solutions are Python
    if isinstance(solutions, str) and solutions:  # APPS: a JSON list
        try:
            decoded = json.loads(solutions)
        except json.JSONDecodeError:
            return None
        if isinstance(decoded, list) and decoded and isinstance(decoded[0], str):
            return decoded[0]
    return None


def parse_stdio_row(row: Mapping[str, object], index: int = 0) -> StdioProblem:
    """Normalize one row of any supported shape; ValueError says what is missing."""
    ident = next((str(row[k]) for k in _ID_KEYS if row.get(k) not in (None, "")), str(index))
    where = f"row {index} (id {ident!r})"
    statement = next((row[k] for k in _STATEMENT_KEYS if isinstance(row.get(k), str)), None)
    if not isinstance(statement, str) or not statement.strip():
        raise ValueError(f"{where}: no problem statement; expected one of {_STATEMENT_KEYS}")
    pairs = _pairs_from_row(row, where)
    if not pairs:
        raise ValueError(
            f"{where}: no stdin/stdout tests; expected 'tests' (list of {{input, output}}), "
            "LiveCodeBench's *_test_cases, CodeContests' *_tests or APPS' input_output"
        )
    language = row.get("language") or PYTHON
    try:
        language = check_language(language)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
    return StdioProblem(ident, statement, tuple(pairs), _reference(row, language), language)


class StdioEnv(CodeEnvironment):
    """Stdin/stdout tasks from the user's file(s), scored in the sandbox.

    Args:
        config: scoring options (``CodeConfig``); keyword overrides are accepted too.
        data_files: a path (the ``test`` split) or ``{split: path}``; jsonl, json or parquet.
            Needed for ``dataset`` only: samples carry their tests, so scoring works without.
        max_tests: keep at most this many tests per problem (None: all); bounds scoring time for
            datasets with hundreds of generated tests per problem.
        instruction: the prompt template, with ``{statement}`` (and optionally ``{language}``,
            the language's display name, and ``{fence}``); default: the task language's own
            (``grpo_envs.code.languages.stdio_instruction``).
        language: the language of rows that do not name one (a ``language`` column): one of
            ``sandbox.Language`` (python, cpp, java, nodejs, rust, bash). A task whose toolchain
            is not installed is a clear error when it is built.
        sandbox: a sandbox to share (not closed by this environment).
    """

    def __init__(
        self,
        config: CodeConfig | None = None,
        *,
        data_files: str | Path | Mapping[str, str | Path] | None = None,
        max_tests: int | None = None,
        instruction: str | None = None,
        language: str = PYTHON,
        sandbox: Sandbox | None = None,
        **overrides: Any,
    ) -> None:
        super().__init__(config, sandbox=sandbox, **overrides)
        if max_tests is not None and max_tests < 1:
            raise ValueError(f"max_tests must be >= 1 or None, got {max_tests}")
        # Scoring needs no files (a sample carries its tests): verl's compute_score builds the env
        # from its id alone. Only ``dataset`` needs them.
        self.files = resolve_files(data_files) if data_files is not None else None
        self.splits: tuple[str, ...] = tuple(self.files) if self.files else ("test",)
        self.max_tests = max_tests
        self.instruction = instruction
        self.language = check_language(language)

    def dataset(self, split: str = "test") -> datasets.Dataset:
        """Return the problems of ``split``; ``answer`` is the reference program or ''."""
        if self.files is None:
            raise ValueError(
                "code/stdio-v0 reads problems from your file: make it with data_files=PATH (a "
                "jsonl of problems with stdin/stdout tests; grpo_envs.envs.stdio lists the shapes)"
            )
        raw = load_local(self.files, split)
        rows = [
            self.sample(
                parse_stdio_row(r if r.get("language") else {**r, "language": self.language}, i)
            ).to_row()
            for i, r in enumerate(raw)
        ]
        return datasets.Dataset.from_list(rows)

    def sample(self, problem: StdioProblem) -> Sample:
        """Turn a normalized problem into a ``Sample``; tests live in ``metadata['tests']``."""
        tests = problem.tests[: self.max_tests] if self.max_tests else problem.tests
        metadata: dict[str, JSONValue] = {"tests": [[i, o] for i, o in tests]}
        language = problem.language
        if language != PYTHON:  # Python samples stay exactly as they were
            metadata["language"] = language
        instruction = self.instruction or stdio_instruction(language)
        text = instruction.format(
            statement=problem.statement.strip(), language=DISPLAY_NAMES[language],
            fence=FENCES[language],
        )  # fmt: skip
        return Sample(
            id=problem.id,
            prompt=(Message("user", text),),
            answer=problem.reference or "",
            env_id=self.env_id,
            metadata=metadata,
        )

    def task(self, sample: Sample) -> CodeTask:
        """One ``IOTest`` per (input, output) pair."""
        from sandbox import IOTest

        tests = sample.metadata.get("tests")
        if not isinstance(tests, list) or not tests:
            raise ValueError(f"sample {sample.id!r} lacks metadata['tests']")
        io_tests = []
        for i, pair in enumerate(tests):
            if not isinstance(pair, list) or len(pair) != 2:
                raise ValueError(f"sample {sample.id!r}: test {i} is not an [input, output] pair")
            io_tests.append(
                IOTest(stdin=str(pair[0]), expected_stdout=str(pair[1]), name=f"io[{i}]")
            )
        language = require_toolchain(_language_of(sample))
        return CodeTask(
            key=sample.id,
            tests=tuple(io_tests),
            reference=sample.answer or None,
            language=language,
        )

    def extract(self, completion: str, task: CodeTask, sample: Sample) -> ExtractedCode | None:
        """Take the last fenced block of the task's language (Python: or bare code)."""
        return extract_code(completion, language=task.language)

    def reference_completion(self, sample: Sample) -> str | None:
        """Return the reference solution as a fenced block of its language."""
        return reference_fence(sample.answer, _language_of(sample)) if sample.answer else None


def _language_of(sample: Sample) -> str:
    """Return the language of a sample (``metadata['language']``; Python when absent)."""
    return check_language(sample.metadata.get("language", PYTHON))
