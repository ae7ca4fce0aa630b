"""Short CPU runs, tiny model: EMA baselines and resume, GSPO, throughput, time-to-target."""

import pytest
import torch
from test_trainer import _deterministic, _stop_after, make_config, run
from toy_env import DigitEnv

from grpo_train.run.checkpoint import STATE_FILE, latest_checkpoint
from grpo_train.run.run_log import read_metrics
from grpo_train.run.throughput import time_to_target
from grpo_train.trainer import Trainer

# Four training prompts and four per step: every step revisits every prompt.
EMA = {
    "advantage_estimator": "ema",
    "ema_alpha": 0.8,
    "scale_rewards": "none",
    "max_steps": 3,
    "eval_size": 0,
    "seed": 2,  # rewarded completions from the first step on
}


def test_ema_baselines_are_saved_and_a_resumed_run_matches_the_uninterrupted_one(
    tiny_model_path, tmp_path
):
    full_dir, cut_dir = tmp_path / "full", tmp_path / "cut"
    full, _ = run(make_config(tiny_model_path, full_dir, **EMA), DigitEnv(size=4))
    # Every visited prompt has a baseline, and so does the environment.
    assert sorted(full.baselines.prompts) == [f"0/train-{i}" for i in range(4)]
    assert list(full.baselines.envs) == ["0"]
    saved = torch.load(latest_checkpoint(full_dir) / STATE_FILE, weights_only=True)
    assert saved["baselines"] == full.baselines.to_state()

    cut = Trainer(make_config(tiny_model_path, cut_dir, **EMA), env=DigitEnv(size=4))
    _stop_after(cut, 1)
    assert cut.train().steps == 1
    cut.close()
    resumed, _ = run(
        make_config(tiny_model_path, cut_dir, **EMA, resume="latest"), DigitEnv(size=4)
    )
    assert resumed.setup.start_step == 1
    assert resumed.baselines == full.baselines
    assert _deterministic(read_metrics(cut_dir)) == _deterministic(read_metrics(full_dir))
    assert all(
        torch.equal(resumed.setup.model.state_dict()[k], v)
        for k, v in full.setup.model.state_dict().items()
    )


def test_ema_advantages_in_a_run_follow_the_baseline_not_the_group_mean(tiny_model_path, tmp_path):
    trainer = Trainer(make_config(tiny_model_path, tmp_path, **EMA), env=DigitEnv(size=4))
    seen = []
    original = trainer.advantages

    def spy(batch):
        before = trainer.baselines
        adv = original(batch)
        seen.append((batch, before, adv))
        return adv

    trainer.advantages = spy
    try:
        trainer.train()
    finally:
        trainer.close()
    assert len(seen) == 3
    assert sum(float(batch.rewards.sum()) for batch, _, _ in seen) > 0
    differs = 0
    # Step 1: no baseline yet, so r - group mean. Later: r - the prompt's baseline before the step.
    for k, (batch, before, adv) in enumerate(seen):
        for p, group in enumerate(batch.samples):
            rewards = batch.rewards[p]
            key = f"0/{group.sample.id}"
            baseline = rewards.mean() if k == 0 else before.prompts[key]
            torch.testing.assert_close(adv[p].double(), rewards - baseline, atol=1e-6, rtol=0)
            differs += not torch.allclose(adv[p].double(), rewards - rewards.mean())
    # Some later group is compared with its past (a resume that lost the baselines would not be).
    assert differs > 0


def test_gspo_run_uses_sequence_ratios(tiny_model_path, tmp_path):
    common = {
        "mu": 2,
        "epsilon_low": 3e-4,
        "epsilon_high": 4e-4,
        "loss_type": "grpo",
        "max_steps": 1,
        "eval_size": 0,
        "log_every_samples": 0,
        "seed": 2,  # a first batch with rewarded completions (a learning signal)
    }
    token, _ = run(make_config(tiny_model_path, tmp_path / "token", **common))
    seq, _ = run(
        make_config(
            tiny_model_path, tmp_path / "seq", importance_sampling_level="sequence", **common
        )
    )
    assert seq.setup.settings.objective.importance_sampling_level == "sequence"
    t_row, s_row = read_metrics(tmp_path / "token")[0], read_metrics(tmp_path / "seq")[0]
    assert t_row["reward/mean"] == s_row["reward/mean"] > 0  # the same rollouts
    # The first update is on-policy (ratio 1), the same at both levels, so the second update
    # sees the same token ratios; a sequence ratio is their geometric mean over the sequence,
    # so it lies within the token ratios' range, strictly inside here.
    assert t_row["ratio_min"] < s_row["ratio_min"] <= s_row["ratio_max"] < t_row["ratio_max"]
    assert s_row["clip_frac"] > 0 and s_row["clip_frac"] != t_row["clip_frac"]
    changed = [
        k
        for k, v in seq.setup.model.state_dict().items()
        if not torch.equal(v, token.setup.model.state_dict()[k])
    ]
    assert changed  # the second update differs


def test_throughput_is_logged_and_the_summary_reports_time_to_target(
    tiny_model_path, tmp_path, capsys
):
    import fault_envs  # noqa: F401  (registers faults/digit-v0: the toy digit task)

    from grpo_train.train_cli import main

    args = ["--model", str(tiny_model_path), "--env", "fault_envs:faults/digit-v0"]
    args += ["--engine", "hf", "--max_steps", "2", "--num_generations", "4"]
    args += ["--prompts_per_step", "2", "--max_completion_length", "4", "--eval_size", "8"]
    args += ["--eval_every", "1", "--progress", "false", "--learning_rate", "1e-2"]
    args += ["--output_dir", str(tmp_path), "--target_accuracy", "0.5", "--save_every", "0"]
    assert main(args) == 0
    out = capsys.readouterr().out
    rows = read_metrics(tmp_path)
    for row in rows[1:]:
        # 2 prompts x 4 completions per step, over the step's time; tokens = mean length x 8.
        assert row["throughput/samples_per_s"] * row["time/step"] == pytest.approx(8.0)
        assert row["throughput/completion_tokens_per_s"] * row["time/step"] == pytest.approx(
            row["length/mean"] * 8
        )
    evals = [(r["step"], r["eval/accuracy"]) for r in rows if "eval/accuracy" in r]
    assert [s for s, _ in evals] == [0, 1, 2]
    expected = time_to_target(rows, 0.5)
    hit = [s for s, acc in evals if acc >= 0.5]
    assert expected.step == (hit[0] if hit else None)
    assert expected.describe() in out
    assert "samples/s" in out and "completion tokens/s" in out
