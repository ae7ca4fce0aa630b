"""Batched multi-turn rollouts: one engine call per turn, token-exact histories and training ids."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from grpo_envs.episode import EpisodeEnd, episodic
from grpo_envs.types import Sample
from grpo_train.episodes import driver as episodes_module
from grpo_train.episodes.driver import (
    EpisodeRenderer,
    EpisodeSettings,
    EpisodeStats,
    TemplateBreakError,
    generate_episodes,
    score_episodes,
)
from grpo_train.episodes.prompts import PromptFormat
from grpo_train.episodes.reply_render import HistoryPolicy
from grpo_train.episodes.tokens import BreakPolicy, Extension, TemplateBreak
from grpo_train.models.loading import _train_tiny_tokenizer
from grpo_train.rollout.base import Completion, SamplingConfig

sys.path.insert(0, str(Path(__file__).parents[1]))
from toy_env import digit_retry_env

# Qwen3's rule, reduced: an earlier assistant turn loses its <think> block.
THINK_DROPPING = (
    "{% for m in messages %}"
    "{% if m['role'] == 'assistant' and not loop.last %}"
    "{% set c = m['content'].split('</think>')[-1].lstrip() %}"
    "{% else %}{% set c = m['content'] %}{% endif %}"
    "{{ '<|im_start|>' + m['role'] + '\\n' + c + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@pytest.fixture(scope="module")
def tok():
    return _train_tiny_tokenizer(512)


def char_level(tok, text: str) -> list[int]:
    """``text`` one character at a time: ids a sampler may emit but the tokenizer never would."""
    return [i for ch in text for i in tok.encode(ch, add_special_tokens=False)]


class ScriptedEngine:
    """An engine whose turn ``t`` for request ``r`` is ``script(t, r, history)``; records calls."""

    name = "scripted"
    last_sync_seconds = 0.0

    def __init__(self, tok, script: Callable[[int, int, list[int]], str]) -> None:
        self.tok, self.script = tok, script
        self.eos = tok.convert_tokens_to_ids("<|im_end|>")
        self.calls: list[tuple[list[list[int]], SamplingConfig]] = []

    def generate(
        self, prompt_token_ids: Sequence[Sequence[int]], sampling: SamplingConfig
    ) -> list[list[Completion]]:
        turn = len(self.calls)
        self.calls.append(([list(p) for p in prompt_token_ids], sampling))
        out = []
        for i, prompt in enumerate(prompt_token_ids):
            group = []
            for j in range(sampling.n):
                text = self.script(turn, i * sampling.n + j, list(prompt))
                ids = [*char_level(self.tok, text), self.eos][: sampling.max_new_tokens]
                stop = ids[-1] == self.eos
                logprobs = tuple(-0.01 * (k + 1) - turn for k in range(len(ids)))
                group.append(
                    Completion(i, text, tuple(ids), logprobs, "stop" if stop else "length")
                )
            out.append(group)
        return out


def setup(
    tok,
    script,
    *,
    n=2,
    prompts=2,
    max_tokens=200,
    on_break=BreakPolicy.END,
    history=HistoryPolicy.KEEP,
    fatal_breaks=False,
):
    env = digit_retry_env(size=8)
    episodes = episodic(env)
    samples = [Sample.from_row(env.dataset("train")[i]) for i in range(prompts)]
    renderer = EpisodeRenderer(tok, history=history)
    prompt_ids = [renderer.prompt_ids(s) for s in samples]
    engine = ScriptedEngine(tok, script)
    rollouts = generate_episodes(
        engine,
        renderer,
        [episodes] * prompts,
        samples,
        prompt_ids,
        SamplingConfig(n=n, max_new_tokens=64, seed=5),
        EpisodeSettings(
            max_episode_tokens=max_tokens, on_break=on_break, fatal_breaks=fatal_breaks
        ),
    )
    return engine, episodes, prompt_ids, rollouts


def test_each_turn_is_one_engine_call_over_the_live_episodes_histories_exactly(tok) -> None:
    # Request 0 answers at once; the others need a second turn.
    def script(turn: int, request: int, _history: list[int]) -> str:
        if turn == 0:
            return "7" if request == 0 else "no idea"
        return "4 it is"

    engine, episodes, prompt_ids, rollouts = setup(tok, script)
    assert len(engine.calls) == 2  # turn 0 (2 prompts x n=2) and turn 1 (the 3 live episodes)
    first_prompts, first_sampling = engine.calls[0]
    assert first_prompts == prompt_ids and first_sampling.n == 2
    second_prompts, second_sampling = engine.calls[1]
    assert second_sampling.n == 1 and second_sampling.seed == 5 + 1_000_033
    live = [r for group in rollouts for r in group if r.turns == 2]
    assert len(live) == 3 and len(second_prompts) == 3
    for history, rollout in zip(second_prompts, live):
        # The next turn's prompt is the sampled ids plus the inserted ones, never re-encoded text.
        (ext,) = rollout.continuations
        assert isinstance(ext, Extension)
        expected = [*rollout.prompt_ids, *rollout.completions[0].token_ids, *ext.ids]
        assert history == expected
        reencoded = tok.encode(tok.decode(expected), add_special_tokens=False)
        assert reencoded != expected
    done_at_once = rollouts[0][0]
    assert done_at_once.turns == 1 and done_at_once.state.end is EpisodeEnd.DONE
    scores = score_episodes([episodes] * 2, rollouts)
    assert scores[0][0].reward == 1.0
    assert [s.reward for s in scores[0][1:]] + [s.reward for s in scores[1]] == [0.9, 0.9, 0.9]


def test_trained_ids_are_the_sampled_ids_plus_the_inserted_ids_position_by_position(tok) -> None:
    def script(turn: int, _request: int, _history: list[int]) -> str:
        return ["hmm, let me see", "not yet", "3"][turn]

    _, _, prompt_ids, rollouts = setup(tok, script, n=1, prompts=1)
    (rollout,) = rollouts[0]
    assert rollout.turns == 3 and rollout.state.end is EpisodeEnd.DONE
    seq = rollout.sequence
    expected_ids, expected_mask, expected_lp = list(prompt_ids[0]), [0] * len(prompt_ids[0]), []
    expected_lp = [0.0] * len(prompt_ids[0])
    for i, completion in enumerate(rollout.completions):
        expected_ids += completion.token_ids
        expected_mask += [1] * len(completion.token_ids)
        expected_lp += completion.logprobs
        if i < 2:
            inserted = rollout.continuations[i].ids
            assert tok.decode(inserted) == (
                "\n<|im_start|>user\nSay a digit.<|im_end|>\n<|im_start|>assistant\n"
            )
            expected_ids += inserted
            expected_mask += [0] * len(inserted)
            expected_lp += [0.0] * len(inserted)
    assert list(seq.input_ids) == expected_ids
    assert list(seq.loss_mask) == expected_mask
    assert list(seq.logprobs) == expected_lp
    assert sum(rollout.loss_mask) == rollout.sampled_tokens
    assert len(rollout.completion_ids) == rollout.sampled_tokens + rollout.environment_tokens
    stats = EpisodeStats.of([rollout])
    assert stats.turns_mean == 3.0 and stats.truncated == 0 and stats.template_breaks == 0
    share = rollout.environment_tokens / (rollout.environment_tokens + rollout.sampled_tokens)
    assert stats.environment_token_share == pytest.approx(share)


def test_the_token_budget_caps_each_turn_and_cuts_the_episode(tok) -> None:
    def script(_turn: int, _request: int, _history: list[int]) -> str:
        return "no digit here at all"

    engine, _, prompt_ids, rollouts = setup(tok, script, n=1, prompts=1, max_tokens=40)
    (rollout,) = rollouts[0]
    assert len(rollout.completion_ids) <= 40
    assert rollout.state.end is EpisodeEnd.MAX_TOKENS or rollout.completions[-1].truncated
    assert rollout.truncated
    for prompts, sampling in engine.calls:  # no request may run past the context it was sized for
        assert all(len(p) + sampling.max_new_tokens <= len(prompt_ids[0]) + 40 for p in prompts)


def test_keep_extends_a_think_dropping_template_and_rerender_forks_where_it_diverges(tok) -> None:
    tok = _train_tiny_tokenizer(512)
    tok.chat_template = THINK_DROPPING

    def script(turn: int, _request: int, _history: list[int]) -> str:
        return ["<think>hmm</think>no", "5"][turn]

    engine, _, _, rollouts = setup(tok, script, n=1, prompts=1)
    (rollout,) = rollouts[0]
    (ext,) = rollout.continuations
    assert isinstance(ext, Extension) and rollout.template_breaks == 0 and rollout.turns == 2
    assert len(rollout.assembled.sequences) == 1 and rollout.forks == 0
    assert engine.calls[1][0] == [
        [*rollout.prompt_ids, *rollout.completions[0].token_ids, *ext.ids]
    ]

    engine, _, _, rollouts = setup(tok, script, n=1, prompts=1, history=HistoryPolicy.RERENDER)
    (rollout,) = rollouts[0]
    (fork,) = rollout.continuations
    assert isinstance(fork, TemplateBreak) and fork.fork and rollout.forks == 1
    assert rollout.template_breaks == 0 and rollout.state.end is EpisodeEnd.DONE
    assert engine.calls[1][0] == [list(fork.restart_ids)]  # the template's view of the history
    assert "hmm" not in tok.decode(fork.restart_ids)
    first, second = rollout.assembled.sequences
    assert first.input_ids[first.prompt_len :] == rollout.completions[0].token_ids
    assert second.input_ids == (*fork.restart_ids, *rollout.completions[1].token_ids)
    assert EpisodeStats.of([rollout]).sequences_mean == 2.0


# Renders the start-up check's replies, then fails on the environment's own reply.
FAILS_AT_RUN_TIME = (
    "{% for m in messages %}"
    "{% if m['content'] == 'Say a digit.' %}{{ raise_exception('unsupported reply') }}{% endif %}"
    "{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@pytest.mark.parametrize("policy", [BreakPolicy.END, BreakPolicy.SPLIT])
def test_a_reply_the_template_cannot_render_is_a_loud_break(
    tok, policy: BreakPolicy, caplog: pytest.LogCaptureFixture
) -> None:
    tok = _train_tiny_tokenizer(512)
    tok.chat_template = FAILS_AT_RUN_TIME
    episodes_module._WARNED.clear()

    def script(turn: int, _request: int, _history: list[int]) -> str:
        return ["no", "5"][turn]

    with caplog.at_level("WARNING"):
        engine, _, _, rollouts = setup(tok, script, n=2, prompts=1, on_break=policy)
    warnings = [r.getMessage() for r in caplog.records if "could not be rendered" in r.message]
    assert len(warnings) == 1  # the first time only
    assert "after turn 1" in warnings[0] and "unsupported reply" in warnings[0]
    for rollout in rollouts[0]:
        assert rollout.template_breaks == 1 and len(rollout.assembled.breaks) == 1
        assert isinstance(rollout.end_break, TemplateBreak) and not rollout.continuations
        assert rollout.state.end is EpisodeEnd.TEMPLATE_BREAK and len(engine.calls) == 1
    assert EpisodeStats.of(rollouts[0]).metrics()["episodes/broken_share"] == 1.0
    with pytest.raises(TemplateBreakError, match="after turn 1"):
        setup(tok, script, n=1, prompts=1, fatal_breaks=True)


def test_plain_text_models_append_the_observation_text(tok) -> None:
    env = digit_retry_env(size=4)
    sample = Sample.from_row(env.dataset("train")[0])
    renderer = EpisodeRenderer(tok, PromptFormat(chat_template="plain"))
    engine = ScriptedEngine(tok, lambda turn, _r, _h: ["no", "1"][turn])
    (group,) = generate_episodes(
        engine, renderer, [episodic(env)], [sample], [renderer.prompt_ids(sample)],
        SamplingConfig(n=1, max_new_tokens=16), EpisodeSettings(max_episode_tokens=100),
    )  # fmt: skip
    (ext,) = group[0].continuations
    assert isinstance(ext, Extension) and tok.decode(ext.ids) == "Say a digit.\n"
