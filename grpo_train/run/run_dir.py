"""The run folder: a unique default name per run, and no silent mixing of two runs in one folder.

A run folder holds one run: its ``config.yaml``, metrics, samples, TensorBoard events,
checkpoints and plots. Writing a second, different run into it would interleave their events and
samples and let ``--resume`` pick up the other run's checkpoint, so ``check_run_dir`` refuses
unless the user says what they mean: ``resume`` (continue it) or ``overwrite`` (start afresh).
"""

from __future__ import annotations

import dataclasses
import re
import shutil
from datetime import datetime
from pathlib import Path

import yaml

from grpo_train.config import ConfigError, TrainConfig

CONFIG_FILE = "config.yaml"

#: What a run writes into its folder (``overwrite`` deletes these and nothing else).
RUN_ARTIFACTS = (
    "metrics.jsonl",
    "samples.jsonl",
    "tensorboard",
    "checkpoints",
    "plots",
    "merged",
    "wandb",
    "wandb_run_id",
    "train.log",  # console.RUN_LOG_FILE
    CONFIG_FILE,
)

#: Fields that do not make a different run: how it is resumed, shown or written.
_NOT_THE_RUN = frozenset({"resume", "overwrite", "progress", "log_level"})


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_.-") or "x"


def default_output_dir(config: TrainConfig, now: datetime | None = None) -> str:
    """Return ``runs/<model>-<env>-<YYYYmmdd-HHMMSS>``: a new folder for each run.

    >>> from grpo_train.config import TrainConfig
    >>> cfg = TrainConfig.from_flat({"model": "Qwen/Qwen2.5-0.5B-Instruct", "env": "math/gsm8k-v0"})
    >>> default_output_dir(cfg, datetime(2026, 1, 2, 3, 4, 5))
    'runs/Qwen2.5-0.5B-Instruct-gsm8k-v0-20260102-030405'
    """
    model = _slug(Path(config.policy.model.rstrip("/")).name)
    envs = "+".join(_slug(e.id.rsplit(":", 1)[-1].rsplit("/", 1)[-1]) for e in config.data.env)
    stamp = (now or datetime.now()).strftime("%Y%m%d-%H%M%S")
    return f"runs/{model}-{envs[:60]}-{stamp}"


def with_output_dir(config: TrainConfig, now: datetime | None = None) -> TrainConfig:
    """Fill an empty ``output_dir`` with ``default_output_dir``; ``resume`` needs a real one."""
    if config.run.output_dir:
        return config
    if config.run.resume == "latest":
        raise ConfigError(
            "resume: which run? give its folder (--output_dir runs/x) or its config "
            "(--config runs/x/config.yaml); each new run gets a new folder"
        )
    run = dataclasses.replace(config.run, output_dir=default_output_dir(config, now))
    return dataclasses.replace(config, run=run)


def _comparable(sections: object) -> dict[str, object]:
    flat: dict[str, object] = {}
    if isinstance(sections, dict):
        for section in sections.values():
            if isinstance(section, dict):
                flat.update({k: v for k, v in section.items() if k not in _NOT_THE_RUN})
    return flat


def check_run_dir(config: TrainConfig) -> None:
    """Refuse to write a run into a folder that holds a different run, unless told how.

    - no ``config.yaml`` there, or the same settings (a restart): go ahead;
    - ``resume``: go ahead (continuing a run may change e.g. max_steps);
    - ``overwrite``: go ahead (``clear_run_dir`` deletes the earlier run's files);
    - otherwise ``ConfigError`` naming the folder, what differs, and both fixes.
    """
    run_dir = Path(config.run.output_dir)
    saved_path = run_dir / CONFIG_FILE
    if config.run.overwrite or config.run.resume or not saved_path.is_file():
        return
    try:
        saved = _comparable(yaml.safe_load(saved_path.read_text()))
    except (OSError, yaml.YAMLError):
        saved = {}
    ours = _comparable(config.to_dict())
    # Fields only one side knows come from another grpo-kit version, not from another run.
    differ = sorted(k for k in set(saved) & set(ours) if saved[k] != ours[k])
    if not differ:
        return
    shown = ", ".join(f"{k}: {saved.get(k)!r} -> {ours.get(k)!r}" for k in differ[:4])
    more = f" (and {len(differ) - 4} more)" if len(differ) > 4 else ""
    raise ConfigError(
        f"output_dir: {run_dir} holds another run (its config.yaml differs: {shown}{more}); "
        "add --resume to continue that run, --overwrite to replace it, or choose another "
        "--output_dir (leave it out for a new folder per run)"
    )


def clear_run_dir(config: TrainConfig) -> None:
    """With ``overwrite``: delete the earlier run's files (``RUN_ARTIFACTS``, nothing else)."""
    if not config.run.overwrite:
        return
    run_dir = Path(config.run.output_dir)
    for name in RUN_ARTIFACTS:
        path = run_dir / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
