"""Training on multi-turn episodes: the rows trained are the episodes' exact ids, env ids masked."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch
from rollout_checks import train_keeping_batches
from test_rollout_episodes import ScriptedEngine
from toy_env import digit_retry_env
from transformers import PreTrainedTokenizerBase

from grpo_envs.episode import MultiTurnEnv, episodic
from grpo_envs.types import Sample
from grpo_train.collect.batch import RolloutBatch
from grpo_train.collect.groups import Group
from grpo_train.collect.metrics import rollout_metrics, step_metrics
from grpo_train.config import TrainConfig
from grpo_train.episodes.driver import (
    EpisodeRenderer,
    EpisodeRollout,
    EpisodeSettings,
    episode_row,
    generate_episodes,
    score_episodes,
)
from grpo_train.episodes.tokens import Extension
from grpo_train.learner.update import Learner, grpo_update
from grpo_train.rollout.base import SamplingConfig
from grpo_train.run.run_log import read_metrics
from grpo_train.setup.settings import update_settings
from grpo_train.trainer import Trainer

EPISODE_METRICS = (
    "episodes/turns_mean",
    "episodes/tool_calls_mean",
    "episodes/tool_error_share",
    "episodes/environment_token_share",
    "episodes/truncated_share",
    "episodes/template_breaks",
)


def _answer_then_retry_episodes(
    tok: PreTrainedTokenizerBase,
) -> tuple[MultiTurnEnv, list[Sample], list[list[int]], list[EpisodeRollout]]:
    """One group of two scripted episodes on the digit-retry env: episode 0 answers "5" at once;
    episode 1 says "hmm", gets the environment's reply, then answers "3"."""
    env = digit_retry_env(size=4)
    samples = [Sample.from_row(env.dataset("train")[0])]
    renderer = EpisodeRenderer(tok)
    prompt_ids = [renderer.prompt_ids(samples[0])]
    engine = ScriptedEngine(tok, lambda turn, r, _h: ["5" if r == 0 else "hmm", "3"][turn])
    (group,) = generate_episodes(
        engine, renderer, [episodic(env)], samples, prompt_ids,
        SamplingConfig(n=2, max_new_tokens=16), EpisodeSettings(max_episode_tokens=64),
    )  # fmt: skip
    return env, samples, prompt_ids, group


def test_the_gradient_with_environment_tokens_masked_is_the_textbook_one(
    tiny_model_path: Path,
) -> None:
    """DAPO loss, first pass (ratio 1): grad = -(1/N) sum_i A_i sum_{t sampled} grad log p(t)."""
    from grpo_train.models.loading import load_policy

    model, tok = load_policy(str(tiny_model_path))
    env, samples, prompt_ids, group = _answer_then_retry_episodes(tok)
    assert group[1].turns == 2 and isinstance(group[1].continuations[0], Extension)
    scores = score_episodes([episodic(env)], [group])[0]
    rows = [Group(samples[0], 0, prompt_ids[0], [episode_row(r) for r in group], scores,
                  episodes=tuple(group))]  # fmt: skip
    batch = RolloutBatch.from_groups(rows, 2)
    advantages = torch.tensor([[0.75, -0.75]])
    settings = update_settings(
        TrainConfig.from_flat(
            {"loss_type": "dapo", "is_correction": False, "micro_batch_tokens": 10**6}
        )
    )
    captured: dict[str, dict[str, torch.Tensor]] = {}

    def capture(loss: float) -> float:
        captured["grads"] = {n: p.grad.clone() for n, p in model.named_parameters()}
        model.zero_grad(set_to_none=True)
        return 0.0

    grpo_update(Learner(model, pad_id=0), capture, batch, advantages, settings)

    # By hand: each episode's whole sequence in one plain forward (the environment's ids are
    # context), the log-probabilities of the sampled ids only, DAPO's token-mean over them.
    model.zero_grad(set_to_none=True)
    sampled_total = sum(r.sampled_tokens for r in group)
    loss = torch.zeros(())
    for i, rollout in enumerate(group):
        seq = rollout.sequence
        ids = torch.tensor([seq.input_ids])
        logits = model(input_ids=ids).logits[0, :-1].float()
        logp = torch.log_softmax(logits, dim=-1).gather(1, ids[0, 1:, None])[:, 0]
        sampled = torch.tensor(seq.loss_mask[1:], dtype=torch.bool)
        assert int(sampled.sum()) == rollout.sampled_tokens
        loss = loss - advantages[0, i] * logp[sampled].sum() / sampled_total
    loss.backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(captured["grads"][name], p.grad, atol=1e-6, rtol=1e-4, msg=name)


def test_length_and_throughput_metrics_count_sampled_ids_not_the_environments(
    tiny_model_path: Path,
) -> None:
    """Hand count (one id per character, then EOS): episode 0 samples "5" (2 ids); episode 1
    "hmm" (4), the reply "Say a digit." (inserted, not counted), then "3" (2): 2 and 6."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model_path))
    env, samples, prompt_ids, episodes = _answer_then_retry_episodes(tok)
    rows = [episode_row(r) for r in episodes]
    assert len(rows[1].token_ids) > 6  # the row holds the reply's ids too
    scores = score_episodes([episodic(env)], [episodes])[0]
    group = Group(samples[0], 0, prompt_ids[0], rows, scores, episodes=tuple(episodes))
    m = rollout_metrics([group], ["digits"])
    assert (m["length/mean"], m["length/max"]) == (4.0, 6.0)
    m = step_metrics([group], {"generate": 2.0, "train": 2.0}, lr=1e-3)
    assert m["tokens_per_s"] == 2.0  # 8 sampled ids over 4 s
    assert m["throughput/completion_tokens_per_s"] == 2.0
    assert m["throughput/samples_per_s"] == 0.5


def make_config(model_path: Path, out: Path, **overrides: object) -> TrainConfig:
    values: dict[str, object] = {
        "model": str(model_path),
        "engine": "hf",
        "num_generations": 4,
        "prompts_per_step": 2,
        "max_prompt_length": 64,
        "max_completion_length": 48,
        "max_turn_tokens": 6,
        "learning_rate": 1e-2,
        "max_steps": 2,
        "output_dir": str(out),
        "eval_size": 0,
        "save_every": 0,
        "progress": False,
        "log_every_samples": 1,
        "seed": 3,
    }
    values.update(overrides)
    return TrainConfig.from_flat(values)


def test_a_multi_turn_run_trains_each_episodes_exact_ids_and_logs_episode_metrics(
    tiny_model_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer = Trainer(make_config(tiny_model_path, tmp_path), env=digit_retry_env())
    batches = train_keeping_batches(trainer, monkeypatch)
    tok = trainer.setup.tokenizer
    multi_turn = reencoded_differs = 0
    for batch in batches:
        for p, group in enumerate(batch.samples):
            assert len(group.episodes) == batch.group_size
            for g, episode in enumerate(group.episodes):
                row = p * batch.group_size + g
                # The row is the prompt's ids, each turn's sampled ids, the replies' ids.
                expected = list(episode.prompt_ids)
                mask: list[bool] = []
                for i, turn in enumerate(episode.completions):
                    expected += turn.token_ids
                    mask += [True] * len(turn.token_ids)
                    if i < len(episode.continuations):
                        inserted = episode.continuations[i].ids  # type: ignore[union-attr]
                        expected += inserted
                        mask += [False] * len(inserted)
                assert list(batch.prompt_ids[p]) + list(batch.completion_ids[row]) == expected
                assert batch.loss_mask[row].tolist() == mask
                sampled = [lp for t in episode.completions for lp in t.logprobs]
                lps = [lp for lp, m in zip(batch.sampling_logprobs[row], mask) if m]
                assert lps == sampled
                multi_turn += episode.turns > 1
                text = tok.decode(expected)
                reencoded_differs += tok.encode(text, add_special_tokens=False) != expected
    assert multi_turn > 0 and reencoded_differs > 0
    rows = read_metrics(tmp_path)
    for key in EPISODE_METRICS:
        assert all(key in r for r in rows if r.get("step", 0) > 0), key
    assert max(r["episodes/turns_mean"] for r in rows if r.get("step", 0) > 0) > 1.0
    assert all(0 < r["episodes/environment_token_share"] < 1 for r in rows if r.get("step", 0))


NON_DETERMINISTIC = ("time/", "tokens_per_s", "throughput/", "memory/")


def _deterministic(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(NON_DETERMINISTIC)} for r in rows]


@pytest.mark.slow
def test_a_multi_turn_run_resumed_after_sigterm_reproduces_the_uninterrupted_run(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    full_dir, cut_dir = tmp_path / "full", tmp_path / "cut"
    full = Trainer(make_config(tiny_model_path, full_dir, max_steps=3), env=digit_retry_env())
    try:
        full.train()
    finally:
        full.close()
    full_state = full.setup.model.state_dict()

    cut = Trainer(make_config(tiny_model_path, cut_dir, max_steps=3), env=digit_retry_env())
    original = cut.train_step

    def stop_after_two(step: int, log):  # a SIGTERM during step 2: saved, then stopped
        metrics = original(step, log)
        if step == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return metrics

    cut.train_step = stop_after_two  # type: ignore[method-assign]
    try:
        result = cut.train()
    finally:
        cut.close()
    assert result.interrupted and result.steps == 2

    config = make_config(tiny_model_path, cut_dir, max_steps=3, resume="latest")
    resumed = Trainer(config, env=digit_retry_env())
    try:
        assert resumed.train().steps == 3 and resumed.setup.start_step == 2
    finally:
        resumed.close()
    rows = _deterministic(read_metrics(cut_dir))
    assert rows == _deterministic(read_metrics(full_dir))
    assert any(r.get("episodes/turns_mean", 1.0) > 1.0 for r in rows)
    for name, tensor in full_state.items():
        assert torch.equal(resumed.setup.model.state_dict()[name], tensor), name
