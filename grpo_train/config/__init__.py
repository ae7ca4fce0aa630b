"""Training configuration: one frozen dataclass per concern, a docstring under every field.

A run's configuration is layered: a base, then a YAML file, then command-line overrides::

    grpo train --config run.yaml --learning_rate 1e-6

The base is the dataclass defaults, chosen for a real model (reasoning-length completions, bf16
where the hardware has it), unless the run names no model, env and config file: then it is
``DEFAULT_PRESET``, the embedded quick-start run (``--preset default`` asks for it explicitly).
TRL's ``GRPOConfig`` names (``num_iterations``, ``epsilon``, ``lr_scheduler_type``...) are accepted
as aliases (``TRL_ALIASES``) and saved under ours.

Field names are unique across sections, so YAML files may be flat (``learning_rate: 1e-6``) or
sectioned (``optim: {learning_rate: 1e-6}``), and every field is a ``--flag``. Invalid values fail
at start with the field name and the fix (``ConfigError``). The resolved configuration is saved in
the run folder as ``config.yaml`` and can be passed back with ``--config``.

What a field is, is written once, beside it: its type and default, its docstring (the help
``grpo train --help`` prints, ``field_docs``) and its resume class in the annotation
(``Fixed[int]``: ``--resume`` refuses another value; ``Free``; ``Identity``; ``field_resume``).
Booleans are read by one parser (``parse_bool``). Importing this package imports no torch: the
algorithm's choices come from ``grpo_train.algorithm.choices``.

The package, by concern: ``sections`` (the seven section dataclasses and the resume classes),
``loading`` (``TrainConfig``: YAML, command-line values, TRL's aliases, coercion, field docs),
``validation`` (the cross-field checks and their fix-it messages, ``ConfigError``) and
``defaults`` (the embedded preset, real-model defaults, the default run folder).

Only the code that assembles a run reads this package (the command lines, ``setup``,
``trainer``); every component takes its own small settings dataclass, which ``setup.settings``
builds from a ``TrainConfig``.

Why argparse and this package rather than a dataclass-to-CLI library (tyro, simple-parsing,
jsonargparse): they derive flags and help from dataclasses as this package does, but not what the
users of ``grpo train`` rely on here: every bad field reported at once with its fix
(``ConfigError``), TRL's names whose values translate (``epsilon`` sets both clips,
``report_to``, ``use_vllm``, ``bf16``, a boolean ``scale_rewards``), YAML files that may be flat
or sectioned, layered over the embedded preset or the defaults. Each would need that code on
top, so the dependency would save little.
"""

from grpo_train.config.defaults import (
    CHECKPOINTING_MIN_WIDTH,
    DEFAULT_PRESET,
    DefaultChoice,
    preset_config,
    real_model_defaults,
    with_output_dir,
)
from grpo_train.config.loading import (
    TRL_ALIASES,
    TRL_TRANSLATED,
    TrainConfig,
    coerce,
    field_docs,
    field_owners,
    field_types,
    flat_items,
    is_bool_text,
    normalise_aliases,
    parse_bool,
    parse_envs,
    parse_mapping,
    unknown_fields_text,
)
from grpo_train.config.sections import (
    RESUME_FIXED,
    RESUME_FREE,
    RESUME_IDENTITY,
    SECTIONS,
    AlgorithmConfig,
    DataConfig,
    EnvEntry,
    Fixed,
    Free,
    Identity,
    OptimConfig,
    PolicyConfig,
    Resume,
    RolloutConfig,
    RunConfig,
    SandboxConfig,
    field_resume,
)
from grpo_train.config.validation import (
    ATTENTION_NAMES,
    ConfigError,
    algorithm_notes,
    is_attention_name,
    problems_text,
    validate,
)

__all__ = [
    "ATTENTION_NAMES",
    "CHECKPOINTING_MIN_WIDTH",
    "DEFAULT_PRESET",
    "RESUME_FIXED",
    "RESUME_FREE",
    "RESUME_IDENTITY",
    "SECTIONS",
    "TRL_ALIASES",
    "TRL_TRANSLATED",
    "AlgorithmConfig",
    "ConfigError",
    "DataConfig",
    "DefaultChoice",
    "EnvEntry",
    "Fixed",
    "Free",
    "Identity",
    "OptimConfig",
    "PolicyConfig",
    "Resume",
    "RolloutConfig",
    "RunConfig",
    "SandboxConfig",
    "TrainConfig",
    "algorithm_notes",
    "coerce",
    "field_docs",
    "field_owners",
    "field_resume",
    "field_types",
    "flat_items",
    "is_attention_name",
    "is_bool_text",
    "normalise_aliases",
    "parse_bool",
    "parse_envs",
    "parse_mapping",
    "preset_config",
    "problems_text",
    "real_model_defaults",
    "unknown_fields_text",
    "validate",
    "with_output_dir",
]
