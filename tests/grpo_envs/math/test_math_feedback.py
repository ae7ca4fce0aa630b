"""math/feedback-v0: a wrong answer is told what was wrong (never the answer) and tries again."""

from pathlib import Path

import pytest

import grpo_envs
from grpo_envs.checker import check_env
from grpo_envs.envs.multiturn import answer_feedback, as_number
from grpo_envs.episode import EpisodeEnd, run_episode, scripted
from grpo_envs.types import Outcome, Sample

QUESTIONS = Path(__file__).resolve().parents[1] / "fixtures" / "dataset" / "questions.jsonl"


@pytest.fixture(scope="module")
def add2():
    return grpo_envs.make("math/add2-feedback-v0", train_size=50, test_size=50)


def boxed(value: object) -> str:
    return f"The final answer is \\boxed{{{value}}}."


def test_the_feedback_says_what_was_wrong_and_never_the_answer():
    env = grpo_envs.make("math/add2-feedback-v0", max_turns=4, train_size=5, test_size=50)
    for row in env.dataset("test"):
        gold = int(row["answer"])
        turns = ["I am not sure.", boxed(gold - 10), boxed(gold - 10)]
        result = run_episode(env, row, scripted([*turns, boxed(gold + 1)]))
        said = [o.text for o in result.state.observations]
        assert said[0].startswith("I found no final answer.")
        assert said[1].startswith(f"{gold - 10} is not right: it is too low.")
        assert said[2].startswith(f"{gold - 10} is still not right (you answered {gold - 10}")
        assert all(str(gold) not in text for text in said)
        high = run_episode(env, row, scripted([boxed(gold + 7)])).state.observations[0].text
        assert high.startswith(f"{gold + 7} is not right: it is too high.")
        assert str(gold) not in high


def test_without_hints_the_feedback_only_says_not_right():
    env = grpo_envs.make("math/add2-feedback-v0", hint="none", train_size=5, test_size=5)
    row = env.dataset("test")[0]
    gold = int(row["answer"])
    result = run_episode(env, row, scripted([boxed(gold - 1), boxed(gold + 1)]))
    texts = [o.text for o in result.state.observations]
    assert texts[0].startswith(f"{gold - 1} is not right. Try again")
    assert not any("too" in t for t in texts)


def test_the_reward_is_the_final_turns_verified_answer_only(add2):
    row = add2.dataset("test")[3]
    gold = int(row["answer"])
    late = run_episode(add2, row, scripted([boxed(gold - 1), boxed(gold + 2), boxed(gold)]))
    assert late.end is EpisodeEnd.DONE and late.score.reward == 1.0
    assert late.score.outcome is Outcome.CORRECT and late.score.details["turns"] == 3
    # The right number said along the way, but not as the final answer, earns nothing.
    hedged = f"Is it {gold}? No. {boxed(gold + 1)}"
    wrong = run_episode(add2, row, scripted([hedged]))
    assert wrong.end is EpisodeEnd.MAX_TURNS and wrong.score.reward == 0.0
    assert wrong.state.observations[0].text.startswith(f"{gold + 1} is not right")
    # Scoring looks only at the last turn: an episode whose last turn is wrong scores 0 even
    # when an earlier turn (of a replayed transcript) was right.
    state = add2.start(row)
    for turn in (boxed(gold - 1), boxed(gold - 2)):
        state = add2.step(state, turn)
    assert add2.score_episode(state).reward == 0.0


def test_a_turn_cost_prices_each_extra_turn():
    env = grpo_envs.make("math/add2-feedback-v0", turn_cost=0.25, train_size=5, test_size=5)
    row = env.dataset("test")[0]
    gold = int(row["answer"])
    result = run_episode(env, row, scripted([boxed(gold + 3), boxed(gold)]))
    assert result.score.reward == pytest.approx(0.75)
    assert result.score.component("extra_turns").value == 1.0


def test_budgets_cut_the_episode_and_it_still_scores_the_last_turn(add2):
    row = add2.dataset("test")[5]
    gold = int(row["answer"])
    result = run_episode(add2, row, scripted([boxed(gold + 1)]))
    assert result.end is EpisodeEnd.MAX_TURNS and len(result.state.turns) == 3
    assert len(result.state.observations) == 2 and result.score.reward == 0.0
    tight = grpo_envs.make("math/add2-feedback-v0", max_tokens=8, train_size=5, test_size=5)
    row = tight.dataset("test")[0]
    long_wrong = "I think that the final answer is \\boxed{0} here."  # 9 words
    result = run_episode(tight, row, scripted([long_wrong, boxed(row["answer"])]))
    assert result.end is EpisodeEnd.MAX_TOKENS and len(result.state.turns) == 1


def test_one_turn_is_the_base_task_itself():
    single = grpo_envs.make("math/add2-feedback-v0", max_turns=1, train_size=5, test_size=20)
    base = grpo_envs.make("math/arithmetic-v0", task="add2", answer="loose", test_size=20)
    pairs = list(zip(single.dataset("test"), base.dataset("test")))
    assert [(a["prompt"], a["answer"]) for a, b in pairs] == [
        (b["prompt"], b["answer"]) for a, b in pairs
    ]
    for _, row in pairs:
        for completion in (boxed(row["answer"]), "It is 12.", f"So it is {row['answer']}."):
            episode = run_episode(single, row, scripted([completion]))
            assert len(episode.state.turns) == 1
            assert episode.score.reward == base.score(completion, row).reward


def test_non_integer_answers_get_directions_from_exact_numbers():
    assert as_number("3/4") > as_number("0.7")
    assert as_number("1e999999") is None or as_number("1e999999") > 0  # exact, never inf
    assert answer_feedback("0.7", "3/4", []).startswith("0.7 is not right: it is too low.")
    assert answer_feedback("x + 1", "3/4", []).startswith("x + 1 is not right. Try")
    assert answer_feedback("1/0", "3", []).startswith("1/0 is not right. Try")
    with pytest.raises(ValueError, match="hint"):
        answer_feedback("1", "2", [], hint="spoiler")


def test_any_math_environment_can_be_the_base_and_passes_check_env():
    env = grpo_envs.make(
        "math/feedback-v0",
        base="math/dataset-v0",
        path=str(QUESTIONS),
        question="problem",
        answer="solution",
        id="qid",
    )
    check_env(env)
    row = env.dataset("train")[0]
    sample = Sample.from_row(row)
    result = run_episode(env, row, scripted(["\\boxed{1}", env.reference_completion(sample)]))
    assert result.end is EpisodeEnd.DONE and result.score.reward == 1.0
    assert "too low" in result.state.observations[0].text


def test_bad_arguments_fail_at_construction():
    with pytest.raises(ValueError, match="hint"):
        grpo_envs.make("math/add2-feedback-v0", hint="answer")
    with pytest.raises(ValueError, match="turn_cost"):
        grpo_envs.make("math/add2-feedback-v0", turn_cost=-1)
    with pytest.raises(ValueError, match="max_turns"):
        grpo_envs.make("math/add2-feedback-v0", max_turns=0)
