"""The training run's ``samples.jsonl`` rows: single-turn as before, multi-turn turn by turn."""

from __future__ import annotations

import itertools
import json
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

from grpo_envs.episode import (
    EpisodeBudget,
    MultiTurnEnv,
    Step,
    ToolRecord,
    ToolStatus,
    episodic,
    turn_penalty,
)
from grpo_envs.rubric import RewardComponent, Rubric
from grpo_envs.types import Component, Outcome, Sample, Score
from grpo_train.collect.groups import Group
from grpo_train.collect.samples import sample_records
from grpo_train.episodes.driver import (
    EpisodeRenderer,
    EpisodeSettings,
    episode_row,
    generate_episodes,
    score_episodes,
)
from grpo_train.episodes.tokens import Extension
from grpo_train.models.loading import _train_tiny_tokenizer
from grpo_train.rollout.base import Completion, SamplingConfig

sys.path.insert(0, str(Path(__file__).parents[1] / "episodes"))
from test_rollout_episodes import ScriptedEngine

#: What each scripted request writes, turn by turn: a tool call that works, one that fails, a
#: malformed one, a digit (the environment ends the episode), or prose (asked again).
SCRIPTS = [
    ["7"],  # answers at once
    ["call ok", "3"],  # a working tool call, then the answer
    ["call error", "call malformed", "5"],  # two failing calls, then the answer
    ["hm", "hm", "hm", "hm"],  # cut by max_turns (3)
    ["call ok", "call ok", "call error"],  # tool calls until the turn budget cuts it
]


def _step(state, turn: str) -> Step:
    text = turn.strip()
    if text[:1].isdigit():
        return Step.end()
    if text.startswith("call"):
        status = {"ok": ToolStatus.OK, "error": ToolStatus.ERROR}.get(
            text.split()[-1], ToolStatus.MALFORMED
        )
        record = ToolRecord("python", f"print({len(state.turns)})", status, 0.25, f"out {status}")
        return Step.reply(f"tool said {status}", role="tool", tools=[record])
    return Step.reply("Say a digit.")


def _env() -> MultiTurnEnv:
    def digit(ctx) -> float:
        return 1.0 if ctx.completion.strip()[:1].isdigit() else 0.0

    rows = [{"question": f"Q{i}", "answer": "7"} for i in range(4)]
    return MultiTurnEnv(
        {"train": rows, "test": rows},
        Rubric([RewardComponent("digit", 1.0, digit)]),
        _step,
        budget=EpisodeBudget(max_turns=3),
        episode_components=(turn_penalty(-0.1),),
    )


def _script(turn: int, row: int, _history) -> str:
    """Turn ``turn`` of the ``row``-th episode still running (the engine sees only those)."""
    live = [r for r, said in enumerate(SCRIPTS) if not any(t[:1].isdigit() for t in said[:turn])]
    return SCRIPTS[live[row]][turn]


@pytest.fixture(scope="module")
def episode_rows():
    tok = _train_tiny_tokenizer(512)
    env = _env()
    sample = Sample.from_row(env.dataset("train")[0])
    renderer = EpisodeRenderer(tok)
    prompt_ids = renderer.prompt_ids(sample)
    engine = ScriptedEngine(tok, _script)
    rollouts = generate_episodes(
        engine,
        renderer,
        [episodic(env)],
        [sample],
        [prompt_ids],
        SamplingConfig(n=len(SCRIPTS), max_new_tokens=32, seed=1),
        EpisodeSettings(max_episode_tokens=400),
    )[0]
    scores = score_episodes([episodic(env)], [rollouts])[0]
    group = Group(
        sample,
        0,
        list(prompt_ids),
        [episode_row(r) for r in rollouts],
        scores,
        tuple(rollouts),
    )
    records = sample_records(3, group, "test/tools-v0", [0.5] * len(rollouts), ["extra_turns"])
    return rollouts, scores, [json.loads(json.dumps(asdict(r))) for r in records]


def test_each_model_turn_and_reply_is_a_record_in_order(episode_rows):
    rollouts, _, rows = episode_rows
    assert len(rows) == len(SCRIPTS)
    for rollout, row in zip(rollouts, rows):
        turns = row["turns"]
        model = [t for t in turns if t["role"] == "assistant"]
        assert [t["text"] for t in model] == list(rollout.state.turns)
        # roles alternate: a model turn, then the environment's reply to it (if any)
        assert turns[0]["role"] == "assistant"
        for a, b in itertools.pairwise(turns):
            assert (a["role"] == "assistant") != (b["role"] == "assistant")
        assert sum(t["tokens"] for t in model) == rollout.sampled_tokens
        replies = [t for t in turns if t["role"] != "assistant"]
        assert len(replies) == len(rollout.state.observations)
        inserted = [t["tokens"] for t in replies]
        expected = [len(c.ids) for c in rollout.continuations if isinstance(c, Extension)]
        assert inserted == expected and sum(inserted) == rollout.environment_tokens
        assert [t["scored"] for t in turns].count(True) == 1 and model[-1]["scored"]
        assert row["episode_end"] == rollout.state.end.value


def test_tool_calls_sit_on_the_turn_that_made_them_with_their_results(episode_rows):
    rollouts, _, rows = episode_rows
    for script, rollout, row in zip(SCRIPTS, rollouts, rows):
        model = [t for t in row["turns"] if t["role"] == "assistant"]
        for said, turn in zip(script, model):
            calls = turn["tool_calls"]
            if not said.startswith("call"):
                assert calls == []
                continue
            (call,) = calls
            status = {"ok": "ok", "error": "error"}.get(said.split()[-1], "malformed")
            assert call["status"] == status and call["output"] == f"out {status}"
            assert call["name"] == "python" and call["seconds"] == 0.25
        total = sum(len(t["tool_calls"]) for t in model)
        assert total == rollout.tool_calls
    # the reply after a tool call has the tool's role
    assert [t["role"] for t in rows[1]["turns"]] == ["assistant", "tool", "assistant"]
    assert [t["role"] for t in rows[3]["turns"]] == [
        "assistant",
        "user",
        "assistant",
        "user",
        "assistant",
    ]


def test_the_reward_is_explained_by_its_components(episode_rows):
    _, scores, rows = episode_rows
    for score, row in zip(scores, rows):
        parts = {p["name"]: p for p in row["components"]}
        assert set(parts) == {"digit", "extra_turns"}
        assert parts["digit"]["judged"] == "final_turn"
        assert parts["extra_turns"]["judged"] == "episode"
        assert sum(p["weighted"] for p in parts.values()) == pytest.approx(row["reward"])
        assert row["reward"] == pytest.approx(score.reward)
        assert row["score_details"]["turns"] == len(
            [t for t in row["turns"] if t["role"] == "assistant"]
        )
    assert rows[0]["reward"] == 1.0 and rows[2]["reward"] == pytest.approx(0.8)
    assert rows[3]["episode_end"] == "max_turns" and rows[3]["reward"] == pytest.approx(-0.2)


def test_a_single_turn_row_keeps_its_fields_and_gains_the_components():
    sample = Sample("s1", (), "7")
    completion = Completion(0, " 7", (5, 6), (-0.1, -0.2), "stop")
    score = Score(1.0, Outcome.CORRECT, (Component("correct", 1.0), Component("format", 0.5, 0.2)))
    failed = Score.failure(Outcome.ERROR, "scorer raised")
    group = Group(sample, 0, [1, 2], [completion, completion], [score, failed])
    rows = [asdict(r) for r in sample_records(1, group, "math/x", [0.5, -0.5])]
    before = {"env_id", "sample_id", "prompt", "completion", "reward", "outcome", "step",
              "advantage", "finish_reason"}  # fmt: skip
    assert before | {"components", "score_details"} == set(rows[0])
    assert rows[0]["completion"] == " 7" and rows[0]["advantage"] == 0.5
    assert [p["judged"] for p in rows[0]["components"]] == ["completion", "completion"]
    assert [p["weighted"] for p in rows[0]["components"]] == pytest.approx([1.0, 0.1])
    assert rows[1]["components"] == () and rows[1]["score_details"] == {"reason": "scorer raised"}


def test_a_turn_record_round_trips_through_its_json() -> None:
    from dataclasses import asdict

    from grpo_train.episodes.records import ToolCallRecord, TurnRecord

    turns = (
        TurnRecord(
            role="assistant", text="<tool_call>...</tool_call>", tokens=12, finish_reason="stop",
            tool_calls=(ToolCallRecord(name="python", call="1/0", status="error", seconds=0.25,
                                       output="ZeroDivisionError"),),
        ),
        TurnRecord(role="tool", text="[error] ZeroDivisionError", tokens=None),
        TurnRecord(role="assistant", text="\\boxed{7}", tokens=5, finish_reason="stop",
                   scored=True),
    )  # fmt: skip
    raw = json.loads(json.dumps([asdict(t) for t in turns]))
    assert tuple(TurnRecord.from_json(t) for t in raw) == turns
