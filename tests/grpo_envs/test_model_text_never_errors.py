"""Model text never yields a scoring failure: property tests over every parser and scorer.

A completion, however malformed (huge numbers, deep nesting, invalid Unicode, NULs, megabytes,
inputs that make regexes backtrack, any tool-call shape), must come back as a typed judgement
(correct, wrong, unparsable, timeout, ...), never as an exception, a hang, or an ``error`` /
``sandbox_error`` outcome: those make the trainer drop the item from its group's baseline and
the loss (``grpo_train.collect.score_failures``), so a policy could learn to escape a negative
reward by breaking the scorer.

Each property runs a modest, derandomized number of examples; the strategies mix valid answer
shapes with hostile ones, and the targeted regressions below pin the concrete holes.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import grpo_envs
from grpo_envs.code.extract import extract_code, extract_humaneval_program, fenced_blocks, parses
from grpo_envs.envs._expr import ExpressionError, safe_eval
from grpo_envs.envs.multiturn import answer_feedback, as_number
from grpo_envs.episode import EpisodeEnd, EpisodeState, Step, ToolRecord, ToolStatus
from grpo_envs.format import answer_tag, boxed_present, think_answer_soft, think_answer_strict
from grpo_envs.math import extract_answer, verify, verify_batch
from grpo_envs.math.equivalence import FastComparator, NeedsSymbolic, compare
from grpo_envs.math.normalize import AnswerRejected, parse_answer
from grpo_envs.tools import (
    MalformedCall,
    ToolCall,
    ToolFormat,
    _refused,
    parse_calls,
    parse_code_blocks,
    parse_hermes,
    python_tool_step,
)
from grpo_envs.types import Outcome, Sample
from grpo_train.collect.score_failures import scoring_failed

FIXTURES = Path(__file__).resolve().parent / "fixtures"
BENCH = FIXTURES / "benchmarks"

#: Deterministic, bounded property runs (CI must not flake, and the set must stay fast).
BOUNDED = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.large_base_example],
)

# --- strategies -------------------------------------------------------------------------------

#: Any code point, surrogates and control characters included.
any_char = st.characters(exclude_categories=())
any_text = st.text(any_char, max_size=60)

#: Pieces of valid answers and the markup that parsers look for.
FRAGMENTS = (
    "\\boxed{",
    "\\fbox{",
    "}",
    "{",
    "\\frac{",
    "\\dfrac",
    "\\sqrt{",
    "^{",
    "^",
    "_",
    "\\text{",
    "\\left(",
    "\\right)",
    "\\begin{pmatrix}",
    "\\end{pmatrix}",
    "&",
    "\\\\",
    "\\infty",
    "\\pi",
    "\\%",
    "!",
    "(A)",
    " B) ",
    "x",
    "42",
    "1/2",
    "0.5",
    "-3",
    "1,000",
    "(1,2)",
    "[",
    "]",
    "(",
    ")",
    "=",
    "\\le",
    " or ",
    "<answer>",
    "</answer>",
    "<think>",
    "</think>",
    "#### ",
    "The answer is ",
    "Final Answer: ",
    "$",
    "$$",
    "\\(",
    "\\)",
    "`",
    "```",
    "```python\n",
    "~~~\n",
    "def f(x):\n    return x\n",
    "<tool_call>",
    "</tool_call>",
    '{"name": "python", "arguments": {"code": "1+1"}}',
    "1e999999",
    "10^{10^{10}}",
    "9^{9^{9^{9}}}",
    "NaN",
    "Infinity",
    "\x00",
    "\ud800",
    "\udfff",
    "\n",
    " ",
    "hours",
    "1:30",
)
fragment = st.sampled_from(FRAGMENTS)
huge_number = st.integers(4_000, 6_000).map(lambda n: "9" * n)
huge_exponent = st.sampled_from(["1e999999", "1e-999999", "1.5e99999999", "10^{99999999}"])
OPENERS = ("[", "{", "(", "\\boxed{", "\\frac{1}{", "\\sqrt{", "-", "2^", "\\text{", "<answer>")


@st.composite
def nested(draw: st.DrawFn) -> str:
    """An opener repeated up to 100k times, closed or not."""
    opener = draw(st.sampled_from(OPENERS))
    depth = draw(st.integers(1, 100_000 // len(opener)))
    closer = {"[": "]", "(": ")", "-": "", "2^": "", "<answer>": "</answer>"}.get(opener, "}")
    closed = draw(st.booleans())
    return opener * depth + "1" + (closer * depth if closed else "")


@st.composite
def repeated(draw: st.DrawFn) -> str:
    """A fragment repeated thousands of times (the inputs that make regexes backtrack)."""
    piece = draw(st.one_of(fragment, st.text(any_char, min_size=1, max_size=3)))
    return piece * draw(st.integers(1_000, 60_000 // len(piece)))


#: Completions: valid shapes, junk, and the hostile shapes above, mixed.
completions = st.lists(
    st.one_of(
        fragment, fragment, any_text, huge_number, huge_exponent, nested(), repeated(), st.just("")
    ),
    max_size=6,
).map("".join)

# JSON for tool calls: any shape, with the values that break decoders (huge ints, NaN, deep lists).
json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(any_char, max_size=20),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(any_char, max_size=8), inner)
    ),
    max_leaves=12,
)


#: JSON literals that break decoders: past the int-string limit, float overflow, non-standard
#: constants, nesting deeper than the decoder's stack.
HOSTILE_LITERALS = st.one_of(
    st.integers(4_301, 6_000).map(lambda n: "7" * n),
    st.integers(4_301, 6_000).map(lambda n: "-" + "3" * n),
    st.sampled_from(["1e999999", "-1e999999", "NaN", "Infinity", "-Infinity", "1E400"]),
    st.integers(1_000, 100_000).map(lambda n: "[" * n + "]" * n),
    st.integers(1_000, 100_000).map(lambda n: "[" * n),
)


@st.composite
def call_bodies(draw: st.DrawFn) -> str:
    """A ``<tool_call>`` body: a call of any shape, one with a hostile literal spliced in, text."""
    shape = draw(st.sampled_from(["call", "string_args", "value", "hostile", "hostile", "text"]))
    if shape == "text":
        return draw(completions)
    if shape == "value":
        return json.dumps(draw(json_values))
    name = draw(st.one_of(st.just("python"), json_values))
    arguments = draw(
        st.one_of(
            st.fixed_dictionaries({"code": st.one_of(st.text(any_char, max_size=20), json_values)}),
            json_values,
        )
    )
    if shape == "hostile":
        where = draw(st.sampled_from(["argument", "code", "name", "arguments", "string_args"]))
        literal = draw(HOSTILE_LITERALS)
        marker = r'"\u0000HOSTILE"'
        if where == "argument":
            body = json.dumps({"name": "python", "arguments": {"code": "1", "n": "\0HOSTILE"}})
        elif where == "code":
            body = json.dumps({"name": "python", "arguments": {"code": "\0HOSTILE"}})
        elif where == "name":
            body = json.dumps({"name": "\0HOSTILE", "arguments": {"code": "1"}})
        elif where == "arguments":
            body = json.dumps({"name": "python", "arguments": "\0HOSTILE"})
        else:  # inside a JSON string holding the arguments
            inner = json.dumps({"code": "1", "n": "\0HOSTILE"}).replace(marker, literal)
            return json.dumps({"name": "python", "arguments": inner})
        return body.replace(marker, literal)
    if shape == "string_args":
        arguments = json.dumps(arguments)
    return json.dumps({"name": name, "arguments": arguments})


tool_turns = st.lists(
    st.one_of(
        call_bodies().map(lambda b: f"<tool_call>{b}</tool_call>"),
        call_bodies().map(lambda b: f"<tool_call>{b}</tool_call>"),
        call_bodies().map(lambda b: f"```python\n{b}\n```"),
        completions,
    ),
    min_size=1,
    max_size=5,
).map("\n".join)


# --- tool calls -------------------------------------------------------------------------------


def _check_calls(calls: list, max_calls: int) -> None:
    assert len(calls) <= max_calls + 1
    for call in calls:
        assert isinstance(call, ToolCall | MalformedCall)
        if isinstance(call, ToolCall):
            assert isinstance(call.name, str) and call.name
            assert isinstance(call.arguments, dict)


@BOUNDED
@given(tool_turns, st.integers(1, 8))
def test_tool_call_parsers_return_typed_calls_for_any_turn(turn, max_calls):
    for fmt in ToolFormat:
        calls = parse_calls(turn, fmt, max_calls=max_calls)
        _check_calls(calls, max_calls)
        for index, call in enumerate(calls):
            record = _refused(call, index, max_calls, None)
            if record is None:  # runnable: a python call whose code is a string
                assert isinstance(call, ToolCall) and call.name == "python"
                assert isinstance(call.arguments["code"], str)
            elif index >= max_calls:  # the parsers' marker for the calls past the limit
                assert record.status is ToolStatus.REFUSED
            else:
                assert record.status is ToolStatus.MALFORMED


@BOUNDED
@given(st.one_of(completions, tool_turns))
def test_hermes_and_code_block_parsers_never_raise(text):
    _check_calls(parse_hermes(text), 8)
    _check_calls(parse_code_blocks(text), 8)


class _RecordingTool:
    """Stands in for ``PythonTool`` so the step's parsing is tested without the sandbox."""

    def __init__(self) -> None:
        self.codes: list[str] = []

    def run(self, history: list[str], code: str, *, timeout_s: float | None = None) -> ToolRecord:
        self.codes.append(code)
        return ToolRecord("python", code, ToolStatus.OK, 0.0, "ok")


@BOUNDED
@given(tool_turns)
def test_python_tool_step_answers_every_turn_with_a_step(turn):
    sample = Sample("s", (), "42")
    for fmt in ToolFormat:
        tool = _RecordingTool()
        step = python_tool_step(tool, fmt)  # type: ignore[arg-type]
        result = step(EpisodeState(sample), turn)
        assert isinstance(result, Step)
        assert all(isinstance(code, str) for code in tool.codes)
        if result.observation is not None:
            assert len(result.tools) >= len(tool.codes)


@pytest.fixture(scope="module")
def python_tool_env():
    env = grpo_envs.make("math/python-tool-v0", train_size=4, test_size=2)
    yield env
    grpo_envs.wrappers.shutdown_scoring_pool()


@BOUNDED
@given(tool_turns)
def test_python_tool_episode_never_ends_in_an_environment_error(python_tool_env, turn):
    # The env's own step driver with the sandbox swapped for a recording tool (parsing only).
    inner = python_tool_env.unwrapped
    original = inner.step_fn
    inner.step_fn = python_tool_step(_RecordingTool(), ToolFormat.HERMES)  # type: ignore[arg-type]
    try:
        state = python_tool_env.start(python_tool_env.dataset("test")[0])
        state = python_tool_env.step(state, turn)
    finally:
        inner.step_fn = original
    assert state.end is not EpisodeEnd.ENV_ERROR, state.error
    assert not scoring_failed(python_tool_env.score_episode(state))


# --- math -------------------------------------------------------------------------------------

GOLDS = ("42", "\\frac{1}{2}", "x + 1", "(1, 2)", "A", "90 minutes", "#### 1,000", "\\sqrt{2}")


@BOUNDED
@given(completions, st.booleans())
def test_math_extraction_and_parsing_raise_only_their_typed_refusals(text, strict):
    extracted = extract_answer(text, strict=strict)
    assert extracted is None or isinstance(extracted, str)
    for candidate in (text[:300], extracted or ""):
        try:
            node = parse_answer(candidate)
        except AnswerRejected:
            continue
        with contextlib.suppress(NeedsSymbolic):
            compare(parse_answer("42"), node, FastComparator())


@settings(BOUNDED, max_examples=30)
@given(st.sampled_from(GOLDS), completions, st.booleans())
def test_verify_never_blames_the_scorer_for_model_text(gold, text, strict):
    result = verify(gold, text, timeout_s=2.0, strict=strict)
    assert result.outcome is not Outcome.ERROR, result.detail
    assert result.correct == (result.outcome is Outcome.CORRECT)


@settings(BOUNDED, max_examples=10)
@given(st.lists(completions, min_size=1, max_size=4))
def test_verify_batch_never_blames_the_scorer_for_model_text(texts):
    golds = [GOLDS[i % len(GOLDS)] for i in range(len(texts))]
    for result in verify_batch(golds, texts, timeout_s=2.0, workers=2):
        assert result.outcome is not Outcome.ERROR, result.detail


# --- code -------------------------------------------------------------------------------------

HUMANEVAL_PROMPT = 'def add(a, b):\n    """Return a + b."""\n'


@BOUNDED
@given(completions)
def test_code_extraction_returns_parsable_code_or_none(text):
    assert all(isinstance(b, str) for b in fenced_blocks(text))
    extracted = extract_code(text, "add")
    assert extracted is None or parses(extracted.code)
    program = extract_humaneval_program(text, HUMANEVAL_PROMPT, "add")
    assert program is None or parses(program.code)


# --- format rewards and expression parsing ----------------------------------------------------


@BOUNDED
@given(completions)
def test_format_rewards_are_zero_or_one_for_any_text(text):
    for reward in (think_answer_strict, think_answer_soft, boxed_present):
        assert reward(text) in (0.0, 1.0)
    tag = answer_tag(text)
    assert tag is None or isinstance(tag, str)


@BOUNDED
@given(
    st.one_of(completions, st.text(st.sampled_from("0123456789+-*/() {}=\\times"), max_size=300))
)
def test_countdown_expressions_evaluate_or_are_refused(text):
    try:
        evaluated = safe_eval(text)
    except ExpressionError:
        return
    assert evaluated.numbers


@BOUNDED
@given(completions, completions)
def test_feedback_on_a_wrong_answer_is_text_for_any_answer(extracted, earlier):
    for hint in ("direction", "none"):
        feedback = answer_feedback(extracted, "95", [earlier], hint=hint)
        # A retry request that never gives the gold answer away (unless the model wrote it).
        assert feedback.endswith("Try again, with the final answer in \\boxed{}.")
        if "95" not in extracted + earlier:
            assert "95" not in feedback


# --- every quick single-turn environment, through make().score --------------------------------

SMALL = {"train_size": 8, "test_size": 4}
#: Single-turn environments that score offline in milliseconds (the code ones run a sandbox and
#: are covered by the targeted cases below).
ENVS: dict[str, dict[str, object]] = {
    "math/arithmetic-v0": SMALL,
    "math/add2-v0": SMALL,
    "math/countdown-v0": SMALL,
    "format/think-answer-v0": SMALL,
    "rg/reasoning-gym-v0": SMALL,
    "rg/prime_factorization-v0": SMALL,
    "math/gsm8k-v0": {"data_path": str(FIXTURES / "gsm8k"), "limit": 4},
    "math/math500-v0": {"data_path": str(FIXTURES / "math500")},
    "math/aime24-v0": {"data_path": str(BENCH / "aime24")},
    "math/amc23-v0": {"data_path": str(BENCH / "amc23")},
    "science/gpqa-diamond-v0": {"data_path": str(BENCH / "gpqa_diamond")},
    "math/dataset-v0": {
        "path": str(FIXTURES / "dataset" / "questions.jsonl"),
        "question": "problem",
        "answer": "solution",
        "id": "qid",
    },
    "math/add2-feedback-v0": {"train_size": 4, "test_size": 4},
}


@pytest.fixture(scope="module")
def made_envs():
    envs = {env_id: grpo_envs.make(env_id, **kwargs) for env_id, kwargs in ENVS.items()}
    for env in envs.values():
        env.score_timeout_s = 10.0
    yield {env_id: (env, env.dataset("test")[0]) for env_id, env in envs.items()}
    grpo_envs.wrappers.shutdown_scoring_pool()


@settings(BOUNDED, max_examples=12)
@given(completions)
def test_every_quick_env_scores_any_completion_without_a_scoring_failure(made_envs, text):
    for env_id, (env, sample) in made_envs.items():
        score = env.score(text, sample)
        assert not scoring_failed(score), (env_id, score)
        assert score.outcome is not Outcome.ERROR, (env_id, score)


@settings(BOUNDED, max_examples=10)
@given(completions)
def test_math_feedback_episode_never_ends_in_an_environment_error(made_envs, text):
    env, sample = made_envs["math/add2-feedback-v0"]
    state = env.step(env.start(sample), text)
    if not state.done:
        state = env.step(state, text + " \\boxed{1e999999999}")
    assert state.end is not EpisodeEnd.ENV_ERROR, state.error
    assert not scoring_failed(env.score_episode(state))


# --- targeted regressions: each hole found, pinned -------------------------------------------


def test_a_tool_call_with_a_4400_digit_number_is_a_malformed_call_not_a_crash():
    turn = '<tool_call>{"name": "python", "arguments": {"code": "1", "n": ' + "4" * 4400
    turn += "}}</tool_call>"
    (call,) = parse_hermes(turn)
    assert isinstance(call, MalformedCall) and "not JSON" in call.reason
    string_args = '{\\"code\\": ' + "4" * 4400 + "}"
    (call,) = parse_hermes(
        '<tool_call>{"name": "python", "arguments": "' + string_args + '"}</tool_call>'
    )
    assert isinstance(call, MalformedCall)


def test_many_unclosed_tool_call_tags_parse_in_linear_time():
    # The lazy regex took 212 s on this (each tag scanned to the end of the text).
    start = time.perf_counter()
    calls = parse_hermes("<tool_call>" * 50_000)
    assert time.perf_counter() - start < 10.0
    assert [c.reason for c in calls] == ["a <tool_call> tag was not closed with </tool_call>"]  # type: ignore[union-attr]


def test_tag_scanning_keeps_the_regex_semantics():
    text = (
        "</tool_call><tool_call>{}</tool_call> x <tool_call>a<tool_call>b</tool_call> <tool_call>"
    )
    calls = parse_hermes(text)
    assert [type(c).__name__ for c in calls] == ["MalformedCall"] * 3
    assert calls[1].raw == "a<tool_call>b"  # type: ignore[union-attr]
    assert "not closed" in calls[2].reason  # type: ignore[union-attr]
    nine = '<tool_call>{"name": "python", "arguments": {"code": "1"}}</tool_call>' * 9
    capped = parse_hermes(nine + "<tool_call>", max_calls=8)
    assert len(capped) == 9 and "only 8 tool calls" in capped[-1].reason  # type: ignore[union-attr]


def test_an_answer_sympy_fails_on_is_wrong_not_a_scoring_error():
    # sympy raised ValueError (int-string conversion limit) inside the worker: was ERROR.
    result = verify("42", "\\boxed{\\sin(10^{100000})}", timeout_s=10.0)
    assert result.outcome is Outcome.WRONG
    assert "could not" in result.detail or "failed" in result.detail


def test_a_completion_that_breaks_extraction_is_wrong_not_a_scoring_error(monkeypatch):
    # The package's ``verify`` function shadows its module of the same name.
    verify_module = importlib.import_module("grpo_envs.math.verify")

    def broken(*_args, **_kwargs):
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(verify_module, "extract_answer", broken)
    result = verify_module.verify("42", "anything")
    assert result.outcome is Outcome.WRONG and "RecursionError" in result.detail
    # The gold's side stays an ERROR: a bad gold is the data's fault.
    assert verify_module.verify("", "\\boxed{1}").outcome is Outcome.ERROR


def test_feedback_reads_no_exponent_so_a_huge_one_costs_nothing():
    # Fraction("1e999999999") builds a billion-digit integer: the step function hung.
    start = time.perf_counter()
    assert as_number("1e999999999") is None and as_number("-1E99999999") is None
    feedback = answer_feedback("1e999999999", "95", [])
    assert time.perf_counter() - start < 5.0
    assert feedback.startswith("1e999999999 is not right.")
    assert as_number("2.5") == as_number("5/2")


def test_bare_code_search_is_bounded_on_junk_that_fails_only_at_its_end():
    # 400 lines of an unclosed bracket: every candidate failed at its end; 118 s for 1.3 MB.
    line = "    " + " + ".join(["1"] * 800) + " +\n"
    text = "def f():\n    x = (\n" + line * 397
    start = time.perf_counter()
    assert extract_code(text) is None
    assert time.perf_counter() - start < 10.0


def test_a_long_line_of_tildes_is_scanned_for_fences_in_linear_time():
    # The fence and its info string both matched tildes: 45 s of backtracking for 40,000.
    start = time.perf_counter()
    assert fenced_blocks("~" * 40_000) == [] and extract_code("~" * 40_000) is None
    assert time.perf_counter() - start < 10.0
    assert fenced_blocks("~~~~ python\nprint(1)\n~~~~\n") == ["print(1)\n"]


@pytest.mark.parametrize(
    "completion",
    [
        "```python\ndef add(a, b):\n    return '\ud800'\n```",
        "```python\ndef add(a, b):\n    return a + b\x00\n```",
        "```python\ndef add(a, b):\n    return " + "9" * 5000 + "\n```",
        "```python\ndef add(a, b):\n    return " + "(" * 5000 + "1" + ")" * 5000 + "\n```",
        "```python\ndef add(a, b):\n    return 1e999999\n```",
    ],
    ids=["surrogate", "nul", "huge-literal", "deep-nesting", "huge-float"],
)
def test_hostile_code_is_judged_not_a_scoring_failure(completion):
    env = grpo_envs.make(
        "code/mbpp-v0", data_files=str(FIXTURES / "code" / "mbpp_full.jsonl"), workers=1
    )
    try:
        sample = env.dataset("test")[0]
        score = env.score(completion, sample)
    finally:
        env.close()
    assert not scoring_failed(score), score


@pytest.fixture(scope="module")
def code_feedback_env():
    return grpo_envs.make("code/feedback-v0", max_turns=2, workers=2)


@settings(BOUNDED, max_examples=8)
@given(completions)
def test_code_feedback_episode_never_ends_in_an_environment_error(code_feedback_env, text):
    env = code_feedback_env
    state = env.step(env.start(env.dataset("test")[0]), text)
    assert state.end is not EpisodeEnd.ENV_ERROR, state.error
    assert not scoring_failed(env.score_episode(state))


@pytest.mark.parametrize("answer", ["-", "1e999999", "9" * 5000, "\ud800", "[[", "nan"])
def test_a_task_scorer_that_raises_on_the_answer_makes_it_wrong(answer):
    # reasoning-gym's prime_factorization scorer runs int() on every factor: it raised
    # ValueError on these answers, and each came back as an error outcome.
    env = grpo_envs.make("rg/prime_factorization-v0", train_size=2, test_size=2)
    score = env.unwrapped.score(f"<answer>{answer}</answer>", env.dataset("test")[0])
    assert score.outcome is Outcome.WRONG, score
    assert "scorer failed" in str(score.details["reason"])


@pytest.mark.parametrize(
    "turn",
    [
        '<tool_call>{"name": "python", "arguments": {"code": "x = \\"\\ud800\\"\\nx"}}</tool_call>',
        '<tool_call>{"name": "python", "arguments": {"code": "print(\'\\u0000\')"}}</tool_call>',
        '<tool_call>{"name": "python", "arguments": {"code": "10 ** 5000"}}</tool_call>',
    ],
    ids=["lone-surrogate", "nul", "past-int-limit"],
)
def test_hostile_code_in_the_sandboxed_python_tool_is_a_typed_tool_error(python_tool_env, turn):
    env = python_tool_env
    state = env.step(env.start(env.dataset("test")[0]), turn)
    assert state.end is None, state.error
    assert [t.status for t in state.tools] == [ToolStatus.ERROR]
