"""Atomic, resumable checkpoints.

A checkpoint is a folder ``RUN_DIR/checkpoints/step-000010/`` holding:

- ``model/``: the policy in Hugging Face format (safetensors + tokenizer), loadable by
  transformers and vLLM as is;
- ``trainer_state.pt``: optimizer, LR scheduler, RNG states (python, numpy, torch), the step,
  the prompt sampler's position and the EMA reward baselines (``advantage_estimator: ema``);
- ``config.yaml``: the resolved configuration;
- ``manifest.json``: what the checkpoint is (``Manifest``): the model's identity (architecture,
  sizes, vocabulary, dtype, LoRA settings, a fingerprint of the base weights), the environments,
  the configuration, the lineage (``launch`` and ``parent``) and the size and CRC32 of every other
  file, checked before anything is loaded (``verify_files``) and against the new configuration on
  resume (``resume_differences``);
- ``accelerate/`` (FSDP and DeepSpeed runs only): ``Accelerator.save_state`` output, i.e. the
  sharded training state (optimizer shards, per-rank RNG) in the layout the launcher's config
  asks for (FSDP ``fsdp_state_dict_type``: one gathered file, or per-rank DCP shards; DeepSpeed:
  its own ``save_checkpoint`` folder). ``trainer_state.pt`` then holds no optimizer.

Why accelerate's own state for sharded runs: under FSDP each rank's optimizer holds only its
shard (DTensors), and under DeepSpeed the optimizer lives inside the engine, so rank 0's
``optimizer.state_dict()`` is a fraction of the state and cannot be loaded into a fresh
optimizer. ``save_state`` / ``load_state`` go through
``torch.distributed.checkpoint.state_dict.get_optimizer_state_dict`` (FSDP2) or
``FSDP.optim_state_dict`` (FSDP1) or DeepSpeed's engine, which is what accelerate documents for
resuming "in the same environment".

It is written into a temporary folder beside its final place and renamed into place, so a crash
while saving never leaves a half-written checkpoint that ``--resume`` would pick up. Only the last
``keep_last`` checkpoints are kept.

Lineage: ``checkpoints/lineage.json`` names the head (the checkpoint the current launch started
from, then each one it wrote) and the launch that owns it. ``latest_checkpoint`` follows it, not
the highest step number on disk: after a roll back (``--resume step-000006``) the later steps of
the abandoned branch are moved into ``checkpoints/abandoned/<launch>/`` (``start_lineage``), so a
crash of the new branch resumes the new branch.

Why one module over 500 lines: the manifest, the lineage head and the atomic write are one
protocol (what is written, renamed and recorded in which order); checking that a kill at any
moment leaves a resumable run needs all of it in one place.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import random
import shutil
import uuid
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


_PREFIX = "step-"
STATE_FILE = "trainer_state.pt"
MODEL_DIR = "model"
ACCELERATE_DIR = "accelerate"
MANIFEST_FILE = "manifest.json"
SWITCHES_FILE = "switches.json"
#: ``async_generation``: the finished batches of the steps after the checkpoint (pickled).
ROLLOUTS_FILE = "rollouts.pt"
"""What the automatic heuristics switched, after which step, over every launch up to this one."""
LINEAGE_FILE = "lineage.json"
ABANDONED_DIR = "abandoned"
_MANIFEST_FORMAT = 1


class CheckpointError(ValueError):
    """A checkpoint cannot be used as asked; the message names the file or field and the fix."""


class OutputWriteError(OSError):
    """Writing the run's outputs failed (disk full, read-only); the message names the path."""


@dataclass(frozen=True)
class FileEntry:
    """Size and CRC32 of one checkpoint file.

    A corruption check, not a defence against tampering: CRC32 (zlib) hashed ~1.2 GB/s where
    SHA-256 did ~130 MB/s on the 2-core development machine, and every resume checks every file.
    """

    size: int
    crc32: int


@dataclass(frozen=True)
class RunIdentity:
    """What a checkpoint must agree with to be resumed: model identity, environments, fields."""

    model: Mapping[str, object]
    """Architecture, sizes, vocabulary, dtype, LoRA settings and base-weights fingerprint."""
    envs: Sequence[Mapping[str, object]]
    """``{id, weight, kwargs}`` of each training environment, in order."""
    config: Mapping[str, object]
    """The flat resolved configuration (``field: value``)."""


@dataclass(frozen=True)
class Manifest:
    """``manifest.json`` of a checkpoint."""

    step: int
    launch: str
    """Id of the launch (one ``grpo train`` process group) that wrote it."""
    parent: str | None
    """The checkpoint this one descends from (the head when it was written), or None."""
    identity: RunIdentity
    files: Mapping[str, FileEntry] = field(default_factory=dict)
    format: int = _MANIFEST_FORMAT

    def to_json(self) -> dict[str, object]:
        """Return the JSON form."""
        return {
            "format": self.format,
            "step": self.step,
            "launch": self.launch,
            "parent": self.parent,
            "model": dict(self.identity.model),
            "envs": [dict(e) for e in self.identity.envs],
            "config": dict(self.identity.config),
            "files": {k: asdict(v) for k, v in sorted(self.files.items())},
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, object]) -> Manifest:
        """Read the JSON form (``read_manifest`` wraps errors with the file name)."""
        files = cast(Mapping[str, Mapping[str, int]], raw["files"])
        return cls(
            step=int(cast(int, raw["step"])),
            launch=str(raw["launch"]),
            parent=None if raw.get("parent") is None else str(raw["parent"]),
            identity=RunIdentity(
                model=cast(Mapping[str, object], raw["model"]),
                envs=cast(Sequence[Mapping[str, object]], raw["envs"]),
                config=cast(Mapping[str, object], raw["config"]),
            ),
            files={k: FileEntry(int(v["size"]), int(v["crc32"])) for k, v in files.items()},
            format=int(cast(int, raw.get("format", _MANIFEST_FORMAT))),
        )


def new_launch_id() -> str:
    """Return a fresh id for one launch of the trainer."""
    return uuid.uuid4().hex[:12]


def file_entry(path: Path) -> FileEntry:
    """Size and CRC32 of ``path``, read in 16 MiB chunks."""
    crc = 0
    with path.open("rb") as f:
        while chunk := f.read(16 << 20):
            crc = zlib.crc32(chunk, crc)
    return FileEntry(path.stat().st_size, crc)


def read_manifest(path: str | Path) -> Manifest | None:
    """Return the manifest of checkpoint ``path``; None for one written before manifests.

    Raises ``CheckpointError`` (naming the file) when it exists but cannot be read.
    """
    file = Path(path) / MANIFEST_FILE
    if not file.exists():
        return None
    try:
        return Manifest.from_json(json.loads(file.read_text()))
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise CheckpointError(
            f"checkpoint {path} is damaged: {MANIFEST_FILE} cannot be read "
            f"({type(err).__name__}: {err}). {offer_previous(Path(path))}"
        ) from None


def verify_files(path: str | Path, manifest: Manifest | None = None) -> None:
    """Check every file of checkpoint ``path`` against its manifest (size, then CRC32).

    Raises ``CheckpointError`` naming the first bad file and offering the previous good
    checkpoint of the run. A checkpoint without a manifest is only checked for its state file.
    """
    path = Path(path)
    manifest = manifest if manifest is not None else read_manifest(path)
    problem = None
    if manifest is None:
        if not (path / STATE_FILE).is_file():
            problem = f"{STATE_FILE} is missing"
    else:
        for name, want in sorted(manifest.files.items()):
            file = path / name
            if not file.is_file():
                problem = f"{name} is missing"
            elif file.stat().st_size != want.size:
                problem = f"{name} is {file.stat().st_size} bytes, the manifest says {want.size}"
            elif file_entry(file).crc32 != want.crc32:
                problem = f"{name} does not match its checksum (bytes changed on disk)"
            if problem:
                break
    if problem:
        raise CheckpointError(f"checkpoint {path} is damaged: {problem}. {offer_previous(path)}")


def offer_previous(bad: Path) -> str:
    """Name the newest good checkpoint before ``bad`` in the same run, and how to use it."""
    run_dir = bad.parent.parent
    for candidate in reversed(list_checkpoints(run_dir)):
        if _step(candidate) >= _step(bad):
            continue
        try:
            verify_files(candidate)
        except CheckpointError:
            continue
        return (
            f"The previous good checkpoint is {candidate}: resume from it with "
            f"--resume {candidate} (the damaged one is moved aside)"
        )
    return "There is no earlier good checkpoint: start again, or delete the damaged folder"


def _step(path: Path) -> int:
    try:
        return int(path.name[len(_PREFIX) :])
    except ValueError:
        return -1


def model_identity(
    model_path: str | Path, dtype: str, lora: Mapping[str, object] | None
) -> dict[str, object]:
    """Return a base model's identity: architecture, sizes, vocabulary, dtype, LoRA, weights.

    The weights fingerprint is the CRC32 of each weight file's size, first and last MiB (reading
    whole files would cost seconds per resume for a 1 GB model and add nothing against a swap
    of models); a hub id without a local folder is fingerprinted by its name.
    """
    from transformers import AutoConfig

    conf = AutoConfig.from_pretrained(str(model_path))
    text = getattr(conf, "text_config", None) or conf
    keys = (
        "model_type",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "vocab_size",
    )
    out: dict[str, object] = {"architecture": ",".join(getattr(conf, "architectures", None) or [])}
    out.update({k: getattr(text, k, None) for k in keys})
    out["dtype"] = dtype
    out["lora"] = dict(lora) if lora is not None else None
    folder = Path(model_path)
    if folder.is_dir():
        crc = 0
        for file in sorted(folder.glob("*.safetensors")) + sorted(folder.glob("*.bin")):
            size = file.stat().st_size
            crc = zlib.crc32(f"{file.name}:{size}".encode(), crc)
            with file.open("rb") as f:
                crc = zlib.crc32(f.read(1 << 20), crc)
                f.seek(max(0, size - (1 << 20)))
                crc = zlib.crc32(f.read(), crc)
        out["weights"] = f"crc32:{crc:08x}"
    else:
        out["weights"] = f"hub:{model_path}"
    return out


def resume_differences(saved: RunIdentity, now: RunIdentity, fixed: frozenset[str]) -> list[str]:
    """``field: checkpoint X, now Y`` for each difference that forbids resuming."""
    out = []
    for key in sorted(set(saved.model) | set(now.model)):
        if saved.model.get(key) != now.model.get(key):
            out.append(
                f"model {key}: checkpoint {saved.model.get(key)!r}, now {now.model.get(key)!r}"
            )
    if list(map(dict, saved.envs)) != list(map(dict, now.envs)):
        out.append(f"env: checkpoint {_envs_text(saved.envs)}, now {_envs_text(now.envs)}")
    for key in sorted(fixed - {"env"}):
        if key in saved.config and saved.config.get(key) != now.config.get(key):
            out.append(f"{key}: checkpoint {saved.config[key]!r}, now {now.config.get(key)!r}")
    return out


def _envs_text(envs: Sequence[Mapping[str, object]]) -> str:
    parts = []
    for e in envs:
        extra = f" {dict(cast(Mapping[str, object], e['kwargs']))}" if e.get("kwargs") else ""
        parts.append(f"{e['id']}:{e.get('weight', 1.0)}{extra}")
    return "[" + ", ".join(parts) + "]"


# ------------------------------------------------------------------------------------- lineage


@dataclass(frozen=True)
class Head:
    """``checkpoints/lineage.json``: the current lineage's newest checkpoint and its launch."""

    checkpoint: str | None
    launch: str


def read_head(run_dir: str | Path) -> Head | None:
    """Return the run's lineage head, or None (a run from before lineages, a damaged file)."""
    file = checkpoint_dir(run_dir) / LINEAGE_FILE
    try:
        raw = json.loads(file.read_text())
        return Head(raw.get("checkpoint"), str(raw["launch"]))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def write_head(run_dir: str | Path, head: Head) -> None:
    """Atomically replace the lineage head."""
    root = checkpoint_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".{LINEAGE_FILE}.tmp"
    tmp.write_text(json.dumps(asdict(head)) + "\n")
    os.replace(tmp, root / LINEAGE_FILE)


def _launch_of(path: Path) -> str | None:
    try:
        manifest = read_manifest(path)
    except CheckpointError:
        return None
    return manifest.launch if manifest is not None else None


def start_lineage(run_dir: str | Path, start: Path | None, launch: str) -> list[Path]:
    """Make ``start`` (None: a fresh run) the head of a new launch; move later steps aside.

    Every checkpoint of the run with a step above ``start``'s belongs to a branch this launch
    abandons (a roll back, or a new run over an old folder): it is moved, not deleted, into
    ``checkpoints/abandoned/<launch>/``. Returns the moved folders' new paths.
    """
    root = checkpoint_dir(run_dir)
    if start is not None and start.parent.resolve() != root.resolve():
        start = None  # a checkpoint of another run folder: this folder starts a fresh lineage
    write_head(run_dir, Head(start.name if start is not None else None, launch))
    floor = _step(start) if start is not None else -1
    moved = []
    for path in list_checkpoints(run_dir):
        if _step(path) > floor:
            target = root / ABANDONED_DIR / launch / path.name
            target.parent.mkdir(parents=True, exist_ok=True)
            path.rename(target)
            moved.append(target)
    return moved


@dataclass(frozen=True)
class SamplerState:
    """Where the data stands: prompts drawn so far, per environment, and the curriculum.

    ``positions`` count within each environment's current curriculum stage; ``curriculum`` is
    ``curriculum.CurriculumState.to_json()`` and ``filter_memory`` ``PassRateFilter.to_json()``
    (empty in checkpoints written before curricula existed: every environment at its start).
    ``signal_streak`` / ``signal_fired`` / ``signal_eased`` are the learning-signal guard's
    (``learning_signal.SignalGuard``, owned by ``AutoHeuristics``): with ``dynamic_sampling:
    auto`` and ``curriculum: auto`` they decide how the next steps draw.
    """

    draws: int = 0
    positions: tuple[int, ...] = ()
    curriculum: Mapping[str, object] = field(default_factory=dict)
    filter_memory: tuple[tuple[str | int | float, ...], ...] = ()
    signal_streak: int = 0
    signal_fired: bool = False
    signal_eased: bool = False


def _signal_state(saved: object) -> tuple[int, bool, bool]:
    """Return the guard's ``[streak, fired, eased]`` (``[streak, fired]`` in older checkpoints)."""
    if not isinstance(saved, list | tuple):
        return 0, False, False
    streak, fired, *rest = saved
    return int(streak), bool(fired), bool(rest and rest[0])


@dataclass(frozen=True)
class ResumeState:
    """What ``load_checkpoint`` restores besides the tensors it loads in place."""

    step: int
    sampler: SamplerState
    path: Path
    baselines: Mapping[str, Mapping[str, float]] | None = None
    """The EMA reward baselines (``baselines.EmaBaselines.to_state``); None when not saved."""
    switches: tuple[tuple[int, str], ...] | None = None
    """``(step, what)`` of every automatic switch of the run so far (``learning_signal.Switch``);
    None for a checkpoint written before they were recorded."""


def checkpoint_dir(run_dir: str | Path) -> Path:
    """Return the folder holding a run's checkpoints."""
    return Path(run_dir) / "checkpoints"


def checkpoint_path(run_dir: str | Path, step: int) -> Path:
    """Return the folder of the checkpoint of ``step``."""
    return checkpoint_dir(run_dir) / f"{_PREFIX}{step:06d}"


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first."""
    root = checkpoint_dir(run_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.name.startswith(_PREFIX) and (p / STATE_FILE).is_file()]
    return sorted(found, key=lambda p: int(p.name[len(_PREFIX) :]))


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """Return the last complete checkpoint of the run's current lineage, or None.

    The lineage head, or a newer checkpoint written by the head's launch (a crash between
    writing a checkpoint and moving the head). A run without a lineage file (older grpo-kit)
    gets its highest step.
    """
    found = list_checkpoints(run_dir)
    head = read_head(run_dir)
    if head is None:
        return found[-1] if found else None
    ours = [p for p in found if p.name == head.checkpoint or _launch_of(p) == head.launch]
    return ours[-1] if ours else None


def rng_state() -> dict[str, object]:
    """Return the process's global random states: Python's, NumPy's, torch's CPU and CUDA."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()  # type: ignore[misc]
    return {
        "python": random.getstate(),
        "numpy": (kind, torch.from_numpy(np.asarray(keys).copy()), pos, has_gauss, gauss),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def rank_rng_file(rank: int) -> str:
    """Return the file a launched run's rank saves its random states in.

    >>> rank_rng_file(3)
    'rng-rank3.pt'
    """
    return f"rng-rank{rank}.pt"


def set_rng_state(state: dict[str, object]) -> None:
    """Restore the global random states ``rng_state`` returned."""
    random.setstate(state["python"])  # type: ignore[arg-type]
    numpy_state = cast(tuple[str, torch.Tensor, int, int, float], state["numpy"])
    kind, keys, pos, has_gauss, gauss = numpy_state
    np.random.set_state((kind, keys.numpy(), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])  # type: ignore[arg-type]
    if state.get("cuda") and torch.cuda.is_available():
        # One state per GPU the saving process saw; a resume that sees fewer (another machine,
        # CUDA_VISIBLE_DEVICES) restores those it has: torch's set_rng_state_all would index
        # past its generators (IndexError, or deferred to CUDA's first use when not yet started).
        saved = cast(list[torch.Tensor], state["cuda"])
        for index, device_state in enumerate(saved[: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(device_state, index)


def save_checkpoint(
    run_dir: str | Path,
    step: int,
    *,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    sampler: SamplerState,
    config_yaml: str,
    keep_last: int,
    state_dict: Mapping[str, torch.Tensor] | None = None,
    accelerator: Any = None,
    identity: RunIdentity | None = None,
    launch: str | None = None,
    baselines: Mapping[str, Mapping[str, float]] | None = None,
    switches: Sequence[tuple[int, str]] = (),
    rollouts: Sequence[object] = (),
) -> Path:
    """Write a checkpoint of ``step`` atomically and delete all but the newest ``keep_last``.

    ``baselines``: the EMA reward baselines' plain-dictionary state (training state like the
    optimizer's: a resumed run computes the same advantages as an uninterrupted one).
    ``switches``: ``(step, what)`` of every automatic switch so far (``switches.json``), so that a
    resumed run's summary still says what switched in its earlier launches.
    ``config_yaml``: the run's resolved configuration, written as the checkpoint's
    ``config.yaml`` (``TrainConfig.to_yaml``).
    ``rollouts``: ``async_generation``'s finished batches of the next steps
    (``collect.pipeline.Rollouts``), into ``rollouts.pt``; ``read_rollouts`` loads them.

    ``identity`` / ``launch``: what goes into ``manifest.json`` (None: no manifest, as before);
    the checkpoint then becomes the lineage head of ``launch``. A full disk or an unwritable
    folder raises ``OutputWriteError`` naming the folder and the space a checkpoint needs; in a
    launched job a failure on one rank makes every rank raise at its next agreement
    (``_SaveStages``), naming that rank, with the previous checkpoint still the last one.

    A LoRA (peft) model writes only its adapter into ``model/``. ``state_dict``: the gathered
    full weights of a sharded (FSDP / ZeRO-3) model (``weight_export.full_state_dict``; only rank
    0's matters). ``accelerator``: the run's ``accelerate.Accelerator`` in a launched job; the call
    is then collective (every rank calls it, the main process writes the shared files) and an
    FSDP / DeepSpeed run's optimizer goes through ``accelerator.save_state`` into
    ``accelerate/``. Without it, a single process writes everything.
    """
    from grpo_train.parallel.distributed import shards_training_state

    sharded = shards_training_state(accelerator)
    main = accelerator is None or bool(accelerator.is_main_process)
    root = checkpoint_dir(run_dir)
    final = checkpoint_path(run_dir, step)
    # The same name on every rank (save_state writes per-rank files into it); rank 0 clears
    # what a crashed save may have left.
    tmp = root / f".tmp-{final.name}"
    parent = read_head(run_dir) if main else None
    stages = _SaveStages(final, model)
    try:
        with stages.stage():
            if main:
                shutil.rmtree(tmp, ignore_errors=True)
                tmp.mkdir(parents=True)
        stages.agree()
        with stages.stage():
            if sharded:
                # Collective itself: optimizer shards, model shards, per-rank RNG.
                accelerator.save_state(str(tmp / ACCELERATE_DIR))
            if accelerator is not None and not sharded and accelerator.num_processes > 1:
                # Each rank's own random states (its CUDA generator, its CPU one): the main
                # process's trainer state holds only rank 0's. Sharded runs have them in
                # accelerate/ (save_state).
                torch.save(rng_state(), tmp / rank_rng_file(accelerator.process_index))
            if main:
                optimizer_file = None if sharded else optimizer  # sharded: in accelerate/ already
                _write_files(tmp, step, model=model, tokenizer=tokenizer, optimizer=optimizer_file,
                             scheduler=scheduler, sampler=sampler, config_yaml=config_yaml,
                             state_dict=state_dict, baselines=baselines)  # fmt: skip
                records = [{"step": int(step_), "what": str(what)} for step_, what in switches]
                (tmp / SWITCHES_FILE).write_text(json.dumps(records, indent=1) + "\n")
                if rollouts:
                    torch.save(list(rollouts), tmp / ROLLOUTS_FILE)
        stages.agree()  # every rank's files are in tmp before it is renamed
        with stages.stage():
            if main and identity is not None and launch is not None:
                parent_name = parent.checkpoint if parent is not None else None
                _write_manifest(tmp, Manifest(step, launch, parent_name, identity, {}))
            if main:
                _publish(tmp, final)
                if launch is not None:
                    write_head(run_dir, Head(final.name, launch))
                for stale in list_checkpoints(run_dir)[:-keep_last]:
                    shutil.rmtree(stale, ignore_errors=True)
        stages.agree()  # no rank goes on before the checkpoint is in place
    finally:
        if main and tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


class _SaveStages:
    """The stages of a collective save, ended by agreements where a save used to have barriers.

    ``stage()`` keeps an exception of this rank's part instead of raising it; ``agree()`` (every
    rank calls it) then raises on every rank as soon as one failed. A rank that raised at once
    would never reach the next barrier, and the others would wait there until the process
    group's timeout (NCCL: 10-30 minutes), to fail with a timeout naming nobody. The failing
    rank raises its own error (a failed write as ``OutputWriteError``, with the space a
    checkpoint needs; anything else, a bug, as it was), every other rank an ``OutputWriteError``
    naming it, in one line. The temporary folder is then removed and the previous checkpoint
    stays the last one. ``accelerator.save_state`` is collective inside: a rank failing in the
    middle of it is beyond this.
    """

    def __init__(self, final: Path, model: Any) -> None:
        self.final = final
        self.model = model
        self.error: Exception | None = None

    @contextlib.contextmanager
    def stage(self) -> Iterator[None]:
        """Run this rank's part of a stage; keep its exception for ``agree``."""
        try:
            yield
        except Exception as err:  # raised by agree(), on every rank
            self.error = err

    def agree(self) -> None:
        """Raise on every rank when a stage failed on any (collective: every rank calls it)."""
        from grpo_train.parallel.distributed import failed_rank, multi_rank

        own = self.error
        failure = failed_rank(None if own is None else self._detail(own))
        if failure is None:
            return
        if own is not None and not _failed_write(own):
            raise own
        written = (
            None if own is None else _write_error(own, self.final.parent, self.final, self.model)
        )
        if written is not None and not multi_rank():
            raise written from None  # one process: the error as it always was
        code = errno.EIO if written is None else written.errno or errno.EIO
        raise OutputWriteError(
            code,
            f"cannot write checkpoint {self.final}: rank {failure.rank} failed: {failure.error}",
        )

    def _detail(self, err: Exception) -> str:
        """One line: a failed write's reason and the space note, else the error's type and text."""
        if _failed_write(err):
            return f"{_reason(err)}; {_space_note(self.final.parent, self.model)}"
        first = str(err).strip().splitlines()[0][:200] if str(err).strip() else ""
        return f"{type(err).__name__}{': ' + first if first else ''}"


def _write_manifest(tmp: Path, manifest: Manifest) -> None:
    """Write ``manifest.json`` into the staged checkpoint, with every staged file's entry."""
    files = {str(f.relative_to(tmp)): file_entry(f) for f in sorted(tmp.rglob("*")) if f.is_file()}
    manifest = replace(manifest, files=files)
    (tmp / MANIFEST_FILE).write_text(json.dumps(manifest.to_json(), indent=1) + "\n")


def _write_error(err: BaseException, root: Path, final: Path, model: Any) -> OutputWriteError:
    """Build the error of a failed checkpoint write: the folder and the space one needs."""
    note = _space_note(root, model)
    return OutputWriteError(
        errno.ENOSPC if "space" in note else errno.EIO,
        f"cannot write checkpoint {final} ({_reason(err)}); {note}",
    )


def _failed_write(err: BaseException) -> bool:
    """Return whether ``err``, raised while saving, is a failed write (``_is_write_failure``)."""
    return isinstance(err, OSError | RuntimeError) and _is_write_failure(err)


def _is_write_failure(err: BaseException) -> bool:
    """Return whether ``err`` is an I/O failure while writing, not a bug.

    ENOSPC, EROFS, EACCES, EIO, EDQUOT, EPERM, or torch's zip writer reporting a short write
    ("unexpected pos": what ``torch.save`` raises on a full disk).
    """
    if isinstance(err, OSError):
        return err.errno in (
            errno.ENOSPC,
            errno.EROFS,
            errno.EACCES,
            errno.EIO,
            errno.EDQUOT,
            errno.EPERM,
        )
    text = str(err)
    return "unexpected pos" in text or "No space left" in text or "file write failed" in text


def _reason(err: BaseException) -> str:
    if isinstance(err, OSError) and err.errno is not None:
        return os.strerror(err.errno)
    return "a short write: " + str(err).strip().splitlines()[0][:120]


def _space_note(root: Path, model: Any) -> str:
    """Describe the free space beside ``root`` and what one checkpoint needs.

    The need is the last checkpoint's size, else an estimate: float32 weights plus AdamW's two
    moments.
    """
    try:
        free = shutil.disk_usage(root if root.exists() else root.parent).free
    except OSError:
        return "check that the folder is writable"
    previous = [p for p in list_checkpoints(root.parent)]
    if previous:
        need = sum(f.stat().st_size for f in previous[-1].rglob("*") if f.is_file())
    else:
        params = sum(p.numel() for p in model.parameters()) if hasattr(model, "parameters") else 0
        need = params * 4 * 3
    mib = 1 << 20
    if free < need * 1.1:
        return (
            f"no space left: {free / mib:.0f} MiB free, a checkpoint needs about "
            f"{need / mib:.0f} MiB; free space, lower keep_last, or set output_dir elsewhere"
        )
    return (
        f"{free / mib:.0f} MiB free (a checkpoint needs about {need / mib:.0f} MiB); "
        "check that the folder is writable"
    )


def _write_files(
    folder: Path,
    step: int,
    *,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    optimizer: torch.optim.Optimizer | None,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    sampler: SamplerState,
    config_yaml: str,
    state_dict: Mapping[str, torch.Tensor] | None,
    baselines: Mapping[str, Mapping[str, float]] | None = None,
) -> None:
    """Write the main process's part of a checkpoint: HF model, trainer state, config."""
    from grpo_train.models.loading import no_progress_bars

    full = None if state_dict is None else dict(state_dict)
    with no_progress_bars():  # one bar per checkpoint would interleave with the run's own
        model.save_pretrained(folder / MODEL_DIR, safe_serialization=True, state_dict=full)
    tokenizer.save_pretrained(folder / MODEL_DIR)
    state = {
        "step": step,
        "optimizer": None if optimizer is None else optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "rng": rng_state(),
        "sampler": {
            "draws": sampler.draws,
            "positions": list(sampler.positions),
            "curriculum": dict(sampler.curriculum),
            "filter_memory": [list(row) for row in sampler.filter_memory],
            "signal": [sampler.signal_streak, sampler.signal_fired, sampler.signal_eased],
        },
    }
    if baselines is not None:
        state["baselines"] = {name: dict(table) for name, table in baselines.items()}
    torch.save(state, folder / STATE_FILE)
    (folder / "config.yaml").write_text(config_yaml)


def _publish(tmp: Path, final: Path) -> None:
    """Rename a finished temporary folder into place (replacing a checkpoint of the same step)."""
    if final.exists():  # re-saving a step (e.g. after a resume): swap, then delete the old one
        old = final.with_name(f".old-{final.name}")
        final.rename(old)
        tmp.rename(final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(final)


def load_checkpoint(
    path: str | Path,
    *,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    accelerator: Any = None,
) -> ResumeState:
    """Restore optimizer, scheduler and RNG states from ``path`` (the model is in ``path/model``).

    Call it after the model, optimizer and scheduler are built (and, in a launched job, after
    ``accelerator.prepare``) and before anything draws random numbers, so that the resumed run
    continues exactly where the saved one stopped. A checkpoint of an FSDP / DeepSpeed run is
    restored with ``accelerator.load_state`` (collective: call on every rank, under the same
    launcher configuration that saved it).
    """
    from grpo_train.parallel.distributed import shards_training_state

    path = Path(path)
    file = path / STATE_FILE
    if not file.is_file():
        raise FileNotFoundError(
            f"{path} is not a checkpoint (no {STATE_FILE}); pass a step-NNNNNN folder"
        )
    sharded_ckpt = (path / ACCELERATE_DIR).is_dir()
    if sharded_ckpt != shards_training_state(accelerator):
        saved, now = ("a", "no") if sharded_ckpt else ("no", "a")
        raise ValueError(
            f"{path} was saved by {saved} sharded (FSDP / DeepSpeed) run and this is {now} "
            "sharded run: the optimizer state cannot be carried over. Resume under the launcher "
            "config that saved it, or start a new run from its weights "
            f"(--model {path / MODEL_DIR})"
        )
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
        if not isinstance(state, dict) or "scheduler" not in state:
            raise ValueError("not a trainer state")
    except Exception as err:  # EOFError, zip / unpickler errors: all mean a damaged file
        first = str(err).strip().splitlines()[0][:160] if str(err).strip() else ""
        raise CheckpointError(
            f"checkpoint {path} is damaged: {STATE_FILE} cannot be read "
            f"({type(err).__name__}{': ' + first if first else ''}). {offer_previous(path)}"
        ) from None
    scheduler.load_state_dict(state["scheduler"])
    set_rng_state(state["rng"])
    rank = accelerator.process_index if accelerator is not None and not sharded_ckpt else 0
    own = path / rank_rng_file(rank)
    if own.is_file():
        # A launched run's rank: its own states, saved beside rank 0's (a resume on fewer or
        # more processes keeps rank 0's for the ranks that have none).
        set_rng_state(torch.load(own, map_location="cpu", weights_only=True))
    if sharded_ckpt:
        # Model and optimizer shards, and each rank's own RNG states (after rank 0's above).
        accelerator.load_state(str(path / ACCELERATE_DIR))
    else:
        optimizer.load_state_dict(state["optimizer"])
    saved = state["sampler"]
    sampler = SamplerState(
        int(saved["draws"]),
        tuple(int(p) for p in saved["positions"]),
        dict(saved.get("curriculum") or {}),
        tuple(tuple(row) for row in saved.get("filter_memory") or ()),
        *_signal_state(saved.get("signal")),
    )
    return ResumeState(
        step=int(state["step"]),
        sampler=sampler,
        path=path,
        baselines=state.get("baselines"),
        switches=read_switches(path),
    )


def read_rollouts(path: str | Path) -> list[Any]:
    """Return the future batches an ``async_generation`` checkpoint saved (or an empty list).

    A pickle of the run's own ``collect.pipeline.Rollouts`` (groups, token ids, tensors), so it
    is read with ``weights_only=False``: resume only checkpoints you wrote.
    """
    file = Path(path) / ROLLOUTS_FILE
    if not file.is_file():
        return []
    try:
        return list(torch.load(file, map_location="cpu", weights_only=False))
    except Exception as err:
        raise CheckpointError(
            f"checkpoint {path} is damaged: {ROLLOUTS_FILE} cannot be read "
            f"({type(err).__name__}). {offer_previous(Path(path))}"
        ) from None


def read_switches(path: str | Path) -> tuple[tuple[int, str], ...] | None:
    """Return checkpoint ``path``'s recorded automatic switches; None when it has none recorded.

    Checkpoints written before switches were recorded have no ``switches.json``. A file that
    cannot be read raises ``CheckpointError`` naming it.
    """
    file = Path(path) / SWITCHES_FILE
    if not file.is_file():
        return None
    try:
        records = json.loads(file.read_text())
        return tuple((int(r["step"]), str(r["what"])) for r in records)
    except (OSError, ValueError, TypeError, KeyError) as err:
        raise CheckpointError(
            f"checkpoint {path} is damaged: {SWITCHES_FILE} cannot be read "
            f"({type(err).__name__}: {err}). {offer_previous(Path(path))}"
        ) from None
