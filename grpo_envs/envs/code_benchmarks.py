r"""Code benchmarks with their full test sets: LiveCodeBench, HumanEval+ and MBPP+, in the sandbox.

| id | hub dataset | local copy |
| --- | --- | --- |
| ``code/livecodebench-v0`` | ``livecodebench/code_generation_lite`` | ``$GRPO_LIVECODEBENCH_DIR`` |
| ``code/humaneval-plus-v0`` | ``evalplus/humanevalplus`` (164) | ``$GRPO_HUMANEVAL_PLUS_DIR`` |
| ``code/mbpp-plus-v0`` | ``evalplus/mbppplus`` (378) | ``$GRPO_MBPP_PLUS_DIR`` |

Scoring is the code environments' (``grpo_envs.code``): trusted tests, the program in the
sandbox, a timeout or memory kill is the candidate's failure (outcome ``timeout``/``memory``,
reward 0), never a scoring error. Per-test time limits: EvalPlus's convention,
``max(4 s, 4 x the reference solution's runtime)`` (``CodeConfig``), for HumanEval+/MBPP+, whose
rows carry a reference; LiveCodeBench has no reference solutions, so each test gets
``default_test_timeout_s`` = 6 s, the per-test timeout of LiveCodeBench's own runner.

LiveCodeBench (Jain et al. 2024, arXiv 2403.07974): problems from LeetCode, AtCoder and
Codeforces with their release date. ``version_tag`` picks the release: ``release_v1`` ..
``release_v6`` are cumulative (``release_v5`` = every problem up to v5), ``v1`` .. ``v6`` only the
problems added in that release; ``start_date``/``end_date`` (ISO dates, inclusive) keep problems
whose ``contest_date`` is in the window, e.g. the one after a model's training cut-off. Problems
with ``starter_code`` (LeetCode) are functional: each test calls the method the starter code names
(``metadata.func_name``) with the test's JSON arguments, one per line, and compares the result
with the JSON output; the others are stdin/stdout programs.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import io
import json
import os
import pickle
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import datasets

from grpo_envs.code import (
    CodeConfig,
    CodeEnvironment,
    CodeTask,
    ExtractedCode,
    extract_code,
)
from grpo_envs.envs.benchmarks import HubSource, first_field, load_benchmark_rows
from grpo_envs.envs.humaneval import HumanEvalEnv
from grpo_envs.envs.mbpp import MBPPEnv
from grpo_envs.types import JSONValue, Message, Sample

LIVECODEBENCH = HubSource(
    "livecodebench", "livecodebench/code_generation_lite", None, "train", "GRPO_LIVECODEBENCH_DIR"
)
HUMANEVAL_PLUS = HubSource(
    "humaneval_plus", "evalplus/humanevalplus", None, "test", "GRPO_HUMANEVAL_PLUS_DIR"
)
MBPP_PLUS = HubSource("mbpp_plus", "evalplus/mbppplus", None, "test", "GRPO_MBPP_PLUS_DIR")

#: LiveCodeBench's release files, in order: release_vN holds the first N.
LCB_RELEASE_FILES = ("test.jsonl", "test2.jsonl", "test3.jsonl", "test4.jsonl", "test5.jsonl",
                     "test6.jsonl")  # fmt: skip
#: LiveCodeBench's runner gives each test 6 seconds.
LCB_TEST_TIMEOUT_S = 6.0
LCB_STDIN_INSTRUCTION = (
    "You will be given a competitive programming problem. Write a correct Python 3 program that "
    "reads the input from standard input and writes the answer to standard output (do not test "
    "it on the sample inputs yourself).\n\nQuestion: {question}\n\n"
    "Reply with the program in a single ```python code block."
)
LCB_STARTER_INSTRUCTION = (
    "You will be given a programming problem. Complete the starter code below into a correct "
    "solution.\n\nQuestion: {question}\n\n```python\n{starter_code}\n```\n\n"
    "Reply with the complete solution in a single ```python code block."
)
#: Imported before a functional candidate, as LeetCode's judge does (its type hints use List...).
_FUNCTIONAL_HEADER = (
    "from typing import *\nimport collections, heapq, bisect, itertools, functools, math, string, "
    "re\nfrom collections import *\nfrom itertools import *\nfrom functools import *\n"
    "from heapq import *\nfrom bisect import *\nfrom math import *\n"
)
_ENTRY = "_lcb_entry"


def lcb_files(version_tag: str) -> tuple[str, ...]:
    """Return the release files of a ``version_tag``.

    >>> lcb_files("release_v2")
    ('test.jsonl', 'test2.jsonl')
    >>> lcb_files("v3")
    ('test3.jsonl',)
    >>> lcb_files("v4_v5")
    ('test4.jsonl', 'test5.jsonl')
    """
    tag = version_tag.strip().lower()
    count = len(LCB_RELEASE_FILES)
    if tag == "release_latest":
        return LCB_RELEASE_FILES
    first, _, last = tag.partition("_v")
    if first.startswith("v") and first[1:].isdigit() and last.isdigit():
        lo, hi = int(first[1:]), int(last)
        if 1 <= lo <= hi <= count:
            return LCB_RELEASE_FILES[lo - 1 : hi]
    for prefix, cumulative in (("release_v", True), ("v", False)):
        number = tag.removeprefix(prefix)
        if tag.startswith(prefix) and number.isdigit() and 1 <= int(number) <= count:
            i = int(number)
            return LCB_RELEASE_FILES[:i] if cumulative else (LCB_RELEASE_FILES[i - 1],)
    raise ValueError(
        f"unknown LiveCodeBench version_tag {version_tag!r}; use release_v1..release_v{count} "
        f"(cumulative), v1..v{count} (one release), vA_vB (releases A to B) or release_latest"
    )


class _PlainUnpickler(pickle.Unpickler):
    """Loads plain data only: a class or function reference in the file is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a data file")


def decode_test_cases(value: object, where: str) -> list[dict[str, object]]:
    """LiveCodeBench's test cases: JSON text, or base64(zlib(pickle(JSON text))) (private ones).

    The pickle holds a string only, so it is read with an unpickler that refuses every global.
    """
    if value is None or value == "":
        return []
    decoded: object = value
    if isinstance(value, str):
        try:
            decoded = json.loads(value)
        except json.JSONDecodeError:
            try:
                raw = zlib.decompress(base64.b64decode(value, validate=True))
                decoded = json.loads(_PlainUnpickler(io.BytesIO(raw)).load())
            except (binascii.Error, zlib.error, pickle.UnpicklingError, ValueError, TypeError,
                    EOFError) as err:  # fmt: skip
                raise ValueError(
                    f"{where}: test cases are neither JSON nor LCB's encoding"
                ) from err
    if not isinstance(decoded, list) or not all(isinstance(c, Mapping) for c in decoded):
        raise ValueError(f"{where}: test cases must be a list of {{input, output}} objects")
    return [dict(c) for c in decoded]


def functional_test_source(args_text: str, expected_text: str) -> str:
    """Trusted test code calling the candidate with LCB's one-JSON-value-per-line arguments."""
    return (
        "import json\n"
        f"_args = [json.loads(_l) for _l in {args_text!r}.split('\\n') if _l.strip()]\n"
        "_out = candidate(*_args)\n"
        "if isinstance(_out, tuple):\n    _out = list(_out)\n"
        f"assert _out == json.loads({expected_text!r}), 'wrong answer'\n"
    )


class LiveCodeBenchEnv(CodeEnvironment):
    """LiveCodeBench code generation, stdin/stdout and functional tests run in the sandbox.

    Args:
        version_tag: ``release_v1``..``release_v6`` (cumulative), ``v1``..``v6``, ``vA_vB``,
            ``release_latest``.
        start_date / end_date: keep problems with ``contest_date`` in ``[start, end]`` (ISO dates).
        data_path: a folder with the release files (``huggingface-cli download
            livecodebench/code_generation_lite --repo-type dataset``) or one jsonl file; default
            ``$GRPO_LIVECODEBENCH_DIR``, else the hub.
        max_tests: keep at most this many tests per problem (None: all, the benchmark's rule).
        config / overrides: scoring options (``CodeConfig``); the per-test default is 6 s.
    """

    splits = ("test",)

    def __init__(
        self,
        config: CodeConfig | None = None,
        *,
        version_tag: str = "release_v5",
        start_date: str | None = None,
        end_date: str | None = None,
        data_path: str | os.PathLike[str] | None = None,
        revision: str | None = None,
        max_tests: int | None = None,
        limit: int | None = None,
        **overrides: Any,
    ) -> None:
        base = config or CodeConfig(default_test_timeout_s=LCB_TEST_TIMEOUT_S, max_job_s=120.0)
        super().__init__(base, **overrides)
        self.files = lcb_files(version_tag)
        self.version_tag = version_tag
        self.window = (start_date, end_date)
        self.source = dataclasses.replace(LIVECODEBENCH, data_files=self.files, revision=revision)
        self.data_path, self.max_tests, self.limit = data_path, max_tests, limit
        self._where = ""
        self._built: datasets.Dataset | None = None  # decoding the private tests is slow: once

    def _rows(self) -> list[dict[str, object]]:
        local = (
            self.data_path if self.data_path is not None else os.environ.get(LIVECODEBENCH.env_var)
        )
        if local and Path(local).is_dir() and any((Path(local) / f).is_file() for f in self.files):
            missing = [f for f in self.files if not (Path(local) / f).is_file()]
            if missing:
                raise FileNotFoundError(
                    f"{local} lacks {', '.join(missing)} of LiveCodeBench {self.version_tag}; "
                    "download them from the hub repository livecodebench/code_generation_lite or "
                    "pick a version_tag whose files are there"
                )
            rows: list[dict[str, object]] = []
            for name in self.files:
                rows += load_benchmark_rows(self.source, "test", Path(local) / name)[0]
            self._where = f"folder {local} ({', '.join(self.files)})"
            return rows
        rows, self._where = load_benchmark_rows(self.source, "test", local or None)
        return rows

    def dataset(self, split: str = "test") -> datasets.Dataset:
        """Return the problems of the release and date window, tests decoded."""
        if split not in self.splits:
            raise ValueError(f"LiveCodeBench has only the split 'test', not {split!r}")
        if self._built is not None:
            return self._built
        start, end = self.window
        samples = []
        for index, row in enumerate(self._rows()):
            date = str(row.get("contest_date") or "")[:10]
            if (start and date < start) or (end and date > end):
                continue
            samples.append(self.sample(row, index).to_row())
            if self.limit is not None and len(samples) >= self.limit:
                break
        self._built = datasets.Dataset.from_list(samples)
        return self._built

    def sample(self, row: Mapping[str, object], index: int = 0) -> Sample:
        """One LiveCodeBench row as a ``Sample`` (tests and call style in ``metadata``)."""
        where = f"livecodebench row {index}"
        question = str(first_field(row, ("question_content",), where)).strip()
        starter = str(row.get("starter_code") or "")
        raw_meta = row.get("metadata") or "{}"
        meta = json.loads(raw_meta) if isinstance(raw_meta, str) else dict(raw_meta)  # type: ignore[call-overload]
        cases = decode_test_cases(row.get("public_test_cases"), where)
        cases += decode_test_cases(row.get("private_test_cases"), where)
        if self.max_tests is not None:
            cases = cases[: self.max_tests]
        if not cases:
            raise ValueError(f"{where}: no test cases")
        functional = cases[0].get("testtype") == "functional"
        func_name = meta.get("func_name") if functional else None
        if functional and not func_name:
            raise ValueError(f"{where}: functional tests but no metadata.func_name")
        if functional:
            text = LCB_STARTER_INSTRUCTION.format(question=question, starter_code=starter.strip())
        else:
            text = LCB_STDIN_INSTRUCTION.format(question=question)
        metadata: dict[str, JSONValue] = {
            "tests": [[str(c["input"]), str(c["output"])] for c in cases],
            "func_name": func_name,
            "class_based": bool(functional and "class Solution" in starter),
            "platform": str(row.get("platform") or ""),
            "contest_date": str(row.get("contest_date") or ""),
            "difficulty": str(row.get("difficulty") or ""),
        }
        return Sample(
            id=str(row.get("question_id") or f"lcb-{index}"),
            prompt=(Message("user", text),),
            answer="",
            env_id=self.env_id,
            metadata=metadata,
        )

    def task(self, sample: Sample) -> CodeTask:
        """``IOTest`` per case, or a ``CallTest`` per case calling the named method."""
        from sandbox import CallTest, IOTest

        tests = sample.metadata.get("tests")
        if not isinstance(tests, list) or not tests:
            raise ValueError(f"sample {sample.id!r} lacks metadata['tests']")
        pairs = [(str(t[0]), str(t[1])) for t in tests if isinstance(t, list) and len(t) == 2]
        if len(pairs) != len(tests):
            raise ValueError(f"sample {sample.id!r}: a test is not an [input, output] pair")
        if not sample.metadata.get("func_name"):
            io_tests = tuple(
                IOTest(stdin=i, expected_stdout=o, name=f"io[{n}]")
                for n, (i, o) in enumerate(pairs)
            )
            return CodeTask(key=sample.id, tests=io_tests)
        calls = tuple(
            CallTest(functional_test_source(i, o), name=f"call[{n}]")
            for n, (i, o) in enumerate(pairs)
        )
        return CodeTask(key=sample.id, tests=calls, entry_point=_ENTRY)

    def extract(self, completion: str, task: CodeTask, sample: Sample) -> ExtractedCode | None:
        """Take the last Python block; functional tasks get the imports and a call wrapper added."""
        func = sample.metadata.get("func_name")
        found = extract_code(completion, None if sample.metadata.get("class_based") else str(func))
        if found is None or not func:
            return found
        if sample.metadata.get("class_based"):
            call = f"def {_ENTRY}(*args):\n    return Solution().{func}(*args)\n"
        else:
            call = f"def {_ENTRY}(*args):\n    return {func}(*args)\n"
        code = f"{_FUNCTIONAL_HEADER}\n{found.code}\n\n{call}"
        return dataclasses.replace(found, code=code)

    def data_source(self, split: str) -> str:
        """Where the rows came from, with the version tag and date window."""
        if not self._where:
            self._rows()
        start, end = self.window
        return f"{self._where} version_tag={self.version_tag} window=[{start}, {end}]"


class HumanEvalPlusEnv(HumanEvalEnv):
    """HumanEval+ (EvalPlus: HumanEval's 164 problems with about 80x more tests).

    Scored like ``code/humaneval-v0``: the extra tests are the loop over ``inputs``/``results`` in
    each problem's ``check``, run in the trusted verdict process against the sandboxed program.
    ``data_path``: a file or folder in the hub's columns; default ``$GRPO_HUMANEVAL_PLUS_DIR``.
    """

    def __init__(
        self,
        config: CodeConfig | None = None,
        *,
        data_path: str | os.PathLike[str] | None = None,
        revision: str | None = None,
        limit: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(config, **kwargs)
        self.source = dataclasses.replace(HUMANEVAL_PLUS, revision=revision)
        self.data_path, self.limit = data_path, limit
        self._where = ""

    @property
    def problems(self) -> list[dict[str, str]]:
        """The HumanEval+ records (task_id, prompt, canonical_solution, test, entry_point)."""
        if self._problems is None:
            rows, self._where = load_benchmark_rows(self.source, "test", self.data_path)
            rows = rows[: self.limit] if self.limit is not None else rows
            self._problems = [{k: str(v) for k, v in r.items()} for r in rows]
        return self._problems

    def data_source(self, split: str) -> str:
        """Where the rows came from."""
        _ = self.problems
        return self._where or "cached"


class MBPPPlusEnv(MBPPEnv):
    """MBPP+ (EvalPlus v0.2: 378 MBPP problems with about 35x more tests).

    The base asserts (``test_list``) and the EvalPlus test script (``test``: the ``inputs`` /
    ``results`` loop) are all trusted tests; binary reward needs every one to pass.
    ``data_path``: a file or folder in the hub's columns; default ``$GRPO_MBPP_PLUS_DIR``.
    """

    def __init__(
        self,
        config: CodeConfig | None = None,
        *,
        data_path: str | os.PathLike[str] | None = None,
        revision: str | None = None,
        limit: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(config, **kwargs)
        self.splits = ("test",)
        self.source = dataclasses.replace(MBPP_PLUS, revision=revision)
        self.data_path, self.limit = data_path, limit
        self._where = ""
        self._built: datasets.Dataset | None = None

    def dataset(self, split: str = "test") -> datasets.Dataset:
        """Return the problems; ``answer`` is the reference solution."""
        if split not in self.splits:
            raise ValueError(f"MBPP+ has only the split 'test', not {split!r}")
        if self._built is None:
            rows, self._where = load_benchmark_rows(self.source, split, self.data_path)
            rows = rows[: self.limit] if self.limit is not None else rows
            self._built = datasets.Dataset.from_list([self.sample(r).to_row() for r in rows])
        return self._built

    def sample(self, row: Mapping[str, object]) -> Sample:
        """Build an MBPP+ row's sample: MBPP's, plus the EvalPlus test script as one more test."""
        base = super().sample(row)
        plus = row.get("test")
        if not isinstance(plus, str) or not plus.strip():
            raise ValueError(f"MBPP+ row {row.get('task_id')!r} has no 'test' script")
        tests = base.metadata.get("tests")
        metadata = {**base.metadata, "tests": [*(tests if isinstance(tests, list) else []), plus]}
        return dataclasses.replace(base, id=f"mbpp_plus/{row.get('task_id')}", metadata=metadata)

    def data_source(self, split: str) -> str:
        """Where the rows came from."""
        if not self._where:
            self.dataset(split)
        return self._where
