"""``code/mbpp-v0``: Mostly Basic Python Problems, scored in the sandbox.

Reads Hugging Face ``google-research-datasets/mbpp`` (configs ``full`` and ``sanitized``) or local
files in either config's shape. Each ``assert`` of ``test_list`` is one trusted test; the function
the asserts call is the entry point, served by the untrusted program through the sandbox's proxy.
"""

from __future__ import annotations

import ast
import builtins
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import datasets

from grpo_envs.code.data import load_hub, load_local, resolve_files
from grpo_envs.code.extract import ExtractedCode, defined_functions, extract_code
from grpo_envs.code.scoring import CodeConfig, CodeEnvironment, CodeTask
from grpo_envs.types import JSONValue, Message, Sample

if TYPE_CHECKING:
    from sandbox import Sandbox

HUB_REPO = "google-research-datasets/mbpp"
CONFIGS = ("full", "sanitized")
#: ``{text}`` is the task, ``{tests}`` the example asserts shown (the MBPP paper's prompt shape).
DEFAULT_INSTRUCTION = (
    "You are an expert Python programmer, and here is your task: {text}\n"
    "Your code should pass these tests:\n\n{tests}\n\n"
    "Reply with your solution in a single ```python code block."
)


def entry_point_of(tests: Sequence[str], code: str = "") -> str:
    """Find the function the MBPP asserts test: the first called name the reference defines.

    Falls back to the first called name that is not a builtin. Raises ValueError if none.
    """
    defined = defined_functions(code)
    called: list[str] = []
    for test in tests:
        for node in ast.walk(ast.parse(test)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                called.append(node.func.id)
    for name in called:
        if name in defined:
            return name
    for name in called:
        if not hasattr(builtins, name):
            return name
    raise ValueError(f"cannot tell which function these tests call: {list(tests)[:2]}")


def _str_list(row: Mapping[str, object], key: str) -> list[str]:
    value = row.get(key) or []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"MBPP row {row.get('task_id')!r}: {key!r} must be a list of strings")
    return value


class MBPPEnv(CodeEnvironment):
    """MBPP (``full``: 974 problems; ``sanitized``: 427), scored in the sandbox.

    Args:
        config: scoring options (``CodeConfig``); keyword overrides are accepted too.
        name: the hub config, ``full`` or ``sanitized``.
        data_files: local file(s) instead of the hub: a path (the ``test`` split) or
            ``{split: path}``; rows in the hub's shape of either config.
        prompt_tests: how many of the test asserts the prompt shows (they name the function).
        challenge_tests: also score with ``challenge_test_list`` (``full`` config only).
        instruction: the prompt template, with ``{text}`` and ``{tests}``.
        sandbox: a sandbox to share (not closed by this environment).
    """

    splits: tuple[str, ...] = ("train", "test", "validation", "prompt")

    def __init__(
        self,
        config: CodeConfig | None = None,
        *,
        name: str = "full",
        data_files: str | Path | Mapping[str, str | Path] | None = None,
        prompt_tests: int = 1,
        challenge_tests: bool = False,
        instruction: str = DEFAULT_INSTRUCTION,
        sandbox: Sandbox | None = None,
        **overrides: Any,
    ) -> None:
        super().__init__(config, sandbox=sandbox, **overrides)
        if name not in CONFIGS:
            raise ValueError(f"MBPP config must be one of {CONFIGS}, got {name!r}")
        if prompt_tests < 0:
            raise ValueError(f"prompt_tests must be >= 0, got {prompt_tests}")
        self.name = name
        self.files = resolve_files(data_files) if data_files is not None else None
        if self.files is not None:
            self.splits = tuple(self.files)
        self.prompt_tests = prompt_tests
        self.challenge_tests = challenge_tests
        self.instruction = instruction

    def dataset(self, split: str = "test") -> datasets.Dataset:
        """Return the rows of ``split`` (``answer`` is the reference solution)."""
        if self.files is not None:
            raw = load_local(self.files, split)  # its error names the files and the fix
        elif split not in self.splits:
            raise ValueError(f"MBPP has the splits {self.splits}, not {split!r}")
        else:
            raw = load_hub(HUB_REPO, self.name, split)
        return datasets.Dataset.from_list([self.sample(row).to_row() for row in raw])

    def sample(self, row: Mapping[str, object]) -> Sample:
        """One MBPP row (either config's shape) as a ``Sample``."""
        text = row.get("text") or row.get("prompt")
        code = row.get("code")
        if not isinstance(text, str) or not isinstance(code, str):
            raise ValueError(
                f"MBPP row {row.get('task_id')!r} needs 'text' (full) or 'prompt' (sanitized) and "
                "'code' strings"
            )
        tests = _str_list(row, "test_list")
        if self.challenge_tests:
            tests += _str_list(row, "challenge_test_list")
        if not tests:
            raise ValueError(f"MBPP row {row.get('task_id')!r} has no tests")
        setup_code = row.get("test_setup_code") or ""
        setup = "\n".join([*_str_list(row, "test_imports"), str(setup_code)]).strip()
        shown = "\n".join(tests[: self.prompt_tests])
        metadata: dict[str, JSONValue] = {
            "task_id": str(row.get("task_id")),
            "entry_point": entry_point_of(tests, code),
            "tests": list(tests),
            "setup": setup,
        }
        return Sample(
            id=f"mbpp/{row.get('task_id')}",
            prompt=(Message("user", self.instruction.format(text=text.strip(), tests=shown)),),
            answer=code,
            env_id=self.env_id,
            metadata=metadata,
        )

    def task(self, sample: Sample) -> CodeTask:
        """One trusted ``CallTest`` per assert; setup: the row's imports / setup code."""
        from sandbox import CallTest

        meta = sample.metadata
        tests = meta.get("tests")
        entry = meta.get("entry_point")
        setup = meta.get("setup") or ""
        if not isinstance(tests, list) or not tests or not all(isinstance(t, str) for t in tests):
            raise ValueError(f"sample {sample.id!r} lacks metadata['tests'] (a list of asserts)")
        if not isinstance(entry, str) or not entry or not isinstance(setup, str):
            raise ValueError(f"sample {sample.id!r} lacks metadata['entry_point']")
        return CodeTask(
            key=sample.id,
            tests=tuple(CallTest(str(t), name=f"test[{i}]") for i, t in enumerate(tests)),
            entry_point=entry,
            setup=setup,
            reference=sample.answer or None,
        )

    def extract(self, completion: str, task: CodeTask, sample: Sample) -> ExtractedCode | None:
        """Take the last fenced block (preferring one defining the function) or bare code."""
        return extract_code(completion, task.entry_point)
