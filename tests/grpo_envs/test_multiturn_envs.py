"""The built-in multi-turn environments: code with execution feedback, math with a Python tool."""

import json
from pathlib import Path

import pytest

import grpo_envs
from grpo_envs.checker import check_env
from grpo_envs.code.scoring import CodeTask
from grpo_envs.envs.multiturn import split_tests
from grpo_envs.episode import EpisodeEnd, ToolStatus, episodic, run_episode, scripted
from grpo_envs.types import Outcome, Sample

FIXTURES = Path(__file__).resolve().parent / "fixtures"
STDIO = FIXTURES / "code" / "stdio.jsonl"
#: Each code base, built from the offline fixtures the single-turn code tests use.
CODE_BASES = {
    "code/mbpp-v0": {"data_files": str(FIXTURES / "code" / "mbpp_full.jsonl")},
    "code/stdio-v0": {"data_files": str(STDIO)},
    "code/dataset-v0": {
        "path": str(FIXTURES / "dataset" / "code_problems.jsonl"),
        "question": "task",
        "solution": "reference",
        "id": "name",
        "test_fraction": 0.34,
    },
}


def test_split_keeps_a_hidden_test_and_hides_a_lone_one():
    task = CodeTask("k", tests=("a", "b", "c"))  # type: ignore[arg-type]
    assert split_tests(task, 1) == (("a",), ("b", "c"))
    assert split_tests(task, 9) == (("a", "b"), ("c",))
    assert split_tests(CodeTask("k", tests=("a",)), 1) == ((), ("a",))  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def humaneval():
    return grpo_envs.make("code/feedback-v0", max_turns=3, workers=2)


def test_visible_failures_come_back_and_the_hidden_tests_decide_the_reward(humaneval):
    row = humaneval.dataset("test")[0]  # has_close_elements; check[0] expects True
    sample = Sample.from_row(row)
    wrong = "```python\ndef has_close_elements(numbers, threshold):\n    return False\n```"
    result = run_episode(humaneval, row, scripted([wrong, humaneval.reference_completion(sample)]))
    assert result.end is EpisodeEnd.DONE and len(result.state.turns) == 2
    feedback = result.state.observations[0].messages[0].content
    assert "failed 1 of 1 visible tests" in feedback and "assert candidate(" in feedback
    assert result.state.tools[0].status is ToolStatus.ERROR
    assert result.score.outcome is Outcome.PASSED and result.score.reward == 1.0
    # Passing the visible test alone ends the episode, but the hidden tests give no reward.
    overfit = "```python\ndef has_close_elements(numbers, threshold):\n    return True\n```"
    result = run_episode(humaneval, row, scripted([overfit]))
    assert result.end is EpisodeEnd.DONE and len(result.state.turns) == 1
    assert result.score.outcome is Outcome.FAILED and result.score.reward == 0.0
    assert result.score.details["total"] == len(humaneval.code.task(sample).tests) - 1


def test_an_answer_without_code_is_told_so_and_the_episode_is_cut_at_max_turns(humaneval):
    row = humaneval.dataset("test")[1]
    result = run_episode(humaneval, row, scripted(["I cannot do this."]))
    assert result.end is EpisodeEnd.MAX_TURNS and len(result.state.turns) == 3
    assert "No Python code found" in result.state.observations[0].text
    assert result.score.outcome is Outcome.UNPARSABLE and result.score.details["turns"] == 3


def test_feedback_over_stdio_shows_the_visible_input_and_expected_output():
    env = grpo_envs.make("code/feedback-v0", base="code/stdio-v0", data_files=str(STDIO), workers=2)
    row = env.dataset("test")[0]  # sum-two
    result = run_episode(env, row, scripted(["```python\nprint(input())\n```"]))
    assert "input '1 2\\n', expected output '3\\n'" in result.state.observations[0].text
    assert result.end is EpisodeEnd.MAX_TURNS and result.score.reward == 0.0


def test_the_tool_instructions_join_an_existing_system_prompt():
    # Without a system prompt in the base, the instructions become the system message.
    bare = grpo_envs.make(
        "math/python-tool-v0", base="format/think-answer-v0", train_size=2, test_size=2
    )
    bare_prompt = bare.dataset("train")[0]["prompt"]
    assert [m["role"] for m in bare_prompt] == ["system", "user"]
    instructions = bare_prompt[0]["content"]
    assert instructions.startswith("You can run Python")
    # With one, they join it: one system message, the instructions, a blank line, the base's.
    table = {
        "path": str(FIXTURES / "dataset" / "questions.jsonl"),
        "question": "problem",
        "answer": "solution",
        "id": "qid",
        "system_prompt": "Think first.",
    }
    plain = grpo_envs.make("math/dataset-v0", **table).dataset("train")[0]["prompt"]
    env = grpo_envs.make("math/python-tool-v0", base="math/dataset-v0", **table)
    prompt = env.dataset("train")[0]["prompt"]
    assert plain[0] == {"role": "system", "content": "Think first."}  # the base has one
    assert prompt[0] == {"role": "system", "content": f"{instructions}\n\nThink first."}
    assert prompt[1:] == plain[1:]


@pytest.mark.parametrize("base", sorted(CODE_BASES))
def test_feedback_over_every_code_base_passes_check_env_and_its_reference_passes(base):
    env = grpo_envs.make("code/feedback-v0", base=base, workers=2, **CODE_BASES[base])
    check_env(env, n_samples=1)
    split = env.splits[-1]
    row = env.dataset(split)[0]
    reference = env.reference_completion(Sample.from_row(row))
    result = run_episode(env, row, scripted(["no code", reference]))
    assert result.score.correct and result.end is EpisodeEnd.DONE and len(result.state.turns) == 2


def test_both_pass_check_env():
    check_env(grpo_envs.make("code/feedback-v0", workers=2), n_samples=1)
    check_env(grpo_envs.make("math/python-tool-v0", train_size=4, test_size=2), n_samples=2)


@pytest.mark.parametrize("tool_format", ["hermes", "code_block"])
def test_math_with_a_python_tool_is_verified_as_the_base_env_verifies(tool_format):
    env = grpo_envs.make(
        "math/python-tool-v0",
        base="math/add2-v0",
        train_size=4,
        test_size=2,
        tool_format=tool_format,
    )
    row = env.dataset("train")[0]
    a, b = (int(n) for n in row["prompt"][-1]["content"].split("?")[0].split()[-3::2])
    code = f"x = {a}\nx + {b}"
    call = (
        f"<tool_call>{json.dumps({'name': 'python', 'arguments': {'code': code}})}</tool_call>"
        if tool_format == "hermes"
        else f"```python\n{code}\n```"
    )
    result = run_episode(env, row, scripted([call, "So \\boxed{" + row["answer"] + "}."]))
    assert result.end is EpisodeEnd.DONE and result.score.correct
    assert row["answer"] in result.state.observations[0].text
    assert "python" in row["prompt"][0]["content"]  # the tool is explained in the system prompt
    base = grpo_envs.make("math/add2-v0", train_size=4, test_size=2)
    assert env.score("\\boxed{1}", row).reward == base.score("\\boxed{1}", row).reward == 0.0


def test_math_with_a_python_tool_bounds_a_reply_by_the_episodes_tool_time():
    env = grpo_envs.make(
        "math/python-tool-v0", train_size=2, test_size=2, tool_timeout_s=1.5, max_tool_s=1.5
    )
    episodes = episodic(env)
    call = json.dumps({"name": "python", "arguments": {"code": "import time\ntime.sleep(1.0)"}})
    # Four calls of 1 s in one reply (4 s unbounded) against 1.5 s of tool time.
    state = episodes.step(
        episodes.start(env.dataset("train")[0]), f"<tool_call>{call}</tool_call>" * 4
    )
    statuses = [t.status for t in state.tools]
    assert statuses[0] is ToolStatus.OK and statuses[-1] is ToolStatus.REFUSED, state.tools
    assert ToolStatus.TIMEOUT in statuses
    assert 1.5 <= state.tool_s <= 1.5 + 0.8  # the kill's latency, stretched under load
    assert state.end is EpisodeEnd.TOOL_TIME
