"""check_env on episodic environments: a good one passes, each broken rule is named."""

import random

import pytest

import grpo_envs
from grpo_envs.checker import EnvCheckError, check_env
from grpo_envs.episode import EpisodeBudget, MultiTurnEnv, Step
from grpo_envs.rubric import RewardComponent, Rubric, StripParser

ROWS = [{"id": f"q{i}", "question": f"Say {i}.", "answer": str(i)} for i in range(3)]


def _exact(ctx):
    return float(ctx.parsed == ctx.sample.answer)


def _retry(state, turn):
    if turn.strip() == state.sample.answer:
        return Step.end()
    return Step.reply(f"No. Attempt {len(state.turns)} was wrong.")


def _build(step=_retry, judge=_exact):
    rubric = Rubric([RewardComponent("correct", 1.0, judge)], parser=StripParser())
    return MultiTurnEnv(
        {"train": ROWS, "test": ROWS},
        rubric,
        step,
        budget=EpisodeBudget(max_turns=3),
        reference=lambda s: s.answer,
    )


@pytest.fixture(autouse=True)
def _forget_test_env():
    yield
    grpo_envs.registry.pop("test/episodes-check-v0", None)


def _make(step, judge=_exact):
    spec = grpo_envs.register("test/episodes-check-v0", lambda: _build(step, judge))
    return grpo_envs.make(spec)


def test_a_well_behaved_multi_turn_env_passes():
    check_env(_make(_retry), n_samples=2)


def test_a_step_that_raises_on_garbage_is_named():
    def fragile(state, turn):
        if not turn.strip():
            raise ValueError("empty turn")
        return _retry(state, turn)

    with pytest.raises(EnvCheckError, match="step function failed on garbage turn ''"):
        check_env(_make(fragile), n_samples=1)


def test_observations_that_differ_between_plays_are_named():
    def noisy(state, turn):
        return Step.reply(f"try again ({random.random()})")

    with pytest.raises(EnvCheckError, match="different observations"):
        check_env(_make(noisy), n_samples=1, check_determinism=False)


def test_garbage_that_succeeds_is_named():
    def fooled(ctx):  # single-turn garbage passes; a garbage tool-call turn fools it
        return float(ctx.parsed == ctx.sample.answer or "<tool_call>{<tool_call>" in ctx.completion)

    with pytest.raises(EnvCheckError, match=r"garbage turn '<tool_call>.*scored as a success"):
        check_env(_make(_retry, judge=fooled), n_samples=1)


def test_an_episodic_env_that_never_ends_episodes_is_cut_by_the_driver():
    class Endless:
        """An episodic environment whose step ignores its own budget."""

        budget = EpisodeBudget(max_turns=2)

        def __init__(self):
            self.inner = _build()

        def start(self, sample):
            return self.inner.start(sample)

        def step(self, state, turn, *, tokens=0):
            from dataclasses import replace

            return replace(state, turns=(*state.turns, turn))  # never ends

        def score_episode(self, state):
            return self.inner.score_episode(state)

    from grpo_envs.episode import EpisodeEnd, run_episode, scripted

    endless = Endless()
    result = run_episode(endless, endless.inner.dataset("train")[0], scripted(["no"]))
    assert result.end is EpisodeEnd.MAX_TURNS and len(result.state.turns) == 2
