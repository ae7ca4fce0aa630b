"""Multi-turn rollouts on both real engines: each turn is sampled from the exact history ids.

The proof that the engine saw the training ids: a plain forward of the trained sequence gives,
at every sampled position, the logprob the engine reported while sampling it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from toy_env import digit_retry_env
from transformers import PreTrainedTokenizerBase

from grpo_envs.episode import episodic
from grpo_envs.types import Sample
from grpo_train.episodes.driver import EpisodeRenderer, EpisodeSettings, generate_episodes
from grpo_train.episodes.tokens import Extension
from grpo_train.rollout import make_engine
from grpo_train.rollout.base import Completion, RolloutEngine, SamplingConfig


class Recording:
    """Delegates to an engine and records each call's prompts."""

    def __init__(self, engine: RolloutEngine) -> None:
        self.engine, self.calls = engine, []
        self.name, self.last_sync_seconds = engine.name, 0.0

    def generate(
        self, prompt_token_ids: Sequence[Sequence[int]], sampling: SamplingConfig
    ) -> list[list[Completion]]:
        self.calls.append([list(p) for p in prompt_token_ids])
        return self.engine.generate(prompt_token_ids, sampling)


def test_each_turn_is_sampled_from_the_exact_history_on_the_hf_engine(
    tiny_model_path: Path,
) -> None:
    # vLLM's half runs in test_rollout_vllm.py, on that module's engine (one start saved).
    from grpo_train.models.loading import load_policy

    model, tok = load_policy(str(tiny_model_path))
    engine = make_engine("hf", tiny_model_path, dtype="float32", device="cpu")
    try:
        check_each_turn_is_sampled_from_the_exact_history(engine, model, tok)
    finally:
        engine.close()


def check_each_turn_is_sampled_from_the_exact_history(
    engine: RolloutEngine, model: torch.nn.Module, tok: PreTrainedTokenizerBase
) -> None:
    """Multi-turn episodes on ``engine`` (holding ``model``'s weights) against ``model``."""
    recording = Recording(engine)
    env = digit_retry_env(size=8)
    samples = [Sample.from_row(env.dataset("train")[i]) for i in range(2)]
    renderer = EpisodeRenderer(tok)
    prompts = [renderer.prompt_ids(s) for s in samples]
    groups = generate_episodes(
        recording, renderer, [episodic(env)] * 2, samples, prompts,  # type: ignore[arg-type]
        SamplingConfig(n=4, max_new_tokens=6, seed=3),
        EpisodeSettings(max_episode_tokens=80),
    )  # fmt: skip
    rollouts = [r for g in groups for r in g]
    assert max(r.turns for r in rollouts) > 1
    assert len(recording.calls) == max(r.turns for r in rollouts)  # one call per turn
    # Turn t's call holds exactly the histories of the episodes still live, in order.
    for t, call in enumerate(recording.calls[1:], start=1):
        live = [r for r in rollouts if r.turns > t]
        expected = []
        for r in live:
            ids = list(r.prompt_ids)
            for i in range(t):
                ids += r.completions[i].token_ids
                extension = r.continuations[i]
                assert isinstance(extension, Extension)
                ids += extension.ids
            expected.append(ids)
        assert call == expected
    # The engine's sampling logprobs are the model's on the trained ids (temperature 1).
    for r in rollouts:
        seq = r.sequence
        ids = torch.tensor([seq.input_ids])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, :-1].float()
        logp = torch.log_softmax(logits, dim=-1).gather(1, ids[0, 1:, None])[:, 0]
        mask = torch.tensor(seq.loss_mask[1:], dtype=torch.bool)
        engine_lp = torch.tensor(seq.logprobs[1:])[mask]
        torch.testing.assert_close(logp[mask], engine_lp, atol=2e-3, rtol=1e-3)
