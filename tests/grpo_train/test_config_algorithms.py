"""Config fields of the EMA baseline, GSPO and time-to-target: parsing, ranges, fix-it messages."""

import math

import pytest

from grpo_train.algorithm.advantages import Estimator, ScaleRewards
from grpo_train.algorithm.choices import ImportanceLevel
from grpo_train.config import RESUME_FIXED, RESUME_FREE, ConfigError, TrainConfig, algorithm_notes


def test_new_fields_parse_from_command_line_strings():
    cfg = TrainConfig.from_flat(
        {
            "advantage_estimator": "ema",
            "ema_alpha": "0.9",
            "scale_rewards": "batch",
            "importance_sampling_level": "sequence",
            "target_accuracy": "0.5",
        }
    )
    a = cfg.algorithm
    assert a.advantage_estimator is Estimator.EMA and a.ema_alpha == 0.9
    assert a.scale_rewards is ScaleRewards.BATCH
    assert a.importance_sampling_level is ImportanceLevel.SEQUENCE
    assert cfg.run.target_accuracy == 0.5
    # What a checkpoint's numbers mean is fixed on resume; the report target is not.
    assert {"ema_alpha", "importance_sampling_level"} <= RESUME_FIXED
    assert "target_accuracy" in RESUME_FREE


@pytest.mark.parametrize(
    ("values", "fix"),
    [
        ({"ema_alpha": 1.0}, "ema_alpha: 1.0; must be in (0, 1)"),
        ({"ema_alpha": 0}, "ema_alpha: 0.0; must be in (0, 1)"),
        ({"ema_alpha": math.nan}, "ema_alpha: nan"),
        ({"advantage_estimator": "ema"}, "use --scale_rewards batch"),
        (
            {"advantage_estimator": "ema", "scale_rewards": "none", "dynamic_sampling": "on"},
            "use --dynamic_sampling off",
        ),
        ({"advantage_estimator": "mean"}, "'ema'"),
        ({"importance_sampling_level": "seq"}, "['token', 'sequence']"),
        ({"target_accuracy": 1.5}, "target_accuracy: 1.5; a held-out accuracy in (0, 1]"),
        ({"target_accuracy": -0.1}, "target_accuracy: -0.1"),
    ],
)
def test_bad_values_are_one_clear_error_with_the_fix(values, fix):
    with pytest.raises(ConfigError) as err:
        TrainConfig.from_flat(values)
    assert fix in str(err.value)


def test_gspo_notes_say_when_the_sequence_ratio_cannot_act():
    paper = {"importance_sampling_level": "sequence", "epsilon_low": 3e-4, "epsilon_high": 4e-4}
    assert algorithm_notes(TrainConfig.from_flat({**paper, "mu": 2})) == []
    (only_mu,) = algorithm_notes(TrainConfig.from_flat(paper))
    assert "mu=1" in only_mu and "--mu 2" in only_mu
    (wide,) = algorithm_notes(
        TrainConfig.from_flat({"importance_sampling_level": "sequence", "mu": 2})
    )
    assert "--epsilon_low 3e-4 --epsilon_high 4e-4" in wide
    assert algorithm_notes(TrainConfig.from_flat({"mu": 2})) == []  # token level: nothing to say
