import os
import time

import pytest

from grpo_envs.base import SingleTurnEnv, completion_text, render_template
from grpo_envs.rubric import RewardComponent, Rubric, StripParser
from grpo_envs.types import Message, Outcome, Sample


class EchoEnv(SingleTurnEnv):
    """Correct iff the completion equals the answer; 'sleep'/'crash'/'raise' misbehave."""

    splits = ("train",)

    def __init__(self):
        super().__init__()

        def judge(ctx):
            if ctx.parsed == "sleep":
                time.sleep(60)
            if ctx.parsed == "crash":
                os._exit(3)
            if ctx.parsed == "raise":
                raise RuntimeError("judge bug")
            return float(ctx.parsed == ctx.sample.answer)

        self.rubric = Rubric([RewardComponent("correct", 1.0, judge)], parser=StripParser())

    def load_split(self, split):
        for i in range(3):
            yield Sample(f"{split}-{i}", (Message("user", f"say {i}"),), str(i), metadata={"i": i})


def test_dataset_rows_follow_the_sample_schema():
    env = EchoEnv()
    env.env_id = "test/echo-v0"
    env.system_prompt = "be brief"
    ds = env.dataset("train")
    assert ds.column_names == ["id", "prompt", "answer", "env_id", "metadata"]
    row = ds[1]
    assert row["prompt"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "say 1"},
    ]
    assert (row["answer"], row["env_id"], row["metadata"]) == ("1", "test/echo-v0", '{"i": 1}')
    with pytest.raises(ValueError, match="no split 'test'"):
        env.dataset("test")


def test_score_accepts_text_and_chat_and_refuses_other_types():
    env = EchoEnv()
    row = env.dataset("train")[2]
    assert env.score("2", row).reward == 1.0
    assert env.score([{"role": "assistant", "content": " 2 "}], row).correct
    assert env.score({"role": "assistant", "content": "1"}, row).outcome is Outcome.WRONG
    for bad in (None, 5, [{"role": "assistant"}], b"2"):
        assert env.score(bad, row).outcome is Outcome.UNPARSABLE
    assert env.score("2", {"prompt": "x"}).outcome is Outcome.ERROR  # row lacks id/answer
    assert env.score("raise", row).outcome is Outcome.ERROR


def test_completion_text():
    assert completion_text("a") == "a"
    assert (
        completion_text(
            [
                {"role": "assistant", "content": "a"},
                {"role": "tool", "content": "t"},
                {"role": "assistant", "content": "b"},
            ]
        )
        == "ab"
    )
    assert completion_text([{"role": "assistant", "content": 3}]) is None
    assert completion_text(None) is None


@pytest.fixture
def registry(monkeypatch):
    from grpo_envs import registration as reg

    monkeypatch.setattr(reg, "registry", dict(reg.registry))
    return reg


def test_make_bounds_scoring_time_and_survives_crashes(registry):
    """make() puts EchoEnv (an unbounded judge) in time-limited worker processes."""
    import grpo_envs
    from grpo_envs.wrappers import ScoreGuard, TimeLimit

    registry.register("test/echo-v0", EchoEnv)
    env = grpo_envs.make("test/echo-v0")
    assert isinstance(env, ScoreGuard) and isinstance(env.env, TimeLimit)
    assert isinstance(env.unwrapped, EchoEnv) and env.unwrapped.env_id == "test/echo-v0"
    rows = list(env.dataset("train"))
    completions = ["0", "sleep", "2", "crash", "raise", "1", "9"]
    samples = [rows[0], rows[1], rows[2], rows[0], rows[0], rows[1], rows[0]]
    start = time.monotonic()
    # 12 s: room for a worker to start on a loaded machine; the sleeping item takes 60 s unbounded.
    scores = env.score_batch(completions, samples, workers=2, timeout_s=12.0)
    elapsed = time.monotonic() - start
    assert [s.outcome for s in scores] == [
        Outcome.CORRECT,
        Outcome.TIMEOUT,
        Outcome.CORRECT,
        Outcome.ERROR,
        Outcome.ERROR,
        Outcome.CORRECT,
        Outcome.WRONG,
    ]
    assert "worker failed" in scores[3].details["reason"]
    assert elapsed < 50, elapsed  # the sleeping item cost ~12 s, not 60
    # In-process mode (workers=0) agrees on well-behaved items.
    inline = env.score_batch(["0", "2", "x"], rows[:1] + rows[2:3] + rows[:1], workers=0)
    assert [s.reward for s in inline] == [1.0, 1.0, 0.0]


def test_score_batch_length_mismatch_is_a_caller_error():
    env = EchoEnv()
    with pytest.raises(ValueError, match="2 completions for 1 samples"):
        env.score_batch(["a", "b"], [env.dataset("train")[0]])
    assert env.score_batch([], []) == []


def test_batch_matches_score_in_process():
    env = EchoEnv()
    rows = list(env.dataset("train"))
    completions = ["0", None, "2", "raise"]
    batch = env.score_batch(completions, [rows[0], rows[1], rows[2], rows[0]])
    assert [s.outcome for s in batch] == [
        Outcome.CORRECT,
        Outcome.UNPARSABLE,
        Outcome.CORRECT,
        Outcome.ERROR,
    ]
    assert batch[0] == env.score("0", rows[0])


def test_render_template_leaves_unknown_braces():
    text = render_template(r"Q: {question} ({level}) \boxed{} {N}", {"question": "1+1", "level": 2})
    assert text == r"Q: 1+1 (2) \boxed{} {N}"


def _double(n: int) -> dict[str, object]:
    return {"question": f"What is 2 * {n}?", "answer": str(2 * n), "id": f"q{n}", "hint": "even"}


def double_env(size: int = 10) -> SingleTurnEnv:
    """A composed environment (no subclass): rows, a rubric, a system prompt, a template."""
    from grpo_envs.envs._common import integer_correctness
    from grpo_envs.format import boxed_component

    return SingleTurnEnv(
        {
            "train": [_double(n) for n in range(size)],
            "test": lambda: (_double(10_000 + n) for n in range(size)),  # built on first use
        },
        Rubric(
            [
                RewardComponent("correct", 1.0, integer_correctness, bounded=True),
                boxed_component(0.2),
            ]
        ),
        system_prompt="You are a calculator.",
        prompt_template=r"{question} The answer is {hint}. Answer in \boxed{}.",
        reference=lambda sample: f"\\boxed{{{sample.answer}}}",
    )


def test_composition_builds_a_complete_environment(registry):
    import grpo_envs
    from grpo_envs.wrappers import ScoreGuard

    registry.register("demo/composed-v0", double_env)
    env = grpo_envs.make("demo/composed-v0", size=4)
    assert isinstance(env.env, SingleTurnEnv)  # bounded components: no TimeLimit
    assert isinstance(env, ScoreGuard) and env.splits == ("train", "test")
    grpo_envs.check_env(env, n_samples=2)
    row = env.dataset("test")[1]
    assert row["id"] == "q10001" and row["env_id"] == "demo/composed-v0"
    assert row["prompt"] == [
        {"role": "system", "content": "You are a calculator."},
        {"role": "user", "content": "What is 2 * 10001? The answer is even. Answer in \\boxed{}."},
    ]
    score = env.score("\\boxed{20002}", row)
    assert score.correct and score.reward == pytest.approx(1.2)


def test_composition_errors_name_the_item():
    env = SingleTurnEnv([{"question": "q"}], Rubric([RewardComponent("c", 1.0, lambda c: 1.0)]))
    with pytest.raises(ValueError, match="split 'train' item 0 has no 'answer'"):
        env.dataset("train")
    env = SingleTurnEnv([], Rubric([RewardComponent("c", 1.0, lambda c: 1.0)]))
    with pytest.raises(ValueError, match="split 'train' is empty"):
        env.dataset("train")


def test_docstring_example_env_is_complete(monkeypatch):
    """The ~20-line environment of SingleTurnEnv's docstring registers and passes check_env."""
    from collections.abc import Iterator

    import grpo_envs
    from grpo_envs import registration as reg
    from grpo_envs.envs._common import integer_correctness
    from grpo_envs.format import boxed_component

    monkeypatch.setattr(reg, "registry", dict(reg.registry))

    class DoubleEnv(SingleTurnEnv):  # a subclass: procedural data in load_split
        """What is 2 * n?"""

        def __init__(self, size: int = 100) -> None:
            super().__init__()
            self.size = size
            self.rubric = Rubric(
                [RewardComponent("correct", 1.0, integer_correctness), boxed_component(0.0)]
            )

        def load_split(self, split: str) -> Iterator[Sample]:
            offset = 0 if split == "train" else 10_000  # disjoint held-out numbers
            for i in range(self.size):
                n = offset + i
                yield Sample(
                    f"{split}-{i}",
                    (Message("user", f"What is 2 * {n}? Answer in \\boxed{{}}."),),
                    str(2 * n),
                )

        def reference_completion(self, sample):
            return f"\\boxed{{{sample.answer}}}"

    reg.register("demo/double-v0", DoubleEnv)
    env = grpo_envs.make("demo/double-v0", size=10)
    grpo_envs.check_env(env, n_samples=2)
    row = env.dataset("test")[3]
    assert row["answer"] == "20006"
    score = env.score("2 * 10003 = \\boxed{20006}", row)
    assert score.correct and score.component("boxed").value == 1.0 and score.reward == 1.0
