"""``logprob_head: liger``: Liger-Kernel's fused linear GRPO loss against ours.

The formula (``liger_grpo_loss`` against ``grpo_loss`` over ``fused_logprobs``) for every loss
type, ratio level, KL weight, temperature and importance-weight shape, then whole updates
(``grpo_update``) of a tiny Qwen3-architecture model against the fused head, through the
padded, shared-prompt and packed forwards, LoRA, tied embeddings, ``mu = 2`` and the KL reference.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import pytest
import torch

from grpo_train.algorithm.choices import ImportanceLevel, LossType
from grpo_train.algorithm.objective import ObjectiveSettings, grpo_loss
from grpo_train.collect.batch import RolloutBatch
from grpo_train.config import TrainConfig
from grpo_train.learner.forward import token_logprobs
from grpo_train.learner.liger_loss import MISSING, liger_grpo_loss
from grpo_train.learner.logprobs import HeadChoice, fused_logprobs
from grpo_train.learner.update import Learner, UpdateSettings, grpo_update
from grpo_train.setup.settings import update_settings

pytest.importorskip("liger_kernel", reason="the dev extras install liger-kernel")

B, C, H, V = 3, 7, 16, 50


def _inputs(seed: int = 0, dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(seed)
    head = torch.nn.Linear(H, V, bias=False).to(dtype)
    with torch.no_grad():
        head.weight.copy_(torch.randn(V, H, generator=gen))
    mask = torch.ones(B, C)
    mask[1, 4:] = 0.0  # a short completion
    mask[2, 1:3] = 0.0  # a tool's output inside a multi-turn completion
    return {
        "head": head,
        "hidden": torch.randn(B, C, H, generator=gen).to(dtype).requires_grad_(True),
        "ids": torch.randint(0, V, (B, C), generator=gen),
        "mask": mask,
        "adv": torch.tensor([0.5, -1.0, 0.3]),
        "ref": torch.randn(B, C, generator=gen) * 0.3 - 4.0,
        "shift": torch.randn(B, C, generator=gen) * 0.3,  # old policy = current - shift
        "weights": torch.rand(B, C, generator=gen) + 0.5,
    }


def _ours_and_liger(
    x: dict[str, Any], a: ObjectiveSettings, temperature: float, weights: Any, old: bool
):
    """Loss and (hidden, weight) gradients of ``grpo_loss`` over the fused head, and Liger's."""
    lp, _ = fused_logprobs(x["head"], x["hidden"], x["ids"], temperature, False, vocab=V)
    old_lp = (lp.detach() - x["shift"]) if old else lp.detach()
    ref = x["ref"] if a.beta > 0 else None
    ours, _ = grpo_loss(
        lp, old_lp, x["adv"], x["mask"], ref_logprobs=ref, beta=a.beta,
        epsilon_low=a.epsilon_low, epsilon_high=a.epsilon_high, loss_type=a.loss_type,
        max_completion_length=C, importance_weights=weights,
        importance_sampling_level=a.importance_sampling_level,
    )  # fmt: skip
    params = [x["hidden"], x["head"].weight]
    ours_grads = torch.autograd.grad(ours, params)
    theirs = liger_grpo_loss(
        x["head"], x["hidden"], x["ids"], x["mask"], x["adv"], replace(a, max_completion_length=C),
        temperature=temperature, old_logprobs=old_lp if old else None, ref_logprobs=ref,
        importance_weights=weights,
    )  # fmt: skip
    theirs_grads = torch.autograd.grad(theirs, params)
    return (ours.detach(), ours_grads), (theirs.detach(), theirs_grads)


def _close(ours: Any, theirs: Any, rtol: float, atol: float) -> None:
    (loss, grads), (liger_loss, liger_grads) = ours, theirs
    torch.testing.assert_close(liger_loss, loss, rtol=rtol, atol=atol)
    for mine, other in zip(grads, liger_grads):
        scale = float(mine.abs().max()) + 1e-12
        assert float((mine.float() - other.float()).abs().max()) <= rtol * scale + atol


@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "dr_grpo"])
@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("beta", [0.0, 0.1])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("old", [False, True])
def test_liger_loss_equals_ours_without_importance_weights(
    loss_type, level, beta, temperature, old
):
    a = ObjectiveSettings(
        loss_type=LossType(loss_type), importance_sampling_level=ImportanceLevel(level), beta=beta
    )
    ours, theirs = _ours_and_liger(_inputs(), a, temperature, None, old)
    _close(ours, theirs, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "dr_grpo"])
def test_per_token_importance_weights_token_level_equal_sequence_level_by_row_mean(loss_type):
    """Token ratios: equal. GSPO's sequence ratio: Liger (as TRL) weighs the sequence ratio's
    gradient by the row's weights spread evenly over its tokens, ours weighs each token's own
    gradient: the same loss value, and Liger's gradient is ours with each row's weights
    replaced by their mean over the row's tokens (equal when a row's weights agree)."""
    x = _inputs(seed=3)
    token = ObjectiveSettings(loss_type=LossType(loss_type), beta=0.1)
    ours, theirs = _ours_and_liger(x, token, 0.7, x["weights"], True)
    _close(ours, theirs, rtol=1e-5, atol=1e-7)
    sequence = ObjectiveSettings(
        loss_type=LossType(loss_type), importance_sampling_level=ImportanceLevel.SEQUENCE, beta=0.1
    )
    ours, theirs = _ours_and_liger(x, sequence, 0.7, x["weights"], True)
    torch.testing.assert_close(theirs[0], ours[0], rtol=1e-5, atol=1e-7)
    differs = max(float((m - o).abs().max()) for m, o in zip(ours[1], theirs[1]))
    assert differs > 1e-3  # per-token weights do act differently on the gradient
    mask = x["mask"]
    row_mean = (x["weights"] * mask).sum(1, keepdim=True) / mask.sum(1, keepdim=True)
    ours_by_row, _ = _ours_and_liger(x, sequence, 0.7, row_mean.expand(B, C), True)
    _close(ours_by_row, theirs, rtol=1e-5, atol=1e-7)


def test_liger_loss_in_bfloat16_within_its_rounding() -> None:
    a = ObjectiveSettings(loss_type=LossType.DAPO, beta=0.1)
    ours, theirs = _ours_and_liger(_inputs(dtype=torch.bfloat16), a, 0.7, None, True)
    _close(ours, theirs, rtol=2e-2, atol=1e-3)


def test_liger_refuses_an_output_layer_that_is_not_one_matrix() -> None:
    x = _inputs()
    wrapped = torch.nn.Sequential(x["head"])
    with pytest.raises(TypeError, match=r"Sequential.*logprob_head: auto"):
        liger_grpo_loss(
            wrapped, x["hidden"], x["ids"], x["mask"], x["adv"],
            ObjectiveSettings(max_completion_length=C), temperature=1.0,
        )  # fmt: skip


def test_config_accepts_liger_and_the_missing_package_is_one_fix_it_line(monkeypatch) -> None:
    from grpo_train.learner import liger_loss
    from grpo_train.setup import run as run_setup
    from grpo_train.setup.settings import head_choice

    cfg = TrainConfig.from_flat({"logprob_head": "liger"})
    assert head_choice(cfg).path == "liger"
    assert HeadChoice("liger").fuses(1, 2)  # log-probs alone (the KL reference): the fused head
    monkeypatch.setattr(liger_loss, "liger_installed", lambda: False)
    with pytest.raises(ValueError, match="pip install liger-kernel") as error:
        run_setup.check_logprob_head(cfg)
    assert str(error.value) == MISSING


# Whole updates through the model.

PROMPTS = ((11, 12, 13), (14, 15))
COMPLETIONS = ((20, 21, 22, 23, 24, 25, 26, 27, 28), (29, 30), (31, 32, 33, 34), (35,))


def _qwen3(tied: bool = False) -> Any:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=tied,
    )  # fmt: skip
    return Qwen3ForCausalLM(config).train()


def _batch() -> RolloutBatch:
    gen = torch.Generator().manual_seed(5)
    return RolloutBatch(
        prompt_ids=PROMPTS,
        completion_ids=COMPLETIONS,
        loss_mask=tuple(torch.ones(len(c), dtype=torch.bool) for c in COMPLETIONS),
        # the engine's log-probs: importance weights that differ token by token
        sampling_logprobs=tuple(
            tuple((torch.rand(len(c), generator=gen) - 6).tolist()) for c in COMPLETIONS
        ),
        rewards=torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64),
        scored=torch.ones(2, 2, dtype=torch.bool),
        trainable=torch.ones(2, 2, dtype=torch.bool),
        truncated=torch.zeros(2, 2, dtype=torch.bool),
        env_index=torch.zeros(2, dtype=torch.long),
    )


def _update(model: Any, head: str, settings: UpdateSettings, **learner: Any) -> tuple[dict, dict]:
    """One ``grpo_update`` with SGD (lr 0.5: visible moves); the parameters after it, metrics."""
    model = copy.deepcopy(model)
    trained = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(trained, lr=0.5)

    def step(loss: float) -> float:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return 0.0

    if learner.pop("reference", False):
        frozen = copy.deepcopy(model).eval()

        def reference(mb: Any) -> torch.Tensor:
            with torch.no_grad():
                return token_logprobs(frozen, mb, settings.temperature)[0].float() - 0.05

        learner["reference"] = reference
    metrics = grpo_update(
        Learner(model, pad_id=0, head=HeadChoice(head), **learner),  # type: ignore[arg-type]
        step,
        _batch(),
        torch.tensor([[1.0, -1.0], [-0.5, 0.5]]),
        settings,
    )
    return {n: p.detach().clone() for n, p in model.named_parameters()}, metrics


@pytest.mark.parametrize(
    "case",
    ["padded", "shared prompts", "packed", "tied", "lora", "mu 2 + kl", "grpo, sequence"],
)
def test_a_liger_update_moves_the_model_as_the_fused_head_does(case: str) -> None:
    model = _qwen3(tied=case == "tied")
    flat: dict[str, Any] = {"temperature": 0.8, "micro_batch_tokens": 16, "beta": 0.0}
    learner: dict[str, Any] = {}
    if case == "shared prompts":
        learner["share_prompts"] = True
        flat["micro_batch_tokens"] = 10**6
    if case == "packed":
        learner["packing"] = "always"
    if case == "lora":
        from grpo_train.learner.lora import LoraSettings, apply_lora

        model = apply_lora(model, LoraSettings(lora_r=4, lora_alpha=8, target_modules=("q_proj",)))
    if case == "mu 2 + kl":
        flat.update(mu=2, beta=0.1)
        learner["reference"] = True
    if case == "grpo, sequence":
        flat.update(loss_type="grpo", importance_sampling_level="sequence", is_correction=False)
    settings = update_settings(TrainConfig.from_flat(flat))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    fused, fused_metrics = _update(model, "fused", settings, **learner)
    liger, liger_metrics = _update(model, "liger", settings, **learner)
    moved = 0
    for name, value in fused.items():
        update = value - before[name]
        moved += int(bool(update.abs().max() > 0))
        scale = float(update.abs().max()) + 1e-12
        err = float((liger[name] - value).abs().max())
        assert err <= 1e-4 * scale + 1e-7, (name, err, scale)
    assert moved > 0
    assert liger_metrics["loss"] == pytest.approx(fused_metrics["loss"], rel=1e-4, abs=1e-7)
    for key in ("entropy", "clip_frac", "ratio_mean", "kl", "is_ratio_mean"):
        if key in fused_metrics:
            assert liger_metrics[key] == pytest.approx(fused_metrics[key], rel=1e-5, abs=1e-7), key


def test_a_training_run_with_liger_follows_the_fused_run(tiny_model_path, tmp_path) -> None:
    """The trainer end to end (start-up check, learner, update): one step of each, same seed."""
    from test_trainer import make_config, run

    from grpo_train.run.run_log import read_metrics

    common = {"max_steps": 1, "eval_size": 0, "log_every_samples": 0, "seed": 2, "mu": 2}
    fused, _ = run(make_config(tiny_model_path, tmp_path / "fused", logprob_head="fused", **common))
    liger, _ = run(make_config(tiny_model_path, tmp_path / "liger", logprob_head="liger", **common))
    assert liger.setup.learner.head.path == "liger"
    f_row, l_row = read_metrics(tmp_path / "fused")[0], read_metrics(tmp_path / "liger")[0]
    assert l_row["reward/mean"] == f_row["reward/mean"] > 0  # the same rollouts, a signal
    assert l_row["loss"] == pytest.approx(f_row["loss"], rel=1e-4, abs=1e-7)
    assert l_row["entropy"] == pytest.approx(f_row["entropy"], rel=1e-5)
    # AdamW's first steps move a parameter by about lr x sign(gradient), so one whose gradient is
    # float noise may step either way: compare the whole update, not element by element.
    from transformers import AutoModelForCausalLM

    start = AutoModelForCausalLM.from_pretrained(tiny_model_path).state_dict()

    def update(trainer: Any) -> torch.Tensor:
        state = trainer.setup.model.state_dict()
        return torch.cat([(state[k] - v).flatten() for k, v in start.items() if k in state])

    ours, theirs = update(fused), update(liger)
    assert float(ours.norm()) > 0
    assert float(torch.nn.functional.cosine_similarity(ours, theirs, dim=0)) > 0.999
    assert float(theirs.norm() / ours.norm()) == pytest.approx(1.0, abs=1e-3)


@pytest.mark.filterwarnings("ignore:Model has `tie_word_embeddings=True`:UserWarning")
def test_liger_with_lora_on_the_lm_head_is_refused_at_start_up(tiny_model_path, tmp_path) -> None:
    from test_trainer import make_config

    from grpo_train.trainer import Trainer

    cfg = make_config(
        tiny_model_path, tmp_path, logprob_head="liger", lora_r=4, target_modules="q_proj,lm_head"
    )
    with pytest.raises(ValueError, match=r"liger runs the output layer.*logprob_head: auto"):
        Trainer(cfg)
