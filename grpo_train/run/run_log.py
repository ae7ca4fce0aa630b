"""The run log: per-step metrics to JSONL, TensorBoard and W&B, sample completions, progress.

Metrics are flat ``{name: float}`` maps with ``/``-separated names (``reward/mean``,
``time/generate``), computed in ``grpo_train.collect.metrics``; ``grpo plot RUN_DIR`` reads
``metrics.jsonl`` back. On the first step, every ``log_every_samples`` steps and on the last
step one group's completions go to ``samples.jsonl`` (``samples_due``), as the rows
``grpo_train.collect.samples`` makes of them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

logger = logging.getLogger("grpo_train")

METRICS_FILE = "metrics.jsonl"
SAMPLES_FILE = "samples.jsonl"


def samples_due(step: int, every: int, max_steps: int) -> bool:
    """Return whether ``step`` (1-based) logs sample completions.

    The first and the last step always do (what the model wrote before and after training,
    whatever the run's length), and every ``every``-th step between; ``every`` 0 logs none.

    >>> [s for s in range(1, 9) if samples_due(s, 10, 8)]
    [1, 8]
    >>> [s for s in range(1, 26) if samples_due(s, 10, 25)]
    [1, 10, 20, 25]
    >>> [s for s in range(1, 4) if samples_due(s, 0, 3)]
    []
    """
    if every <= 0:
        return False
    return step == 1 or step % every == 0 or step == max_steps


@dataclass(frozen=True)
class WandbSettings:
    """Where a run logs to Weights & Biases (``wandb: true``)."""

    project: str = "grpo-kit"
    entity: str = ""
    """Empty: the user's default entity."""
    run_name: str = ""
    """Empty: the run folder's name."""
    tags: tuple[str, ...] = ()
    config: Mapping[str, object] = field(default_factory=dict)
    """The run's configuration as W&B records it (``config.yaml``'s sectioned form)."""


@dataclass(frozen=True)
class RunLogSettings:
    """What a run's log writes to beside ``metrics.jsonl`` and ``samples.jsonl``."""

    max_steps: int
    """The run's length: the progress bar's total."""
    progress: bool = True
    """Show a progress bar with ETA."""
    wandb: WandbSettings | None = None
    """Also log to Weights & Biases; None: not."""


@dataclass(frozen=True)
class StartNotes:
    """What the run says about its settings when it starts (after the log is open)."""

    info: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()


def read_metrics(run_dir: str | Path) -> list[dict[str, float]]:
    """Read the per-step metric rows of a run (each has a ``step`` key)."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


#: What the progress bar shows after each step: metric -> (label, format).
_POSTFIX = {
    "reward/mean": ("reward", ".3f"),
    "eval/accuracy": ("eval", ".3f"),
    "throughput/samples_per_s": ("samples/s", ".1f"),
}


def progress_postfix(metrics: Mapping[str, float]) -> dict[str, str]:
    """Return the progress bar's step summary: reward, held-out accuracy, samples per second.

    >>> progress_postfix({"reward/mean": 0.25, "throughput/samples_per_s": 12.34, "loss": 1.0})
    {'reward': '0.250', 'samples/s': '12.3'}
    """
    return {
        label: format(metrics[name], spec)
        for name, (label, spec) in _POSTFIX.items()
        if name in metrics
    }


def open_run_log(
    settings: RunLogSettings,
    config_yaml: str,
    notes: StartNotes,
    run_dir: Path,
    start_step: int,
    main: bool,
    resume_from: Path | None,
    launch: str,
) -> RunLogger:
    """Write the run's config and lineage (main rank), say what to expect; return the run's log.

    ``config_yaml``: the resolved configuration, written as the run's ``config.yaml``;
    ``notes``: what to say about the settings (main rank). Checkpoints after the resumed step
    are on a branch this launch abandons: they are moved aside (``checkpoint.start_lineage``),
    with a warning naming each.
    """
    from grpo_train.run.checkpoint import start_lineage

    if main:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(config_yaml)
        for moved in start_lineage(run_dir, resume_from, launch):
            logger.warning(
                "%s is on a branch this run abandons (after the resumed step): moved to %s",
                moved.name,
                moved,
            )
    log = RunLogger(run_dir, settings, start_step=start_step, enabled=main)
    for note in notes.info if main else ():
        logger.info(note)
    for note in notes.warnings if main else ():
        logger.warning(note)
    if start_step >= settings.max_steps:  # never train 0 steps silently (a TRL bug)
        logger.warning("resumed at step %d >= max_steps: nothing to do", start_step)
    return log


class RunLogger:
    """Writes a run's metrics and samples; one instance per run."""

    def __init__(
        self,
        run_dir: str | Path,
        settings: RunLogSettings,
        *,
        start_step: int = 0,
        use_tensorboard: bool = True,
        enabled: bool = True,
    ) -> None:
        """Open the sinks; ``enabled=False`` (non-main ranks) writes nothing at all."""
        self.run_dir = Path(run_dir)
        self.enabled = enabled
        self._tb = None
        self._wandb = None
        self._bar = None
        self._metrics_path = self.run_dir / METRICS_FILE
        if not enabled:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        from grpo_train.run.console import attach_run_log

        # grpo train: the details go there until the command ends (its summary and plots too).
        attach_run_log(self.run_dir)
        # On resume, forget rows the interrupted run wrote after its checkpoint: they are redone
        # (metrics and samples alike, so that both files describe the same steps).
        for name in (METRICS_FILE, SAMPLES_FILE):
            with _writing(self.run_dir / name):
                truncate_after(self.run_dir / name, start_step)
        self._tb = None
        if use_tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(self.run_dir / "tensorboard"))
            except ImportError:  # tensorboard is an optional extra
                logger.warning("tensorboard is not installed; metrics go to %s only", METRICS_FILE)
        self._wandb = None
        if settings.wandb is not None:
            try:
                import wandb  # type: ignore[import-not-found]
            except ImportError:
                logger.warning(
                    "wandb=true but the wandb package is not installed: pip install wandb"
                )
            else:
                self._wandb = wandb.init(
                    **wandb_init_kwargs(self.run_dir, settings.wandb, start_step)
                )
        self._bar = None
        if settings.progress:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=settings.max_steps, initial=start_step, desc="grpo", unit="step")

    def log_step(self, step: int, metrics: Mapping[str, float]) -> None:
        """Append one step's metrics to every sink and advance the progress bar."""
        if not self.enabled:
            return
        self._write(step, metrics)
        if self._bar is not None:
            self._bar.set_postfix(progress_postfix(metrics))
            self._bar.update(1)

    def log_eval(self, step: int, metrics: Mapping[str, float]) -> None:
        """Record an evaluation that is not attached to a training step row (before training)."""
        if not self.enabled:
            return
        self._write(step, metrics)

    def _write(self, step: int, metrics: Mapping[str, float]) -> None:
        """Append one row to the JSONL file and send the finite values to TensorBoard / W&B."""
        row = {"step": step, **{k: _finite(v) for k, v in metrics.items()}}
        with _writing(self._metrics_path), self._metrics_path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        if self._tb is not None:
            for name, value in metrics.items():
                if value is not None and math.isfinite(value):
                    self._tb.add_scalar(name, value, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(dict(metrics), step=step)

    def log_samples(self, records: Sequence[DataclassInstance]) -> None:
        """Append sample completions to ``samples.jsonl``, a JSON row per dataclass record.

        The rows are ``grpo_train.collect.samples.TrainingSample`` (or ``EpisodeSample``).
        """
        if not self.enabled:
            return
        path = self.run_dir / SAMPLES_FILE
        with _writing(path), path.open("a") as f:
            for rec in records:
                f.write(json.dumps(asdict(rec)) + "\n")

    def write(self, message: str) -> None:
        """Print a line without breaking the progress bar."""
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.write(message)
        else:
            print(message, flush=True)

    def close(self) -> None:
        """Flush and close every sink."""
        if self._bar is not None:
            self._bar.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def truncate_after(path: Path, step: int) -> None:
    """Drop the JSONL rows of ``path`` whose ``step`` is after ``step`` (a resumed run redoes them).

    Rows that are not JSON objects with a step are kept: they are not ours to judge.
    """
    if not path.is_file():
        return
    kept = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            row = None
        step_of_row = row.get("step") if isinstance(row, dict) else None
        if isinstance(step_of_row, int | float) and step_of_row > step:
            continue
        kept.append(line + "\n")
    path.write_text("".join(kept))


WANDB_ID_FILE = "wandb_run_id"


def wandb_init_kwargs(run_dir: Path, settings: WandbSettings, start_step: int) -> dict[str, object]:
    """Arguments for ``wandb.init``: one W&B run per run folder, continued on resume.

    The run id is made once and kept in ``run_dir/wandb_run_id``; a resumed run (``start_step``
    > 0) passes it back with ``resume="allow"``, so its steps continue the same W&B run instead of
    opening a new one. A fresh start in the folder gets a new id.
    """
    import secrets

    id_file = run_dir / WANDB_ID_FILE
    run_id = id_file.read_text().strip() if id_file.is_file() and start_step > 0 else ""
    if not run_id:
        run_id = secrets.token_hex(4)
        id_file.write_text(run_id + "\n")
    kwargs: dict[str, object] = {
        "project": settings.project,
        "dir": str(run_dir),
        "config": settings.config,
        "id": run_id,
        "resume": "allow",
        "name": settings.run_name or run_dir.resolve().name,
    }
    if settings.entity:
        kwargs["entity"] = settings.entity
    if settings.tags:
        kwargs["tags"] = list(settings.tags)
    return kwargs


@contextlib.contextmanager
def _writing(path: Path) -> Iterator[None]:
    """Re-raise a failed write as an ``OSError`` that names ``path``.

    ENOSPC surfaces at write or close, without a file name; the command then says which file.
    """
    try:
        yield
    except OSError as err:
        if err.filename or not err.errno:
            raise
        raise OSError(err.errno, os.strerror(err.errno), str(path)) from None


def _finite(value: float) -> float | None:
    """JSON has no NaN: non-finite values are written as null (and noted in the warning log)."""
    return float(value) if value is not None and math.isfinite(value) else None
