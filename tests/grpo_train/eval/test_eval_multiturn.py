"""``evaluate`` on a multi-turn environment: pass@k over episodes, resumable like single-turn."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_rollout_episodes import ScriptedEngine
from toy_env import digit_retry_env

from grpo_train.episodes.driver import EpisodeSettings
from grpo_train.eval.runner import evaluate
from grpo_train.models.loading import _train_tiny_tokenizer
from grpo_train.rollout.base import SamplingConfig


@pytest.fixture(scope="module")
def tok():
    return _train_tiny_tokenizer(512)


def script(turn: int, request: int, _history: list[int]) -> str:
    """Per prompt (4 episodes each): episode 0 answers at once, episode 1 on its second turn."""
    if turn == 0:
        return "7" if request % 4 == 0 else "no"
    return "3" if request % 3 == 0 else "still no"


def test_pass_at_k_is_over_episodes_and_a_rerun_resumes(tok, tmp_path: Path) -> None:
    env = digit_retry_env()
    engine = ScriptedEngine(tok, script)
    sampling = SamplingConfig(n=4, max_new_tokens=16, temperature=1.0, seed=1)
    summary = evaluate(
        engine, tok, [env], limit=3, sampling=sampling, ks=[1, 4], out_dir=tmp_path,
        progress=False, episodes=EpisodeSettings(max_episode_tokens=200),
    )  # fmt: skip
    result = summary[env.env_id]
    records = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert len(records) == 12 and summary.num_generated == 12
    by_turns: dict[int, list[dict]] = {}
    for r in records:
        by_turns.setdefault(r["score"]["details"]["turns"], []).append(r)
    # Turn 0: one episode per prompt answers; turn 1: the live ones whose request index % 3 == 0.
    assert all(r["success"] for r in by_turns[1]) and len(by_turns[1]) == 3
    successes = sum(r["success"] for r in records)
    assert successes > 3 and all("[user] Say a digit." in r["completion"] for r in by_turns[2])
    for r in records:  # each turn recorded: model turns and the replies between them
        turns = r["turns"]
        assert [t["role"] for t in turns][::2] == ["assistant"] * r["score"]["details"]["turns"]
        assert all(t["role"] == "user" and t["text"] == "Say a digit." for t in turns[1::2])
        assert [t["scored"] for t in turns if t["role"] == "assistant"][-1]
        assert sum(t["scored"] for t in turns) == 1
    failed = [r for r in records if not r["success"]]
    assert failed and all(r["score"]["details"]["episode_end"] == "max_turns" for r in failed)
    per_prompt = {}
    for r in records:
        per_prompt.setdefault(r["sample_id"], []).append(r["success"])
    expected_pass1 = sum(sum(v) / 4 for v in per_prompt.values()) / 3
    assert result.pass_at_k[1] == pytest.approx(expected_pass1)
    assert result.pass_at_k[4] == 1.0  # every prompt's first episode succeeds
    # Each later turn went to the engine as one batch over every live episode.
    assert [len(prompts) * s.n for prompts, s in engine.calls] == [12, 9, 6]

    # Interrupted after some episodes: a rerun plays only the missing ones, same results.
    lines = (tmp_path / "samples.jsonl").read_text().splitlines()
    (tmp_path / "samples.jsonl").write_text("\n".join(lines[:5]) + "\n")
    again = evaluate(
        ScriptedEngine(tok, script), tok, [env], limit=3, sampling=sampling, ks=[1, 4],
        out_dir=tmp_path, progress=False, episodes=EpisodeSettings(max_episode_tokens=200),
    )  # fmt: skip
    assert again.num_reused == 5 and again.num_generated == 7
    assert again[env.env_id].pass_at_k[4] == 1.0
