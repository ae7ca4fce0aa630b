"""What a run gets where the user says nothing: the embedded preset, real-model defaults, a folder.

``DEFAULT_PRESET`` is what ``grpo train`` runs with no arguments (``preset_config``);
``real_model_defaults`` the choices a named model gets beyond the dataclass defaults;
``with_output_dir`` a new run folder for a run that names none.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from grpo_train.config.loading import TrainConfig
from grpo_train.config.validation import ConfigError
from grpo_train.run.run_dir import default_output_dir

#: What ``grpo train`` runs with no arguments: the embedded SmolLM2-135M-Instruct on two-digit
#: addition, on CPU. The single place to tune the out-of-the-box run; flat field -> value.
#: Chosen by measurement (benchmarks/results/history.md, "Learning"): the converted model states
#: its sums in prose and almost never boxes a correct one (0/1024 samples), so a boxed-only reward
#: gives all-zero advantages and a reward for any box is hacked (\boxed{N}); ``answer="loose"`` (the
#: last integer of the text counts, as lm-eval's flexible GSM8K extraction does) gives a signal it
#: can earn: held-out greedy accuracy 10.9% -> 53% after 5 steps, 56% after 10 (lr 2e-5, 4 prompts
#: x 8 completions, <= 64 tokens). 8 steps with both evaluations fit 15 minutes on 2 CPU cores.
DEFAULT_PRESET: Mapping[str, object] = {
    "model": "default",
    "env": [{"id": "math/arithmetic-v0", "kwargs": {"task": "add2", "answer": "loose"}}],
    "engine": "auto",
    "num_generations": 8,
    "prompts_per_step": 4,
    "max_prompt_length": 256,
    "max_completion_length": 64,
    "temperature": 1.0,
    "learning_rate": 2e-5,
    "max_steps": 8,
    "eval_size": 64,
    "save_every": 10,
    "output_dir": "runs/grpo-default",
    "dtype": "float32",
    "dynamic_sampling": "auto",
}


#: Layers x hidden size under which a model's activations are too small for gradient
#: checkpointing to pay: the tiny test models (2 x 128 = 256) keep ~1/70 of SmolLM2-135M's
#: (30 x 576 = 17,280) per token, a few MiB per 1,000 tokens, and checkpointing would only add
#: its recomputation (and turn off the shared-prompt forward).
CHECKPOINTING_MIN_WIDTH = 4096


@dataclass(frozen=True)
class DefaultChoice:
    """A default ``grpo train`` chose for a named model, and why (said in the start-up line)."""

    field: str
    value: object
    why: str

    def describe(self) -> str:
        """Return ``field=value (why)``, as the start-up line prints it."""
        return f"{self.field}={str(self.value).lower()} ({self.why})"


def real_model_defaults(shape: tuple[int, int] | None) -> tuple[DefaultChoice, ...]:
    """Return the defaults a named model gets beyond the dataclass defaults.

    ``grpo train`` applies them under any YAML file and flag, which win. ``shape``: the
    model's (layers, hidden size) where its ``config.json`` is at hand, else None (a hub id:
    taken as a real model). Gradient checkpointing is on for a real model, as in TRL's
    ``GRPOConfig``: measured by ``benchmarks/checkpointing_bench.py`` on SmolLM2-135M, one
    update's peak grows 1,645 KiB per completion token without it and 194 KiB with it (8.5x
    less), for 1.06-1.20x the update's CPU time, so a 4k-token chain fits where it otherwise
    runs out of memory. A model narrower than ``CHECKPOINTING_MIN_WIDTH`` keeps it off.

    >>> [c.describe()[:27] for c in real_model_defaults((30, 576))]
    ['gradient_checkpointing=true']
    >>> real_model_defaults((2, 128))[0].value, real_model_defaults(None)[0].value
    (False, True)
    """
    if shape is not None and shape[0] * shape[1] < CHECKPOINTING_MIN_WIDTH:
        layers, hidden = shape
        why = f"{layers} layers x hidden {hidden}: activations too small to need it"
        return (DefaultChoice("gradient_checkpointing", False, why),)
    why = "a real model: 8.5x less memory per completion token, ~1.1-1.2x update time"
    return (DefaultChoice("gradient_checkpointing", True, why),)


def preset_config() -> TrainConfig:
    """Return the embedded default run: the dataclass defaults overlaid with ``DEFAULT_PRESET``."""
    return TrainConfig.from_flat(DEFAULT_PRESET)


def with_output_dir(config: TrainConfig, now: datetime | None = None) -> TrainConfig:
    """Fill an empty ``output_dir`` with ``run_dir.default_output_dir``; ``resume`` needs one.

    >>> cfg = TrainConfig.from_flat({"model": "Qwen/Qwen2.5-0.5B-Instruct", "env": "math/gsm8k-v0"})
    >>> with_output_dir(cfg, datetime(2026, 1, 2, 3, 4, 5)).run.output_dir
    'runs/Qwen2.5-0.5B-Instruct-gsm8k-v0-20260102-030405'
    """
    if config.run.output_dir:
        return config
    if config.run.resume == "latest":
        raise ConfigError(
            "resume: which run? give its folder (--output_dir runs/x) or its config "
            "(--config runs/x/config.yaml); each new run gets a new folder"
        )
    env_ids = [e.id for e in config.data.env]
    folder = default_output_dir(config.policy.model, env_ids, now)
    run = dataclasses.replace(config.run, output_dir=folder)
    return dataclasses.replace(config, run=run)
