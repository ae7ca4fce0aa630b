"""``grpo_update`` on hand-built rollout batches: per-token loss masks, the batch contract."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch

from grpo_train.algorithm.choices import LossType
from grpo_train.algorithm.objective import ObjectiveSettings, grpo_loss
from grpo_train.collect.batch import RolloutBatch
from grpo_train.config import TrainConfig
from grpo_train.learner.forward import token_logprobs
from grpo_train.learner.micro_batches import make_micro_batches
from grpo_train.learner.update import Learner, UpdateSettings, grpo_update
from grpo_train.setup.settings import update_settings

PROMPTS = ((11, 12, 13), (14, 15))
COMPLETIONS = ((20, 21, 22, 23, 24), (25, 26), (27, 28, 29, 30), (31, 32, 33))


def make_batch(loss_mask: tuple[torch.Tensor, ...]) -> RolloutBatch:
    """Two prompts with two completions each; completion 0 is a multi-turn episode."""
    return RolloutBatch(
        prompt_ids=PROMPTS,
        completion_ids=COMPLETIONS,
        loss_mask=loss_mask,
        sampling_logprobs=tuple((0.0,) * len(c) for c in COMPLETIONS),
        rewards=torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64),
        scored=torch.ones(2, 2, dtype=torch.bool),
        trainable=torch.ones(2, 2, dtype=torch.bool),
        truncated=torch.zeros(2, 2, dtype=torch.bool),
        env_index=torch.zeros(2, dtype=torch.long),
    )


def all_tokens() -> tuple[torch.Tensor, ...]:
    return tuple(torch.ones(len(c), dtype=torch.bool) for c in COMPLETIONS)


def _settings(**values: object) -> UpdateSettings:
    """The update settings of ``TrainConfig.from_flat(values)``, built as a run builds them."""
    return update_settings(TrainConfig.from_flat(values))


def test_update_settings_read_the_run_configuration() -> None:
    cfg = TrainConfig.from_flat(
        {"beta": 0.1, "mu": 2, "loss_type": "dr_grpo", "max_completion_length": 77,
         "temperature": 0.5, "micro_batch_tokens": 99, "is_cap": 2.0, "mask_truncated": True}
    )  # fmt: skip
    settings = update_settings(cfg)
    assert settings.objective == ObjectiveSettings(
        beta=0.1, loss_type=LossType.DR_GRPO, max_completion_length=77
    )
    assert (settings.mu, settings.temperature, settings.micro_batch_tokens) == (2, 0.5, 99)
    assert (settings.is_cap, settings.mask_truncated, settings.is_correction) == (2.0, True, True)
    # grpo_loss's defaults (ObjectiveSettings') are the configuration's
    defaults = update_settings(TrainConfig()).objective
    assert dataclasses.replace(defaults, max_completion_length=None) == ObjectiveSettings()


def gradients(model: torch.nn.Module, batch: RolloutBatch, settings: UpdateSettings) -> dict:
    """Run ``grpo_update`` and return its loss and the gradients it would step with."""
    captured: dict = {}

    def capture(loss: float) -> float:
        captured["loss"] = loss
        captured["grads"] = {n: p.grad.clone() for n, p in model.named_parameters()}
        model.zero_grad(set_to_none=True)
        return 0.0

    advantages = torch.tensor([[1.0, -1.0], [-0.5, 0.5]])
    grpo_update(Learner(model, pad_id=0), capture, batch, advantages, settings)
    return captured


@pytest.mark.parametrize("loss_type", ["dapo", "grpo"])
def test_masked_tokens_inside_a_completion_get_no_gradient_and_no_weight(
    tiny_model_path: Path, loss_type: str
) -> None:
    """Tool output inside a completion: in the forward pass, out of the loss and normalisers."""
    from grpo_train.models.loading import load_policy

    model, _ = load_policy(str(tiny_model_path))
    settings = _settings(loss_type=loss_type, is_correction=False, micro_batch_tokens=10**6)
    # Tokens 1-2 of completion 0 came from the environment (e.g. a tool's reply), not the policy.
    episode = torch.tensor([True, False, False, True, True])
    masked = make_batch((episode, *all_tokens()[1:]))
    assert masked.trained_tokens(torch.ones(4)) == 12  # 14 tokens, 2 masked
    got = gradients(model, masked, settings)

    # Textbook: one plain forward of every row, the loss over the policy's own tokens only,
    # normalised by their count (DAPO: 12 tokens; GRPO: a mean over each row's own tokens).
    prompts = [p for p in PROMPTS for _ in range(2)]
    (mb,) = make_micro_batches(prompts, COMPLETIONS, 10**6, 0)
    logprobs, _ = token_logprobs(model, mb)
    mask = mb.completion_mask.float()
    rows = list(mb.rows)
    for b, r in enumerate(rows):
        if r == 0:
            mask[b, 1:3] = 0.0
    advantages = torch.tensor([1.0, -1.0, -0.5, 0.5])[rows]
    loss, _ = grpo_loss(logprobs, logprobs.detach(), advantages, mask, loss_type=loss_type)
    loss.backward()
    assert got["loss"] == pytest.approx(loss.item(), abs=1e-6)
    for name, p in model.named_parameters():
        torch.testing.assert_close(got["grads"][name], p.grad, atol=1e-6, rtol=1e-4, msg=name)
    model.zero_grad(set_to_none=True)

    # Unmasked, the same rows give another gradient: the mask is what changed it.
    full = gradients(model, make_batch(all_tokens()), settings)
    differs = max(float((full["grads"][n] - g).abs().max()) for n, g in got["grads"].items())
    assert differs > 1e-4


def test_rollout_batch_names_the_field_that_does_not_fit() -> None:
    short = (torch.ones(4, dtype=torch.bool), *all_tokens()[1:])  # completion 0 has 5 tokens
    with pytest.raises(ValueError, match=r"loss_mask row 0 .* 5 tokens"):
        make_batch(short)
    with pytest.raises(ValueError, match="loss_mask needs 4 rows"):
        make_batch(all_tokens()[:3])
    batch = make_batch(all_tokens())
    assert batch.group_size == 2 and batch.row_prompts()[2] == PROMPTS[1]
    with pytest.raises(AttributeError):
        batch.padding = True  # type: ignore[misc]  # immutable


def test_clip_and_step_clips_steps_and_skips_a_non_finite_update_until_the_limit() -> None:
    """A finite update is clipped to max_grad_norm and stepped; a NaN one is skipped and counted."""
    from grpo_train.learner.update import ClipAndStep
    from grpo_train.run.stop import TrainingAborted

    weight = torch.nn.Parameter(torch.zeros(2))
    model = torch.nn.Module()
    model.weight = weight
    optimizer = torch.optim.SGD([weight], lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    step = ClipAndStep(
        model, optimizer, scheduler, max_grad_norm=1.0, max_bad_steps=2, last_good=lambda: "ckpt-1"
    )
    weight.grad = torch.tensor([3.0, 4.0])  # norm 5, clipped to norm 1: (0.6, 0.8)
    assert step(0.5) == pytest.approx(5.0)
    assert torch.allclose(weight.detach(), torch.tensor([-0.6, -0.8]))
    assert weight.grad is None and step.bad_in_a_row == 0
    weight.grad = torch.tensor([1.0, 1.0])
    step(float("nan"))  # skipped: the weights stay, the gradient is cleared
    assert torch.allclose(weight.detach(), torch.tensor([-0.6, -0.8]))
    assert step.bad_in_a_row == 1 and weight.grad is None
    weight.grad = torch.tensor([float("inf"), 0.0])
    with pytest.raises(TrainingAborted, match=r"2 updates in a row.*ckpt-1"):
        step(0.1)
    assert torch.allclose(weight.detach(), torch.tensor([-0.6, -0.8]))


@pytest.mark.parametrize("budget", [10**6, 16])
def test_packed_update_equals_the_padded_one(tiny_model_path: Path, budget: int) -> None:
    """Padding-free micro-batches (one pack, or one row per pack): same loss and gradients."""
    from grpo_train.models.loading import load_policy

    model, _ = load_policy(str(tiny_model_path))
    settings = _settings(loss_type="grpo", micro_batch_tokens=budget, beta=0.0)
    batch = make_batch(all_tokens())
    advantages = torch.tensor([[1.0, -1.0], [-0.5, 0.5]])
    results = []
    for packed in (False, True):
        captured: dict = {}

        def capture(loss: float, captured: dict = captured) -> float:
            captured["loss"] = loss
            captured["grads"] = {n: p.grad.clone() for n, p in model.named_parameters()}
            model.zero_grad(set_to_none=True)
            return 0.0

        metrics = grpo_update(
            Learner(model, pad_id=0, packing="always" if packed else "never"),
            capture,
            batch,
            advantages,
            settings,
        )
        results.append((captured, metrics))
    (padded, padded_metrics), (packed_run, packed_metrics) = results
    assert packed_run["loss"] == pytest.approx(padded["loss"], abs=1e-6)
    assert packed_metrics["entropy"] == pytest.approx(padded_metrics["entropy"], rel=1e-5)
    for name, grad in padded["grads"].items():
        torch.testing.assert_close(packed_run["grads"][name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_auto_packing_packs_only_the_steps_where_padding_costs_more(tiny_model_path: Path) -> None:
    """``when_cheaper`` (``packing: auto`` beside the shared-prompt forward), step by step."""
    from grpo_train.models.loading import load_policy

    model, _ = load_policy(str(tiny_model_path))
    settings = _settings(loss_type="dapo", micro_batch_tokens=10**6, beta=0.0)
    advantages = torch.tensor([[1.0, -1.0], [-0.5, 0.5]])

    def batch_of(completions: tuple[tuple[int, ...], ...]) -> RolloutBatch:
        return dataclasses.replace(
            make_batch(all_tokens()),
            completion_ids=completions,
            loss_mask=tuple(torch.ones(len(c), dtype=torch.bool) for c in completions),
            sampling_logprobs=tuple((0.0,) * len(c) for c in completions),
        )

    def update(packing: str, batch: RolloutBatch) -> tuple[dict, dict]:
        captured: dict = {}

        def capture(loss: float) -> float:
            captured["grads"] = {n: p.grad.clone() for n, p in model.named_parameters()}
            model.zero_grad(set_to_none=True)
            return 0.0

        learner = Learner(model, pad_id=0, share_prompts=True, packing=packing)  # type: ignore[arg-type]
        return grpo_update(learner, capture, batch, advantages, settings), captured

    # Equal lengths: 2 prompts once + 4 x 4 completion positions (22) < 26 packed positions.
    uniform = batch_of(((20, 21, 22, 23), (24, 25, 26, 27), (28, 29, 30, 31), (32, 33, 34, 35)))
    assert update("when_cheaper", uniform)[0]["packed"] == 0.0
    # One long completion pads the other three: 2 x 3 + 4 x 12 = 54 > 27 packed positions.
    long = tuple(range(40, 52))
    skewed = batch_of((long, (20,), (21,), (22,)))
    metrics, auto = update("when_cheaper", skewed)
    assert metrics["packed"] == 1.0
    _, always = update("always", skewed)
    _, padded = update("never", skewed)
    for name, grad in always["grads"].items():
        assert torch.equal(auto["grads"][name], grad), name  # the same packed path, bitwise
        torch.testing.assert_close(padded["grads"][name], grad, rtol=1e-4, atol=1e-6, msg=name)


class RecordingDeepSpeedEngine:
    """The calls accelerate's ``DeepSpeedEngineWrapper.backward`` makes on DeepSpeed's engine."""

    def __init__(self) -> None:
        self.boundaries: list[bool] = []
        self.steps = 0

    def set_gradient_accumulation_boundary(self, is_boundary: bool) -> None:
        self.boundaries.append(is_boundary)

    def backward(self, loss: torch.Tensor, **kwargs: object) -> None:
        loss.backward()

    def step(self) -> None:  # DeepSpeed's optimizer step (clip, step, zero)
        self.steps += 1


@pytest.mark.parametrize(("mu", "micro_batch_tokens"), [(1, 16), (2, 16), (1, 10**6), (2, 10**6)])
def test_deepspeed_steps_once_per_optimizer_step_whatever_the_micro_batches(
    tiny_model_path: Path, monkeypatch: pytest.MonkeyPatch, mu: int, micro_batch_tokens: int
) -> None:
    """accelerate's own backward under DeepSpeed steps the engine whenever ``sync_gradients``
    is set; the update sets it on the last micro-batch of each pass only."""
    from accelerate import Accelerator
    from accelerate.utils import DistributedType
    from accelerate.utils.deepspeed import DeepSpeedEngineWrapper

    from grpo_train.models.loading import load_policy

    model, _ = load_policy(str(tiny_model_path))
    accelerator = Accelerator(cpu=True)
    monkeypatch.setattr(accelerator.state, "distributed_type", DistributedType.DEEPSPEED)
    engine = RecordingDeepSpeedEngine()
    accelerator.deepspeed_engine_wrapped = DeepSpeedEngineWrapper(engine)
    passes: list[bool] = []  # sync_gradients as the optimizer step sees it

    def optimizer_step(loss: float) -> float:
        passes.append(accelerator.sync_gradients)
        model.zero_grad(set_to_none=True)
        return 0.0

    settings = _settings(mu=mu, micro_batch_tokens=micro_batch_tokens)
    learner = Learner(model, pad_id=0, accelerator=accelerator)
    advantages = torch.tensor([[1.0, -1.0], [-0.5, 0.5]])
    grpo_update(learner, optimizer_step, make_batch(all_tokens()), advantages, settings)
    per_pass = len(engine.boundaries) // mu
    assert len(engine.boundaries) == per_pass * mu and per_pass >= 1
    assert engine.boundaries == ([False] * (per_pass - 1) + [True]) * mu
    assert engine.steps == mu and passes == [True] * mu
    assert accelerator.sync_gradients  # left as accelerate's default
    if micro_batch_tokens == 16:
        assert per_pass > 1  # the case that matters: several micro-batches


class SteppingDeepSpeedEngine(RecordingDeepSpeedEngine):
    """DeepSpeed's engine step as its source has it (``DeepSpeedEngine._take_model_step``,
    ZeRO-1/2's ``step``): non-finite gradients skip the optimizer step (``was_step_applied()``
    False) and leave the norm of the last applied step (None before the first); finite ones are
    clipped at ``gradient_clipping`` and stepped. Either way the gradients are zeroed."""

    def __init__(self, optimizer: torch.optim.Optimizer, gradient_clipping: float) -> None:
        super().__init__()
        self.optimizer, self.gradient_clipping = optimizer, gradient_clipping
        self.applied, self.norm = False, None  # DeepSpeed's _step_applied, _global_grad_norm
        self.optimizer_steps = 0

    def step(self) -> None:
        super().step()
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        norm = torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in params]))
        self.applied = bool(torch.isfinite(norm))
        if self.applied:
            self.norm = norm  # a tensor, as ZeRO's scaled_global_norm() / loss scale
            torch.nn.utils.clip_grad_norm_(params, self.gradient_clipping)
            self.optimizer.step()
            self.optimizer_steps += 1
        self.optimizer.zero_grad(set_to_none=True)

    def was_step_applied(self) -> bool:
        return self.applied

    def get_global_grad_norm(self) -> torch.Tensor | None:
        return self.norm


def test_clip_and_step_under_deepspeed_counts_skipped_steps_and_steps_nothing_twice(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Under DeepSpeed the engine clips and steps inside accelerator.backward (accelerate's own
    wrappers here): the optimizer is not stepped again, the run's scheduler steps once per
    applied step, and a step DeepSpeed skipped (no norm, or its last applied step's) is a bad
    one toward max_bad_steps."""
    from accelerate import Accelerator
    from accelerate.utils import DistributedType
    from accelerate.utils.deepspeed import DeepSpeedEngineWrapper, DeepSpeedOptimizerWrapper

    from grpo_train.learner.update import ClipAndStep
    from grpo_train.parallel.distributed import engine_stepping_in_backward
    from grpo_train.run.stop import TrainingAborted

    weight = torch.nn.Parameter(torch.zeros(2))
    model = torch.nn.Module()
    model.weight = weight
    inner = torch.optim.SGD([weight], lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(inner, lambda step: 1.0 / (1 + step))
    accelerator = Accelerator(cpu=True)
    # What prepare() returns for the optimizer (made first: it re-reads accelerate's state).
    prepared = DeepSpeedOptimizerWrapper(inner)
    monkeypatch.setattr(accelerator.state, "distributed_type", DistributedType.DEEPSPEED)
    engine = SteppingDeepSpeedEngine(inner, gradient_clipping=1.0)
    accelerator.deepspeed_engine_wrapped = DeepSpeedEngineWrapper(engine)
    # setup.run's wiring: accelerate's clip_grad_norm_ (the engine's norm), the engine.
    step = ClipAndStep(
        model, prepared, scheduler, max_grad_norm=1.0, max_bad_steps=2,
        clip=accelerator.clip_grad_norm_, last_good=lambda: "ckpt-1",
        engine=engine_stepping_in_backward(accelerator),
    )  # fmt: skip

    def backward_and_step(grad: list[float], loss: float) -> float:
        accelerator.backward((weight * torch.tensor(grad)).sum())  # the pass's last micro-batch
        return step(loss)

    with caplog.at_level("WARNING", logger="grpo_train"):
        # Skipped on the very first step: DeepSpeed has no norm yet (None).
        assert math.isnan(backward_and_step([float("inf"), 0.0], float("nan")))
    assert step.bad_in_a_row == 1 and scheduler.last_epoch == 0
    assert "DeepSpeed skipped the update (1 in a row)" in caplog.text
    assert torch.equal(weight.detach(), torch.zeros(2))
    # Applied: clipped by the engine (norm 5 -> 1), stepped once, the scheduler once.
    assert backward_and_step([3.0, 4.0], 0.5) == pytest.approx(5.0)
    assert torch.allclose(weight.detach(), torch.tensor([-0.6, -0.8]))
    assert (engine.optimizer_steps, scheduler.last_epoch, step.bad_in_a_row) == (1, 1, 0)
    assert inner.param_groups[0]["lr"] == pytest.approx(0.5)
    # Skipped again: DeepSpeed still reports the applied step's norm (5), which must not count.
    assert math.isnan(backward_and_step([float("inf"), 0.0], 0.1))
    assert step.bad_in_a_row == 1 and scheduler.last_epoch == 1
    with pytest.raises(TrainingAborted, match=r"2 updates in a row.*ckpt-1"):
        backward_and_step([0.0, float("nan")], 0.1)
    assert torch.allclose(weight.detach(), torch.tensor([-0.6, -0.8]))
    assert engine.steps == 4 and engine.optimizer_steps == 1 and scheduler.last_epoch == 1


def test_the_kl_reference_runs_once_per_micro_batch_per_update_while_resident(
    tiny_model_path: Path,
) -> None:
    """The reference does not change during an update: ``mu`` passes read it once per scheduled
    micro-batch, all inside one ``reference_resident`` (an offloaded copy moves to the device
    once per update, not per micro-batch and pass: 15 GB each way for a 7B model), before the
    policy's first forward."""
    from grpo_train.models.loading import load_policy

    model, _ = load_policy(str(tiny_model_path))
    reference, _ = load_policy(str(tiny_model_path))
    events: list[str] = []
    resident = [False]

    class Resident:
        def __enter__(self) -> None:
            events.append("resident")
            resident[0] = True

        def __exit__(self, *exc: object) -> None:
            events.append("offloaded")
            resident[0] = False

    def under_reference(mb) -> torch.Tensor:
        events.append("reference" if resident[0] else "reference outside")
        return token_logprobs(reference, mb, 1.0)[0]

    model.register_forward_pre_hook(lambda module, args: events.append("policy"))
    settings = _settings(loss_type="grpo", micro_batch_tokens=16, beta=0.1, mu=2)
    learner = Learner(model, pad_id=0, reference=under_reference, reference_resident=Resident)
    captured: list[float] = []
    grpo_update(
        learner, lambda loss: captured.append(loss) or 0.0, make_batch(all_tokens()),
        torch.tensor([[1.0, -1.0], [-0.5, 0.5]]), settings,
    )  # fmt: skip
    passes = events.count("policy") // 2  # policy forwards per pass (mu = 2)
    assert passes >= 2 and len(captured) == 2
    assert events[: passes + 2] == ["resident", *["reference"] * passes, "offloaded"]
    assert events[passes + 2 :] == ["policy"] * (2 * passes)
