"""The run folder: a unique default name per run, and no silent mixing of two runs in one folder.

A run folder holds one run: its ``config.yaml``, metrics, samples, TensorBoard events,
checkpoints and plots. Writing a second, different run into it would interleave their events and
samples and let ``--resume`` pick up the other run's checkpoint, so ``other_run_problem`` refuses
unless the user says what they mean: ``resume`` (continue it) or ``overwrite`` (start afresh).
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import yaml

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


def default_output_dir(model: str, env_ids: Sequence[str], now: datetime | None = None) -> str:
    """Return ``runs/<model>-<env>-<YYYYmmdd-HHMMSS>``: a new folder for each run.

    >>> when = datetime(2026, 1, 2, 3, 4, 5)
    >>> default_output_dir("Qwen/Qwen2.5-0.5B-Instruct", ["math/gsm8k-v0"], when)
    'runs/Qwen2.5-0.5B-Instruct-gsm8k-v0-20260102-030405'
    """
    name = _slug(Path(model.rstrip("/")).name)
    envs = "+".join(_slug(e.rsplit(":", 1)[-1].rsplit("/", 1)[-1]) for e in env_ids)
    stamp = (now or datetime.now()).strftime("%Y%m%d-%H%M%S")
    return f"runs/{name}-{envs[:60]}-{stamp}"


@dataclass(frozen=True)
class RunFolder:
    """What the run-folder checks read: the folder, what the run does with an earlier run in it.

    Built once from a run's configuration (``setup.settings.run_folder``).
    """

    path: Path
    """The run folder (``output_dir``)."""
    resuming: bool
    """``resume`` is given: the run continues the one in the folder."""
    overwrite: bool
    """``overwrite``: the earlier run's files are deleted first (``clear_run_dir``)."""
    sections: Mapping[str, Mapping[str, object]]
    """The run's settings in ``config.yaml``'s sectioned form, compared with the saved ones."""


def _comparable(sections: object) -> dict[str, object]:
    flat: dict[str, object] = {}
    if isinstance(sections, Mapping):
        for section in sections.values():
            if isinstance(section, Mapping):
                flat.update({k: v for k, v in section.items() if k not in _NOT_THE_RUN})
    return flat


def other_run_problem(folder: RunFolder) -> str | None:
    """Return why the run may not write into its folder (it holds a different run), or None.

    - no ``config.yaml`` there, or the same settings (a restart): go ahead;
    - ``resume``: go ahead (continuing a run may change e.g. max_steps);
    - ``overwrite``: go ahead (``clear_run_dir`` deletes the earlier run's files);
    - otherwise the problem, naming the folder, what differs, and both fixes.
    """
    saved_path = folder.path / CONFIG_FILE
    if folder.overwrite or folder.resuming or not saved_path.is_file():
        return None
    try:
        saved = _comparable(yaml.safe_load(saved_path.read_text()))
    except (OSError, yaml.YAMLError):
        saved = {}
    ours = _comparable(folder.sections)
    # Fields only one side knows come from another grpo-kit version, not from another run.
    differ = sorted(k for k in set(saved) & set(ours) if saved[k] != ours[k])
    if not differ:
        return None
    shown = ", ".join(f"{k}: {saved.get(k)!r} -> {ours.get(k)!r}" for k in differ[:4])
    more = f" (and {len(differ) - 4} more)" if len(differ) > 4 else ""
    return (
        f"output_dir: {folder.path} holds another run (its config.yaml differs: {shown}{more}); "
        "add --resume to continue that run, --overwrite to replace it, or choose another "
        "--output_dir (leave it out for a new folder per run)"
    )


def clear_run_dir(folder: RunFolder) -> None:
    """With ``overwrite``: delete the earlier run's files (``RUN_ARTIFACTS``, nothing else)."""
    if not folder.overwrite:
        return
    run_dir = folder.path
    for name in RUN_ARTIFACTS:
        path = run_dir / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
