"""Code extraction from completions: fenced blocks, bare code, HumanEval continuations."""

from __future__ import annotations

import pytest

from grpo_envs.code.extract import (
    ExtractionMethod,
    defined_functions,
    extract_code,
    extract_humaneval_program,
    fenced_blocks,
    parses,
)

PROMPT = (
    'from typing import List\n\n\ndef add(a: int, b: int) -> int:\n    """Add two numbers."""\n'
)


def test_last_fenced_python_block_wins():
    text = (
        "First try:\n```python\ndef f():\n    return 1\n```\n"
        "Better:\n```python\ndef f():\n    return 2\n```\n"
    )
    got = extract_code(text)
    assert got is not None
    assert got.method is ExtractionMethod.FENCED
    assert "return 2" in got.code and "return 1" not in got.code


def test_block_defining_the_entry_point_beats_a_later_usage_example():
    text = (
        "```python\ndef add(a, b):\n    return a + b\n```\nUsage:\n```python\nprint(add(1, 2))\n```"
    )
    got = extract_code(text, entry_point="add")
    assert got is not None and "def add" in got.code
    # Without the entry point the last block is taken.
    last = extract_code(text)
    assert last is not None and last.code.strip() == "print(add(1, 2))"


def test_non_python_fences_are_ignored_and_untagged_ones_accepted():
    text = "```bash\npip install x\n```\n```\nx = 1\n```\n```text\nnot code at all\n```"
    assert fenced_blocks(text) == ["x = 1\n"]
    got = extract_code(text)
    assert got is not None and got.code == "x = 1\n"


def test_unterminated_final_fence_is_taken_when_it_parses():
    text = "Here you go:\n```python\ndef f(x):\n    return x * 2\n"
    got = extract_code(text)
    assert got is not None and "return x * 2" in got.code


def test_fenced_code_that_does_not_parse_is_unparsable_not_guessed():
    assert extract_code("```python\ndef f(:\n    return\n```\ndef g(): pass") is None


def test_reasoning_before_think_end_is_ignored():
    text = (
        "<think>\n```python\ndef f():\n    return 'draft'\n```\n</think>\n"
        "```python\ndef f():\n    return 'final'\n```"
    )
    got = extract_code(text)
    assert got is not None and "final" in got.code and "draft" not in got.code


def test_bare_code_with_prose_around_it():
    text = "Sure! Here is the code:\ndef f(x):\n    return x + 1\n\nThis adds one to x."
    got = extract_code(text)
    assert got is not None
    assert got.method is ExtractionMethod.BARE
    assert got.code == "def f(x):\n    return x + 1\n"


def test_prose_only_and_empty_are_unparsable():
    assert extract_code("I am not sure how to solve this.") is None
    assert extract_code("") is None
    assert extract_code("   \n\n") is None


def test_hostile_inputs_do_not_crash():
    assert extract_code("\x00" * 10) is None
    assert extract_code("(" * 10_000) is None  # parser recursion limits
    assert extract_code("def f(:\n" * 5_000) is None  # long garbage: bounded search


def test_parses_and_defined_functions():
    assert parses("x = 1") and not parses("x = ")
    assert defined_functions(
        "def a(): pass\nasync def b(): pass\nclass C:\n    def m(self): pass"
    ) == {
        "a",
        "b",
    }
    assert defined_functions("def (") == frozenset()


def test_humaneval_continuation_of_the_body():
    got = extract_humaneval_program("    return a + b\n", PROMPT, "add")
    assert got is not None and got.method is ExtractionMethod.CONTINUATION
    assert got.code == PROMPT + "    return a + b\n"


def test_humaneval_full_function_keeps_the_prompt_imports_and_helpers():
    completion = "```python\ndef add(a: int, b: int) -> int:\n    return a + b\n```"
    got = extract_humaneval_program(completion, PROMPT, "add")
    assert got is not None and got.method is ExtractionMethod.FULL_FUNCTION
    assert got.code.startswith("from typing import List")
    assert got.code.rstrip().endswith("return a + b")
    ns: dict[str, object] = {}
    exec(got.code, ns)  # trusted test code: our own strings
    assert ns["add"](2, 3) == 5  # type: ignore[operator]


def test_humaneval_fenced_body_only():
    got = extract_humaneval_program("```python\n    return a + b\n```", PROMPT, "add")
    assert got is not None and got.method is ExtractionMethod.CONTINUATION
    assert got.code == PROMPT + "    return a + b\n"


def test_humaneval_continuation_keeps_top_level_code_after_the_body():
    # A body, then top-level code wrapping the finished function: run verbatim after the prompt
    # (not cut down to the last code-looking fragment, which would lose the body).
    completion = (
        "    return a + b\n\n\n_orig_add = add\n\n\n"
        "def add(a, b):\n    return _orig_add(a, b) + 1\n"
    )
    got = extract_humaneval_program(completion, PROMPT, "add")
    assert got is not None and got.code == PROMPT + completion
    ns: dict[str, object] = {}
    exec(got.code, ns)  # trusted test code: our own strings
    assert ns["add"](2, 3) == 6  # type: ignore[operator]


def test_humaneval_bare_full_function_and_garbage():
    got = extract_humaneval_program("def add(a, b):\n    return b + a", PROMPT, "add")
    assert got is not None and got.method is ExtractionMethod.FULL_FUNCTION
    assert extract_humaneval_program("no idea, sorry", PROMPT, "add") is None
    assert extract_humaneval_program("", PROMPT, "add") is None


@pytest.mark.parametrize("tag", ["python", "py", "Python3", ""])
def test_accepted_fence_tags(tag):
    got = extract_code(f"```{tag}\ny = 2\n```")
    assert got is not None and got.code == "y = 2\n"
