import json
import math
import os
import signal

import pytest
import torch
from toy_env import DigitEnv

from grpo_envs.types import Sample
from grpo_train.config import TrainConfig
from grpo_train.episodes.prompts import encode_prompt
from grpo_train.learner.forward import token_logprobs
from grpo_train.learner.micro_batches import make_micro_batches
from grpo_train.rollout.base import SamplingConfig
from grpo_train.run.checkpoint import latest_checkpoint
from grpo_train.run.run_log import read_metrics
from grpo_train.run.stop import TrainingAborted
from grpo_train.trainer import Trainer

# Metrics that depend on wall time or memory, not on the computation.
NON_DETERMINISTIC = ("time/", "tokens_per_s", "throughput/", "memory/")


def make_config(model_path, out, **overrides):
    values = {
        "model": str(model_path),
        "engine": "hf",
        "num_generations": 8,
        "prompts_per_step": 4,
        "max_prompt_length": 64,
        "max_completion_length": 4,
        "learning_rate": 1e-2,
        "max_steps": 2,
        "output_dir": str(out),
        "eval_size": 8,
        "save_every": 0,
        "progress": False,
        "log_every_samples": 1,
        "seed": 3,
    }
    values.update(overrides)
    return TrainConfig.from_flat(values)


def run(config, env=None):
    trainer = Trainer(config, env=env or DigitEnv())
    try:
        return trainer, trainer.train()
    finally:
        trainer.close()


def test_few_steps_change_every_parameter_and_write_metrics_and_checkpoint(
    tiny_model_path, tmp_path
):
    from transformers import AutoModelForCausalLM

    before = AutoModelForCausalLM.from_pretrained(tiny_model_path).state_dict()
    trainer, result = run(make_config(tiny_model_path, tmp_path))
    after = trainer.setup.model.state_dict()
    unchanged = [
        k for k, v in trainer.setup.model.named_parameters() if torch.equal(v.detach(), before[k])
    ]
    assert unchanged == []

    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [0, 1, 2]
    for key in (
        "reward/mean",
        "group/frac_zero_std",
        "entropy",
        "clip_frac_low",
        "is_ratio_mean",
        "length/clipped_frac",
        "grad_norm",
        "lr",
        "time/generate",
        "time/train",
        "memory/peak_mb",
        "reward/component/digit",
        "reward/env/test/digit-v0",
    ):
        assert key in rows[1], key
    assert rows[2]["eval/accuracy"] == result.accuracy_after
    # Wall time since training began: grows, covers each step's own time, and ends within the run.
    assert rows[1]["time/step"] <= rows[1]["time/elapsed"] < rows[2]["time/elapsed"]
    assert rows[2]["time/elapsed"] <= result.wall_s
    assert (tmp_path / "config.yaml").is_file()
    assert (tmp_path / "tensorboard").is_dir()
    samples = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 2 * 8 and {"completion", "reward", "advantage"} <= set(samples[0])

    ckpt = latest_checkpoint(tmp_path)
    assert ckpt == result.last_checkpoint and ckpt.name == "step-000002"
    reloaded = AutoModelForCausalLM.from_pretrained(ckpt / "model").state_dict()
    assert all(torch.equal(reloaded[k], v) for k, v in after.items())


def test_a_run_shorter_than_the_sample_interval_logs_its_first_and_last_step(
    tiny_model_path, tmp_path
):
    # The default run: 8 steps, samples every 10; here 3 steps, every 10.
    run(make_config(tiny_model_path, tmp_path, max_steps=3, log_every_samples=10, eval_size=0))
    samples = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert sorted({s["step"] for s in samples}) == [1, 3]
    assert len(samples) == 2 * 8


def _stop_after(trainer, step_to_stop):
    """Send ourselves SIGTERM during step ``step_to_stop``: the handler saves and stops."""
    original = trainer.train_step

    def step(step, log):
        metrics = original(step, log)
        if step == step_to_stop:
            os.kill(os.getpid(), signal.SIGTERM)
        return metrics

    trainer.train_step = step


def _deterministic(rows):
    return [{k: v for k, v in r.items() if not k.startswith(NON_DETERMINISTIC)} for r in rows]


def test_resume_after_sigterm_reproduces_the_uninterrupted_run(tiny_model_path, tmp_path):
    full_dir, cut_dir = tmp_path / "full", tmp_path / "cut"
    trainer, full = run(make_config(tiny_model_path, full_dir, max_steps=4))
    full_state = trainer.setup.model.state_dict()

    cut = Trainer(make_config(tiny_model_path, cut_dir, max_steps=4), env=DigitEnv())
    _stop_after(cut, 2)
    previous = signal.getsignal(signal.SIGTERM)
    result = cut.train()
    cut.close()
    assert result.interrupted and result.steps == 2
    assert signal.getsignal(signal.SIGTERM) is previous  # handlers restored
    assert latest_checkpoint(cut_dir).name == "step-000002"

    cut_clock = read_metrics(cut_dir)[-1]["time/elapsed"]  # the step-2 row
    resumed, result = run(make_config(tiny_model_path, cut_dir, max_steps=4, resume="latest"))
    assert resumed.setup.start_step == 2 and result.steps == 4
    assert _deterministic(read_metrics(cut_dir)) == _deterministic(read_metrics(full_dir))
    # The summary's numbers are the run's: its step-0 accuracy, 2 steps run in this launch, and
    # a clock that continues the checkpoint's.
    assert full.accuracy_before is not None and result.accuracy_before == full.accuracy_before
    assert (result.start_step, result.earlier_wall_s) == (2, cut_clock)
    assert result.total_wall_s == pytest.approx(cut_clock + result.wall_s)
    clock = [r["time/elapsed"] for r in read_metrics(cut_dir) if "time/elapsed" in r]
    assert len(clock) == 4 and clock == sorted(clock) and clock[2] > cut_clock
    assert all(torch.equal(resumed.setup.model.state_dict()[k], v) for k, v in full_state.items())


def test_toy_reward_rises_within_a_bounded_number_of_steps(tiny_model_path, tmp_path):
    cfg = make_config(tiny_model_path, tmp_path, max_steps=12, prompts_per_step=8, eval_size=0)
    run(cfg)
    rewards = [r["reward/mean"] for r in read_metrics(tmp_path)]
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert first < 0.2, rewards
    assert last > 0.5 and last > first + 0.3, rewards


def test_nan_loss_skips_updates_then_aborts_keeping_weights(tiny_model_path, tmp_path, monkeypatch):
    import grpo_train.learner.update as update_module

    real = update_module.grpo_loss

    def nan_loss(*args, **kwargs):
        loss, metrics = real(*args, **kwargs)
        return loss * float("nan"), metrics

    monkeypatch.setattr(update_module, "grpo_loss", nan_loss)
    trainer = Trainer(
        make_config(tiny_model_path, tmp_path, max_steps=5, max_bad_steps=2, eval_size=0),
        env=DigitEnv(),
    )
    before = {k: v.clone() for k, v in trainer.setup.model.state_dict().items()}
    with pytest.raises(TrainingAborted, match="2 updates in a row"):
        trainer.train()
    trainer.close()
    assert all(torch.equal(before[k], v) for k, v in trainer.setup.model.state_dict().items())
    rows = read_metrics(tmp_path)
    assert len(rows) == 1 and rows[0]["loss"] is None  # step 1 logged (skipped), step 2 aborted


class RaisingEnv(DigitEnv):
    """A reward server that is down: the batch call and every single call raise."""

    def score_batch(self, completions, samples, **kwargs):
        raise RuntimeError("reward server down")

    def score(self, completion, sample):
        raise RuntimeError("reward server down")


class FlakyEnv(DigitEnv):
    """Every 4th completion's scoring raises; the others are scored."""

    calls = 0

    def score(self, completion, sample):
        self.calls += 1
        if self.calls % 4 == 0:
            raise RuntimeError("flaky scorer")
        return super().score(completion, sample)


def test_scoring_failures_are_counted_warned_and_left_out_of_training(
    tiny_model_path, tmp_path, caplog, monkeypatch
):
    import grpo_train.trainer as trainer_module

    trainer = Trainer(make_config(tiny_model_path, tmp_path, eval_size=0), env=FlakyEnv())
    seen = []
    original = trainer_module.grpo_update

    def update(learner, step, batch, advantages, settings):
        seen.append((batch, advantages.flatten().clone()))
        return original(learner, step, batch, advantages, settings)

    monkeypatch.setattr(trainer_module, "grpo_update", update)
    with caplog.at_level("WARNING", logger="grpo_train"):
        result = trainer.train()
    trainer.close()
    assert result.steps == 2
    rows = read_metrics(tmp_path)
    assert [r["score/error_share"] for r in rows] == [0.25, 0.25]  # 8 of 32 completions
    warnings = [r.getMessage() for r in caplog.records if "failed to score" in r.getMessage()]
    assert len(warnings) == 2 and "8 of 32" in warnings[0] and "flaky scorer" in warnings[0]
    assert len(seen) == 2
    for batch, advantages in seen:
        groups = batch.samples
        assert torch.equal(batch.scored, torch.tensor([g.scored for g in groups]))
        failed = torch.tensor([not ok for g in groups for ok in g.scored])
        assert failed.sum() == 8
        assert (advantages[failed] == 0).all()  # no loss signal for a failed item
        for k, g in enumerate(groups):  # the baseline is the mean of the scored rewards only
            ok = torch.tensor(g.scored)
            r = torch.tensor(g.rewards, dtype=torch.float64)[ok]
            if r.numel() >= 2 and r.std() > 0:
                adv = advantages[k * 8 : (k + 1) * 8][ok].double()
                expected = (r - r.mean()) / (r.std() + 1e-4)
                torch.testing.assert_close(adv, expected, rtol=1e-5, atol=1e-5)


def test_a_broken_scorer_stops_the_run_before_training_on_it(tiny_model_path, tmp_path):
    trainer = Trainer(make_config(tiny_model_path, tmp_path, eval_size=0), env=RaisingEnv())
    before = {k: v.clone() for k, v in trainer.setup.model.state_dict().items()}
    with pytest.raises(TrainingAborted, match=r"32 of 32 .*reward server.*max_reward_errors=0.5"):
        trainer.train()
    trainer.close()
    assert all(torch.equal(before[k], v) for k, v in trainer.setup.model.state_dict().items())


def test_dynamic_sampling_refills_groups_with_a_signal(tiny_model_path, tmp_path):
    cfg = make_config(
        tiny_model_path,
        tmp_path,
        max_steps=1,
        eval_size=0,
        dynamic_sampling=True,
        dynamic_sampling_rounds=2,
        log_every_samples=0,
    )
    trainer, _ = run(cfg)
    row = read_metrics(tmp_path)[0]
    # At the random start ~5% of samples are rewarded, so most groups are uniform and get dropped.
    assert row["group/frac_zero_std"] > 0
    assert row["dynamic/rounds"] >= 1
    assert row["dynamic/groups_kept"] <= 4
    assert trainer.setup.prompts.sampler.draws > 4  # refill prompts were drawn


def test_kl_and_multiple_updates_per_batch(tiny_model_path, tmp_path):
    cfg = make_config(tiny_model_path, tmp_path, beta=0.1, mu=2, loss_type="grpo", eval_size=0)
    trainer, _ = run(cfg)
    assert trainer.setup.ref_model is not None
    rows = read_metrics(tmp_path)
    assert rows[1]["kl"] > 0  # the policy moved away from the reference in step 1
    assert rows[0]["ratio_max"] != 1.0  # the second update saw a ratio != 1
    assert math.isfinite(rows[1]["loss"]) and rows[1]["loss"] != 0.0


def test_no_reference_model_without_kl(tiny_model_path, tmp_path):
    trainer = Trainer(make_config(tiny_model_path, tmp_path), env=DigitEnv())
    assert trainer.setup.ref_model is None
    trainer.close()


def test_padded_micro_batches_give_the_same_logprobs_as_single_sequences(tiny_model_path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path).eval()
    prompts, completions = [[5, 6, 7, 8], [9]], [[10, 11], [12, 13, 14]]
    (batch,) = make_micro_batches(prompts, completions, token_budget=100, pad_id=0)
    with torch.no_grad():
        padded, _ = token_logprobs(model, batch)
        for k, row in enumerate(batch.rows):
            (single,) = make_micro_batches([prompts[row]], [completions[row]], 100, 0)
            alone, _ = token_logprobs(model, single)
            n = len(completions[row])
            torch.testing.assert_close(padded[k, :n], alone[0, :n], atol=1e-5, rtol=1e-5)


@pytest.mark.vllm
def test_vllm_engine_few_steps_with_weight_sync(tiny_model_path, tmp_path):
    pytest.importorskip("vllm")
    from transformers import AutoModelForCausalLM

    before = AutoModelForCausalLM.from_pretrained(tiny_model_path).state_dict()
    trainer = Trainer(
        make_config(tiny_model_path, tmp_path, engine="vllm", max_steps=3), env=DigitEnv()
    )
    try:
        trainer.train()
        _check_vllm_run(trainer, before, tmp_path)
    finally:
        trainer.close()


def _check_vllm_run(trainer, before, tmp_path):
    assert trainer.engine.name == "vllm"
    unchanged = [
        k for k, v in trainer.setup.model.named_parameters() if torch.equal(v.detach(), before[k])
    ]
    assert unchanged == []
    rows = read_metrics(tmp_path)
    # After each sync the engine samples from the trainer's weights: the importance ratio between
    # trainer and engine logprobs stays near 1 on average (it drifts with stale engine weights).
    for r in rows[2:]:
        assert abs(r["is_ratio_mean"] - 1.0) < 0.05, r
    # Direct check: the engine's logprobs of its own greedy tokens match the trained policy's.
    sample = Sample.from_row(DigitEnv().dataset("test")[0])
    prompt = encode_prompt(trainer.setup.tokenizer, sample, max_tokens=64).ids
    (completion,) = trainer.engine.generate(
        [prompt], SamplingConfig(n=1, max_new_tokens=4, temperature=0.0)
    )[0]
    (batch,) = make_micro_batches([prompt], [list(completion.token_ids)], 1000, 0)
    with torch.no_grad():
        ours, _ = token_logprobs(trainer.setup.model.eval(), batch)
    torch.testing.assert_close(ours[0], torch.tensor(completion.logprobs), atol=2e-2, rtol=0)
    assert latest_checkpoint(tmp_path) is not None


class TrainOnlyEnv(DigitEnv):
    splits = ("train",)


def test_a_missing_eval_split_is_reported_with_the_fix(tiny_model_path, tmp_path):
    with pytest.raises(ValueError, match="eval_size=0"):
        Trainer(make_config(tiny_model_path, tmp_path), env=TrainOnlyEnv())


@pytest.mark.slow
def test_lora_run_trains_adapters_only_saves_them_resumes_and_syncs_merged(
    tiny_model_path, tmp_path
):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from grpo_train.learner.weight_export import sync_rollout_weights
    from grpo_train.rollout import make_engine

    initial = load_file(tiny_model_path / "model.safetensors")
    lora = {"lora_r": 4, "lora_alpha": 8, "beta": 0.05, "save_every": 1, "save_merged": True}
    trainer, result = run(make_config(tiny_model_path, tmp_path, **lora))
    params = dict(trainer.setup.model.named_parameters())
    trained = {k for k, p in params.items() if p.requires_grad}
    assert trained and all(".lora_" in k for k in trained)
    base_names = [k for k in params if ".lora_" not in k]
    for name in base_names:  # the frozen base is untouched (KL reference = adapter off)
        short = name.replace("base_model.model.", "").replace(".base_layer", "")
        if short in initial:
            assert torch.equal(params[name].detach(), initial[short]), name
    assert max(float(p.detach().abs().max()) for k, p in params.items() if "lora_B" in k) > 1e-4
    assert math.isfinite(read_metrics(tmp_path)[-1]["kl"])

    # Adapter-only checkpoint.
    saved = result.last_checkpoint / "model"
    assert (saved / "adapter_config.json").is_file()
    assert (saved / "adapter_model.safetensors").is_file()
    assert not (saved / "model.safetensors").exists()

    # A separate engine (its own weights, as vLLM) receives the merged policy: same logprobs.
    mb = make_micro_batches([[5, 6, 7], [8, 9]], [[10, 11, 12], [13]], 10_000, 0)[0]
    with torch.no_grad():
        want = token_logprobs(trainer.setup.model, mb)[0]
        engine = make_engine("hf", str(tiny_model_path), dtype="float32")
        before = token_logprobs(engine.model, mb)[0]
        sync_rollout_weights(engine, trainer.setup.model)
        got = token_logprobs(engine.model, mb)[0]
        merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
        from_disk = token_logprobs(merged, mb)[0]
    assert float((before - want).abs().max()) > 1e-5  # the adapter changed the policy
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    torch.testing.assert_close(from_disk, want, rtol=0, atol=1e-5)

    # Resume: the base is loaded, then the saved adapter; training continues from step 2.
    resumed = Trainer(
        make_config(tiny_model_path, tmp_path, **lora, max_steps=3, resume="latest"),
        env=DigitEnv(),
    )
    try:
        assert resumed.setup.start_step == 2
        for name, p in resumed.setup.model.named_parameters():
            torch.testing.assert_close(p.detach(), params[name].detach(), rtol=0, atol=0)
        assert resumed.train().steps == 3
    finally:
        resumed.close()
    assert [r["step"] for r in read_metrics(tmp_path)] == [0, 1, 2, 3]


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_engine_serves_the_merged_lora_policy(tiny_model_path, tmp_path):
    pytest.importorskip("vllm")
    config = make_config(tiny_model_path, tmp_path, engine="vllm", lora_r=4, lora_alpha=8)
    trainer = Trainer(config, env=DigitEnv())
    try:
        trainer.train()
        from grpo_train.learner.lora import reference_logprobs
        from grpo_train.learner.weight_export import sync_rollout_weights

        lora_b = [p for k, p in trainer.setup.model.named_parameters() if "lora_B" in k]
        assert max(float(p.detach().abs().max()) for p in lora_b) > 1e-4
        # Make the adapter's effect large, then sync as the trainer does after an update.
        with torch.no_grad():
            for p in lora_b:
                p.add_(0.05 * torch.randn_like(p))
        sync_rollout_weights(trainer.engine, trainer.setup.model)
        sample = Sample.from_row(DigitEnv().dataset("test")[0])
        prompt = encode_prompt(trainer.setup.tokenizer, sample, max_tokens=64).ids
        greedy = SamplingConfig(n=1, max_new_tokens=4, temperature=0.0)
        (completion,) = trainer.engine.generate([prompt], greedy)[0]
        (batch,) = make_micro_batches([prompt], [list(completion.token_ids)], 1000, 0)
        with torch.no_grad():
            ours, _ = token_logprobs(trainer.setup.model.eval(), batch)
            base = reference_logprobs(trainer.setup.model, batch)
        torch.testing.assert_close(ours[0], torch.tensor(completion.logprobs), atol=2e-2, rtol=0)
        assert float((base[0] - ours[0]).abs().max()) > 0.1  # the engine has the adapter
    finally:
        trainer.close()


@pytest.mark.parametrize(("loss_type", "budget"), [("dapo", 64), ("grpo", 4096), ("dr_grpo", 4096)])
def test_update_gradient_equals_the_plain_full_batch_computation(
    tiny_model_path, tmp_path, loss_type, budget, monkeypatch
):
    # The update skips rows with advantage 0 (beta = 0), splits the rest into micro-batches, runs
    # each group's prompt once and takes logprobs from one log-softmax; its loss and gradient must
    # equal the textbook computation: every row in one batch, one plain forward,
    # log(softmax(logits / T)), grpo_loss, backward.
    from collections import defaultdict

    import grpo_train.learner.update as update_module
    from grpo_train.algorithm.objective import grpo_loss, truncated_is_weights
    from grpo_train.collect.batch import RolloutBatch
    from grpo_train.learner.micro_batches import pad_rows
    from grpo_train.learner.update import grpo_update

    cfg = make_config(
        tiny_model_path,
        tmp_path,
        loss_type=loss_type,
        eval_size=0,
        micro_batch_tokens=budget,
        max_completion_length=6,
        temperature=0.8,
    )
    trainer = Trainer(cfg, env=DigitEnv())
    groups = trainer.collector.collect(4, 1, 0, defaultdict(float))
    torch.manual_seed(0)
    adv = torch.randn(4, 8)
    adv[0] = 0.0  # a group whose rewards all agree
    adv[2, :3] = 0.0
    adv = adv.flatten()
    seen: list[int] = []
    original = update_module.token_logprobs

    def recording(model, mb, *args, **kwargs):
        seen.extend(mb.rows)
        return original(model, mb, *args, **kwargs)

    monkeypatch.setattr(update_module, "token_logprobs", recording)
    captured = {}

    def capture(loss):
        captured["loss"] = loss
        captured["grads"] = {n: p.grad.clone() for n, p in trainer.setup.model.named_parameters()}
        trainer.setup.optimizer.zero_grad(set_to_none=True)
        return 0.0

    batch = RolloutBatch.from_groups(groups, 8)
    grpo_update(trainer.setup.learner, capture, batch, adv.view(4, 8), trainer.setup.settings)
    assert sorted(seen) == [i for i in range(32) if adv[i] != 0]  # zero rows: no forward
    assert len(seen) > 0 and len(set(seen)) == len(seen)

    rows = [(g.prompt_ids, c) for g in groups for c in g.completions]
    (mb,) = make_micro_batches([p for p, _ in rows], [list(c.token_ids) for _, c in rows], 10**9, 0)
    model = trainer.setup.model
    model.train()
    c_len = mb.completion_ids.shape[1]
    logits = model(
        input_ids=mb.input_ids, attention_mask=mb.attention_mask, position_ids=mb.position_ids
    ).logits[:, -c_len - 1 : -1]
    probs = torch.softmax(logits / 0.8, dim=-1)
    logprobs = torch.log(probs.gather(-1, mb.completion_ids.unsqueeze(-1)).squeeze(-1))
    mask = mb.completion_mask.float()
    sampled = pad_rows([rows[r][1].logprobs for r in mb.rows], c_len)
    weights, _ = truncated_is_weights(logprobs.detach(), sampled, mask, cfg.algorithm.is_cap)
    loss, _ = grpo_loss(
        logprobs,
        logprobs.detach(),
        adv[list(mb.rows)],
        mask,
        epsilon_low=cfg.algorithm.epsilon_low,
        epsilon_high=cfg.algorithm.epsilon_high,
        loss_type=loss_type,
        max_completion_length=6,
        importance_weights=weights,
    )
    loss.backward()
    assert captured["loss"] == pytest.approx(loss.item(), abs=1e-6)
    for name, p in model.named_parameters():
        torch.testing.assert_close(captured["grads"][name], p.grad, atol=1e-6, rtol=1e-4)
    trainer.close()
