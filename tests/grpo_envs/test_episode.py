"""Episodes: the contract, the budgets, the one-turn view of single-turn envs, the driver."""

import pytest

import grpo_envs
from grpo_envs.base import SingleTurnEnv
from grpo_envs.episode import (
    EpisodeBudget,
    EpisodeEnd,
    EpisodeState,
    MultiTurnEnv,
    OneTurn,
    Step,
    episodic,
    run_episode,
    scripted,
    turn_penalty,
)
from grpo_envs.rubric import RewardComponent, Rubric, StripParser
from grpo_envs.types import Message, Outcome, Sample

ROWS = [{"id": f"q{i}", "question": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(3)]


def exact(ctx):
    return float(ctx.parsed == ctx.sample.answer)


def hint_step(state: EpisodeState, turn: str) -> Step:
    """Ends on the right answer; otherwise says higher/lower (a guessing game)."""
    try:
        guess = int(turn.strip())
    except ValueError:
        return Step.reply("Answer with a number only.")
    answer = int(state.sample.answer)
    if guess == answer:
        return Step.end()
    return Step.reply("higher" if guess < answer else "lower")


def make_env(**kwargs):
    rubric = Rubric([RewardComponent("correct", 1.0, exact)], parser=StripParser())
    return MultiTurnEnv({"train": ROWS}, rubric, hint_step, **kwargs)


def test_an_episode_alternates_turns_and_observations_and_is_scored_on_the_last_turn():
    env = make_env(budget=EpisodeBudget(max_turns=4), episode_components=[turn_penalty(-0.25)])
    row = env.dataset("train")[2]  # answer 4
    result = run_episode(env, row, scripted(["two", "3", "5", "4"]))
    assert result.end is EpisodeEnd.DONE
    assert result.state.turns == ("two", "3", "5", "4")
    assert [o.text for o in result.state.observations] == [
        "Answer with a number only.\n",
        "higher\n",
        "lower\n",
    ]
    assert result.score.outcome is Outcome.CORRECT
    # 1.0 for the answer, -0.25 for each of the 3 turns beyond the first
    assert result.score.reward == pytest.approx(1.0 - 0.75)
    assert result.score.component("extra_turns").value == 3.0
    assert result.score.details["turns"] == 4 and result.score.details["episode_end"] == "done"
    history = result.state.messages()
    assert [m.role for m in history] == ["user"] + ["assistant", "user"] * 3 + ["assistant"]
    assert result.state.text().endswith("lower\n4")


def test_an_episode_that_never_ends_is_cut_at_max_turns_and_still_scored():
    env = make_env(budget=EpisodeBudget(max_turns=3))
    row = env.dataset("train")[1]  # answer 2
    result = run_episode(env, row, scripted(["9"]))
    assert result.end is EpisodeEnd.MAX_TURNS and result.end.truncated
    assert len(result.state.turns) == 3 and len(result.state.observations) == 2
    assert result.score.outcome is Outcome.WRONG and result.score.reward == 0.0
    assert result.score.details["episode_end"] == "max_turns"


def test_answering_on_the_last_allowed_turn_is_done_not_cut():
    env = make_env(budget=EpisodeBudget(max_turns=2))
    result = run_episode(env, env.dataset("train")[1], scripted(["1", "2"]))
    assert result.end is EpisodeEnd.DONE and result.score.correct


def test_token_and_tool_time_budgets_cut_with_their_own_end():
    env = make_env(budget=EpisodeBudget(max_turns=10, max_tokens=5))
    result = run_episode(env, env.dataset("train")[1], scripted(["9 9 9"]))
    assert result.end is EpisodeEnd.MAX_TOKENS and len(result.state.turns) == 2

    from grpo_envs.episode import ToolRecord, ToolStatus

    def slow_tool(state, turn):
        return Step.reply("ran", tools=[ToolRecord("python", turn, ToolStatus.OK, seconds=2.0)])

    rubric = Rubric([RewardComponent("correct", 1.0, exact)])
    tool_env = MultiTurnEnv(ROWS, rubric, slow_tool, budget=EpisodeBudget(10, max_tool_s=5.0))
    result = run_episode(tool_env, tool_env.dataset("train")[0], scripted(["x"]))
    assert result.end is EpisodeEnd.TOOL_TIME and len(result.state.turns) == 3
    assert result.state.tool_s == 6.0


def test_a_step_function_that_raises_or_returns_junk_ends_the_episode_as_env_error():
    rubric = Rubric([RewardComponent("correct", 1.0, exact)])
    for step in (lambda s, t: 1 / 0, lambda s, t: "not a step"):
        env = MultiTurnEnv(ROWS, rubric, step)
        result = run_episode(env, env.dataset("train")[0], scripted(["0"]))
        assert result.end is EpisodeEnd.ENV_ERROR and not result.end.truncated
        assert result.score.outcome is Outcome.ERROR and result.score.reward == 0.0
        assert result.state.error


def test_a_step_after_the_end_is_refused_and_non_text_turns_do_not_crash():
    env = make_env()
    state = env.step(env.start(env.dataset("train")[0]), "0")
    assert state.end is EpisodeEnd.DONE
    with pytest.raises(ValueError, match="already ended"):
        env.step(state, "0")
    state = env.step(env.start(env.dataset("train")[0]), None)  # type: ignore[arg-type]
    assert state.turns == ("",) and state.observations[0].text == "Answer with a number only.\n"


def test_single_turn_score_of_a_multi_turn_env_is_a_one_turn_episode():
    env = make_env(episode_components=[turn_penalty(-0.5)])
    row = env.dataset("train")[1]
    assert env.score("2", row).reward == 1.0  # no extra turn, no penalty
    assert env.score("3", row).outcome is Outcome.WRONG
    assert [s.reward for s in env.score_batch(["2", "3", None], [row] * 3)] == [1.0, 0.0, 0.0]


def test_any_single_turn_env_is_a_one_turn_episode_with_the_same_score():
    env = grpo_envs.make("math/add2-v0", train_size=4, test_size=2)
    episodes = episodic(env)
    assert isinstance(episodes, OneTurn) and episodes.budget.max_turns == 1
    row = env.dataset("train")[0]
    for completion in ("\\boxed{" + row["answer"] + "}", "no idea", "\\boxed{-1}"):
        result = run_episode(env, row, scripted([completion]))
        expected = env.score(completion, row)
        assert result.end is EpisodeEnd.DONE and len(result.state.turns) == 1
        assert (result.score.reward, result.score.outcome) == (expected.reward, expected.outcome)
        assert result.score.components == expected.components
    assert episodic(make_env()).budget.max_turns == 4  # a multi-turn env is its own view


def test_same_sample_and_turns_give_the_same_observations_and_score():
    turns = ["x", "1", "7", "4"]
    a = run_episode(make_env(), ROWS[2] | {"prompt": "q"}, scripted(turns))
    b = run_episode(make_env(), ROWS[2] | {"prompt": "q"}, scripted(turns))
    assert a == b


def test_budget_validation():
    for bad in ({"max_turns": 0}, {"max_tokens": 0}, {"max_tool_s": float("inf")}):
        with pytest.raises(ValueError):
            EpisodeBudget(**bad)


def test_episode_state_and_observation_types():
    from grpo_envs.episode import Observation

    with pytest.raises(ValueError):
        Observation(())
    obs = Step.reply([Message("tool", "out")]).observation
    assert obs is not None and obs.messages[0].role == "tool" and obs.text == "out\n"
    assert issubclass(MultiTurnEnv, SingleTurnEnv)
    assert EpisodeState(Sample("0", (), "1")).last_turn == ""


def test_episodes_of_a_made_env_are_guarded_against_a_broken_scorer():
    from grpo_envs.episode import EpisodeComponent, EpisodeOverError, GuardedEpisodes

    def broken(state):
        raise RuntimeError("component bug")

    env = make_env(episode_components=[EpisodeComponent("broken", 1.0, broken)])
    episodes = episodic(env)
    assert isinstance(episodes, GuardedEpisodes)
    result = run_episode(env, env.dataset("train")[0], scripted(["0"]))
    assert (
        result.score.outcome is Outcome.ERROR and "component bug" in result.score.details["reason"]
    )

    class Raising(MultiTurnEnv):
        def score_episode(self, state):
            raise KeyError("scorer bug")

    raising = Raising({"train": ROWS}, env.rubric, hint_step)
    result = run_episode(raising, raising.dataset("train")[0], scripted(["0"]))
    assert result.score.outcome is Outcome.ERROR and "scorer bug" in result.score.details["reason"]
    ended = episodes.step(episodes.start(ROWS[0] | {"prompt": "q"}), "0")
    with pytest.raises(EpisodeOverError):
        episodes.step(ended, "0")


def test_step_many_advances_live_episodes_together_in_order():
    from grpo_envs.episode import step_many

    env = make_env(budget=EpisodeBudget(max_turns=3))
    states = [env.start(row) for row in env.dataset("train")]  # answers 0, 2, 4
    for workers in (1, 3):
        after = step_many(env, states, ["0", "1", "9"], [1, 1, 1], workers=workers)
        assert [s.end for s in after] == [EpisodeEnd.DONE, None, None]
        assert [s.observations[-1].text for s in after[1:]] == ["higher\n", "lower\n"]
        again = step_many(env, after, ["x", "2", "4"], workers=workers)
        assert again[0] is after[0]  # an ended episode is left as it was
        assert [s.end for s in again] == [EpisodeEnd.DONE, EpisodeEnd.DONE, EpisodeEnd.DONE]
    with pytest.raises(ValueError, match="one turn per episode"):
        step_many(env, states, ["0"])
