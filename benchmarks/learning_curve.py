"""Learning curves: held-out accuracy against training wall time, ours against TRL's GRPOTrainer.

Both trainers get the same task, model (the converted default folder unless ``--model``), training
split, reward (the environment's, through ``grpo_envs.adapters.trl_reward_funcs`` for TRL), group
size, prompts per step and completion length. Each run is a subprocess (clean memory, a crash is a
row in the table, not the end of the benchmark) that saves the policy every ``--eval-every`` steps;
the parent then scores every saved policy with ONE evaluation function (greedy HF ``generate`` on
the first ``--eval-size`` held-out prompts, scored by the environment), so the two curves differ
only in training. Time is training-step wall time (generation + scoring + update + weight sync),
summed over steps; engine start-up and checkpoint writes are reported separately::

    python benchmarks/learning_curve.py                   # ours vs TRL, then our loss variants
    python benchmarks/learning_curve.py --runs ours trl   # just the head-to-head
    python benchmarks/learning_curve.py --quick           # smoke: 2 steps each, 8 eval prompts

Prints one side-by-side table (accuracy at each evaluated step, with the time it was reached) and
writes ``learning_curve.png`` and ``learning_curve.json`` into ``--out``. Runs one training process
at a time: the machine it was written for has 2 cores.

Why one module over 500 lines: one race, end to end (both trainers' child processes, the one
evaluation of every saved policy, the sweep, time-to-target and the table), kept in a single
script so that what both sides get can be checked in one place.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent

TARGET_GAIN = 0.28
"""Default time-to-target: the base model's held-out accuracy plus 28 points, the gain of the TRL
``GRPOTrainer`` reference run this benchmark was first compared with."""


@dataclass(frozen=True)
class Task:
    """The environment both trainers train and evaluate on."""

    env_id: str
    kwargs: dict[str, str | int | float]

    def make(self):
        """Build the environment."""
        import grpo_envs

        return grpo_envs.make(self.env_id, **self.kwargs)


@dataclass(frozen=True)
class RunSpec:
    """One training run: which trainer, its steps, and our config overrides for variants."""

    name: str
    trainer: str  # "ours" or "trl"
    steps: int
    learning_rate: float
    overrides: dict[str, Any] = field(default_factory=dict)
    seed: int | None = None
    """The run's seed (prompt order, sampling, initialisation of anything random); None: the
    shared ``--seed``."""

    def seed_or(self, default: int) -> int:
        """This run's seed, or ``default`` when it has none of its own."""
        return default if self.seed is None else self.seed

    def arm_name(self) -> str:
        """The trainer, with our overrides when it has some: one arm of the race each.

        >>> RunSpec("a", "ours", 2, 2e-5, {"engine": "hf"}).arm_name()
        'ours[engine=hf]'
        """
        if not self.overrides:
            return self.trainer
        return (
            self.trainer
            + "["
            + ",".join(f"{k}={v}" for k, v in sorted(self.overrides.items()))
            + "]"
        )


@dataclass(frozen=True)
class Shared:
    """Settings both trainers share."""

    model: str
    task: Task
    prompts: int
    group: int
    completion_length: int
    temperature: float
    eval_every: int
    seed: int
    threads: int = 0
    """CPU threads of every process (training, rollout engine, evaluation); 0: torch's choice."""

    def env(self) -> dict[str, str]:
        """Environment of a training subprocess: its thread count (and its vLLM engine's)."""
        if self.threads <= 0:
            return dict(os.environ)
        count = str(self.threads)
        # vLLM's CPU worker otherwise binds one OpenMP thread per core.
        return {
            **os.environ,
            "OMP_NUM_THREADS": count,
            "MKL_NUM_THREADS": count,
            "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        }


@dataclass
class Point:
    """One saved policy: its step, the training seconds to reach it, and (later) its accuracy."""

    step: int
    train_s: float
    path: str
    accuracy: float | None = None


@dataclass
class RunResult:
    """What one run produced."""

    spec: RunSpec
    points: list[Point] = field(default_factory=list)
    overhead_s: float = 0.0
    """Process wall time not spent in training steps: start-up, checkpoint writes, shutdown."""
    process_s: float = 0.0
    step_s: list[float] = field(default_factory=list)
    """Training seconds of each step, in order (the same clock as ``Point.train_s``)."""
    load: tuple[float, float] = (0.0, 0.0)
    """1-minute load average when the run started and when it ended."""
    error: str = ""
    train_accuracy: list[float] = field(default_factory=list)
    """Share of the step's sampled completions that were correct, per step (the training
    signal each step had)."""
    prompt_ids: list[list[str]] = field(default_factory=list)
    """TRL: the sample ids its reward function scored at each step, in order (checked against
    the prompt order the seed asks for: ``check_prompts``)."""
    mean_length: list[float] = field(default_factory=list)
    """Mean sampled completion length in tokens, per step (EOS included)."""
    truncated: list[float] = field(default_factory=list)
    """Share of the step's sampled completions cut at the length limit, per step."""


# --------------------------------------------------------------------------- evaluation


def evaluate(model_dir: str, task: Task, n: int, max_new_tokens: int, batch: int = 32) -> float:
    """Greedy held-out accuracy of the policy in ``model_dir``: the one evaluation for all runs.

    HF ``generate`` rather than either trainer's engine, so that neither trainer's rollout engine
    or precision is favoured; prompts go through the same chat template both trainers use.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo_envs.types import Sample
    from grpo_train.episodes.prompts import encode_prompt
    from grpo_train.rollout.hf import left_pad

    env = task.make()
    rows = env.dataset("test")
    samples = [Sample.from_row(rows[i]) for i in range(min(n, len(rows)))]
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    texts: list[str] = []
    for start in range(0, len(samples), batch):
        ids = [
            encode_prompt(tokenizer, s, max_tokens=512).ids for s in samples[start : start + batch]
        ]
        # Left padding: every row's generation starts right after its own prompt.
        inputs, attention = left_pad(ids, pad)
        width = inputs.shape[1]
        with torch.no_grad():
            out = model.generate(
                input_ids=inputs,
                attention_mask=attention,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=pad,
            )
        texts += [str(tokenizer.decode(row[width:], skip_special_tokens=True)) for row in out]
    scores = env.score_batch(texts, samples)
    return sum(s.correct for s in scores) / max(len(samples), 1)


# --------------------------------------------------------------------------- the two trainers


def ours_config(spec: RunSpec, shared: Shared, out: Path) -> dict[str, Any]:
    """The ``--config`` file of one of our runs: the matched settings, then the run's overrides."""
    return {
        "env": [{"id": shared.task.env_id, "kwargs": dict(shared.task.kwargs)}],
        "model": shared.model,
        "num_generations": shared.group,
        "prompts_per_step": shared.prompts,
        "max_completion_length": shared.completion_length,
        "temperature": shared.temperature,
        "learning_rate": spec.learning_rate,
        "max_steps": spec.steps,
        "save_every": shared.eval_every,
        "keep_last": spec.steps // shared.eval_every + 2,
        "eval_size": 0,  # evaluated afterwards by `evaluate`, like TRL's checkpoints
        "seed": spec.seed_or(shared.seed),
        "progress": False,
        "output_dir": str(out),
        **({"num_threads": shared.threads} if shared.threads > 0 else {}),
        **spec.overrides,
    }


def run_ours(spec: RunSpec, shared: Shared, out: Path) -> RunResult:
    """Train with ``grpo train`` (default preset + matched settings) and collect its checkpoints."""
    import yaml

    from grpo_train.run.checkpoint import MODEL_DIR, list_checkpoints
    from grpo_train.run.run_log import read_metrics

    config = ours_config(spec, shared, out)

    # Variant names such as "grpo/group" nest one folder deeper than the run folder itself.
    (out.parent / f"{spec.name}.yaml").parent.mkdir(parents=True, exist_ok=True)
    (out.parent / f"{spec.name}.yaml").write_text(yaml.safe_dump(config))
    t0 = time.perf_counter()
    cmd = [
        sys.executable,
        "-m",
        "grpo_train.cli",
        "train",
        "--config",
        str(out.parent / f"{spec.name}.yaml"),
    ]
    returncode, tail = run_child(cmd, shared.env(), out.parent / f"{spec.name}.log")
    result = RunResult(spec, process_s=time.perf_counter() - t0)
    if returncode != 0:
        result.error = f"exit {returncode}: {tail}"
    rows = (
        [r for r in read_metrics(out) if "time/step" in r]
        if (out / "metrics.jsonl").exists()
        else []
    )
    elapsed, cumulative = 0.0, {}
    for row in sorted(rows, key=lambda r: r["step"]):
        elapsed += float(row["time/step"])
        cumulative[int(row["step"])] = elapsed
        result.step_s.append(float(row["time/step"]))
        result.train_accuracy.append(float(row.get("accuracy", float("nan"))))
        result.mean_length.append(float(row.get("length/mean", float("nan"))))
        result.truncated.append(float(row.get("length/clipped_frac", float("nan"))))
    for ckpt in list_checkpoints(out):
        step = int(ckpt.name.split("-")[-1])
        result.points.append(Point(step, cumulative.get(step, float("nan")), str(ckpt / MODEL_DIR)))
    result.overhead_s = max(result.process_s - elapsed, 0.0)
    return result


def race_grpo_config(
    output_dir: Path,
    *,
    prompts: int,
    group: int,
    completion_length: int,
    temperature: float,
    learning_rate: float,
    steps: int,
    seed: int,
    **overrides: Any,
) -> Any:
    """TRL's ``GRPOConfig`` of the race: one generation batch (prompts x group) per optimizer
    step, HF generation on the CPU in float32, beta 0, a constant rate, prompts in the given
    order; TRL's defaults otherwise (``dapo`` loss, group std scaling, AdamW beta2 0.999).
    ``overrides``: other ``GRPOConfig`` fields (``replay_check.py``: ``adam_beta2``)."""
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=str(output_dir),
        per_device_train_batch_size=prompts * group,
        gradient_accumulation_steps=1,
        num_generations=group,
        max_completion_length=completion_length,
        temperature=temperature,
        learning_rate=learning_rate,
        lr_scheduler_type="constant",
        beta=0.0,
        max_steps=steps,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_vllm=False,
        use_cpu=True,
        bf16=False,
        seed=seed,
        shuffle_dataset=False,
        dataloader_num_workers=0,
        **overrides,
    )


def trl_child(spec: RunSpec, shared: Shared, out: Path) -> None:
    """Train with TRL's GRPOTrainer in this (child) process; write ``points.json`` into ``out``.

    Matches the TRL target run in ``benchmarks/results/history.md``: HF generation, fp32, full
    fine-tuning, beta 0, TRL's default loss (``dapo``) and std scaling (``group``); the policy is
    saved every ``eval_every`` steps outside the timed step.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOTrainer

    from grpo_envs.adapters import trl_reward_funcs

    if shared.threads > 0:
        torch.set_num_threads(shared.threads)
    env = shared.task.make()
    seed = spec.seed_or(shared.seed)
    rows = env.dataset("train")
    # The prompts ours draws with this seed, in its order: TRL reads them unshuffled, so a seed
    # gives both trainers the same prompts at every step and differs only in what they sample.
    train_rows = rows.select(prompt_order(len(rows), seed, spec.steps * shared.prompts))
    tokenizer = AutoTokenizer.from_pretrained(shared.model)
    model = AutoModelForCausalLM.from_pretrained(shared.model, dtype=torch.float32)
    reward = trl_reward_funcs(env)[0]
    scored: list[tuple[list[str], list[float]]] = []
    lengths: list[list[int]] = []
    stops = {tokenizer.eos_token_id, *_as_list(model.generation_config.eos_token_id)}

    def recorded(completions, **kwargs):
        """The environment's reward, recording which samples each step scored and how well,
        and the step's batch itself (``batches.jsonl``: ids, completion token ids, rewards)."""
        rewards = reward(completions, **kwargs)
        ids = [str(i) for i in kwargs.get("id") or ()]
        tokens = [list(map(int, c)) for c in kwargs.get("completion_ids") or ()]
        scored.append((ids, [float(r) for r in rewards]))
        lengths.append([len(c) if c and c[-1] in stops else -len(c) for c in tokens])
        with (out / "batches.jsonl").open("a") as f:
            f.write(json.dumps({"ids": ids, "completion_ids": tokens, "rewards": rewards}) + "\n")
        return rewards

    recorded.__name__ = reward.__name__
    cfg = race_grpo_config(
        out / "trl",
        prompts=shared.prompts,
        group=shared.group,
        completion_length=shared.completion_length,
        temperature=shared.temperature,
        learning_rate=spec.learning_rate,
        steps=spec.steps,
        seed=trl_sampling_seed(spec, shared),
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[recorded],
        args=cfg,
        train_dataset=train_rows,
        processing_class=tokenizer,
    )
    points: list[Point] = []
    clock = {"train_s": 0.0, "began": 0.0}
    step_s: list[float] = []

    class Checkpoints(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            clock["began"] = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            step_s.append(time.perf_counter() - clock["began"])
            clock["train_s"] += step_s[-1]
            if state.global_step % shared.eval_every == 0 or state.global_step == spec.steps:
                path = out / f"step-{state.global_step:06d}"
                trainer.model.save_pretrained(path)  # type: ignore[union-attr,operator]
                tokenizer.save_pretrained(path)
                points.append(Point(state.global_step, clock["train_s"], str(path)))

    trainer.add_callback(Checkpoints())
    trainer.train()
    payload = {
        "train_s": clock["train_s"],
        "step_s": step_s,
        "points": [asdict(p) for p in points],
        # One reward call per step (one generation batch per optimizer step); a sample's id
        # appears once per completion, so the distinct ids in order are the step's prompts.
        "prompt_ids": [list(dict.fromkeys(ids)) for ids, _ in scored],
        "train_accuracy": [sum(r >= 1.0 for r in rs) / max(len(rs), 1) for _, rs in scored],
        # Per step: a negative length marks a completion without EOS (cut at the limit).
        "mean_length": [sum(map(abs, ls)) / max(len(ls), 1) for ls in lengths],
        "truncated": [sum(x < 0 for x in ls) / max(len(ls), 1) for ls in lengths],
    }
    (out / "points.json").write_text(json.dumps(payload))


SAMPLING_SEEDS = ("race", "hashed")
"""How a TRL run seeds its sampling (``--trl-sampling-seed``): with the race seed itself, or
with a hash of it. TRL's seed moves nothing but the sampler here (the policy is loaded, the
prompts come in ``prompt_order``'s order unshuffled), so the hashed arm draws the same prompts
with a seed that is not a small integer: a check that the race's result is not a property of
TRL's draws at seeds 0, 1, 2, ..."""


def hashed_seed(seed: int) -> int:
    """A 32-bit seed derived from ``seed`` by SHA-256: stable across runs and machines, unlike
    Python's ``hash``, and far from the small integers races use.

    >>> hashed_seed(0), hashed_seed(1)
    (2871604570, 2568625472)
    """
    import hashlib

    return int.from_bytes(hashlib.sha256(f"trl-sampling-{seed}".encode()).digest()[:4], "big")


def trl_sampling_seed(spec: RunSpec, shared: Shared) -> int:
    """The seed a TRL run gives ``GRPOConfig``: the race seed, or its hash when the run's
    overrides say ``sampling_seed=hashed``.

    >>> shared = Shared("m", Task("e", {}), 4, 8, 64, 1.0, 2, seed=0)
    >>> trl_sampling_seed(RunSpec("trl", "trl", 6, 2e-5, seed=3), shared)
    3
    >>> run = RunSpec("trl", "trl", 6, 2e-5, {"sampling_seed": "hashed"}, seed=3)
    >>> trl_sampling_seed(run, shared) == hashed_seed(3)
    True
    """
    seed = spec.seed_or(shared.seed)
    how = spec.overrides.get("sampling_seed", "race")
    if how not in SAMPLING_SEEDS:
        raise ValueError(f"sampling_seed={how!r}: one of {', '.join(SAMPLING_SEEDS)}")
    return hashed_seed(seed) if how == "hashed" else seed


def _as_list(value: Any) -> list[Any]:
    """A generation config's ``eos_token_id``: None, one id or a list of ids, as a list."""
    return [] if value is None else list(value) if isinstance(value, (list, tuple)) else [value]


def prompt_order(size: int, seed: int, draws: int) -> list[int]:
    """The training rows ``grpo train`` draws first with ``seed`` from one environment of ``size``
    rows, in order (its ``PromptSampler``, without the online filter or a curriculum)."""
    from grpo_train.collect.training_prompts import PromptSampler

    sampler = PromptSampler([size], [1.0], seed)
    return [sampler.next_row()[1] for _ in range(draws)]


def run_child(cmd: list[str], env: dict[str, str], log: Path) -> tuple[int, str]:
    """Run one training process in a session of its own, its output into ``log``.

    Returns its exit code and the last 300 characters of its output. Whatever the process
    left behind (a vLLM engine core orphaned when the trainer was OOM-killed) is killed with
    its session: with a pipe instead of a file, such an orphan held the pipe open and the
    benchmark waited for it forever.
    """
    with log.open("w") as sink:
        proc = subprocess.Popen(
            cmd, stdout=sink, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        try:
            returncode = proc.wait()
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
    return returncode, log.read_text(errors="replace")[-300:]


def run_trl(spec: RunSpec, shared: Shared, out: Path) -> RunResult:
    """Run ``trl_child`` in a subprocess and read its points back."""
    out.mkdir(parents=True, exist_ok=True)
    payload = json.dumps({"spec": asdict(spec), "shared": asdict(shared)})
    t0 = time.perf_counter()
    cmd = [sys.executable, str(HERE), "--child", payload, "--out", str(out)]
    returncode, tail = run_child(cmd, shared.env(), out.parent / f"{spec.name}.log")
    result = RunResult(spec, process_s=time.perf_counter() - t0)
    if returncode != 0:
        result.error = f"exit {returncode}: {tail}"
    if (out / "points.json").exists():
        data = json.loads((out / "points.json").read_text())
        result.overhead_s = max(result.process_s - data["train_s"], 0.0)
        result.points = [Point(**p) for p in data["points"]]
        result.step_s = [float(x) for x in data.get("step_s", [])]
        result.prompt_ids = data.get("prompt_ids", [])
        result.train_accuracy = data.get("train_accuracy", [])
        result.mean_length = data.get("mean_length", [])
        result.truncated = data.get("truncated", [])
        problem = check_prompts(result.prompt_ids, expected_prompt_ids(spec, shared))
        if problem:
            result.error = (result.error + "; " if result.error else "") + problem
    return result


def expected_prompt_ids(spec: RunSpec, shared: Shared) -> list[list[str]]:
    """The sample ids ``grpo train`` draws at each step with this run's seed (no filter)."""
    from grpo_envs.types import Sample

    rows = shared.task.make().dataset("train")
    order = prompt_order(len(rows), spec.seed_or(shared.seed), spec.steps * shared.prompts)
    ids = [Sample.from_row(rows[i]).id for i in order]
    return [ids[k : k + shared.prompts] for k in range(0, len(ids), shared.prompts)]


def check_prompts(seen: Sequence[Sequence[str]], expected: Sequence[Sequence[str]]) -> str:
    """Empty if each step scored exactly the expected prompts, in order; else what differs.

    >>> check_prompts([["a", "b"], ["c", "d"]], [["a", "b"], ["c", "d"]])
    ''
    >>> check_prompts([["a", "b"], ["a", "b"]], [["a", "b"], ["c", "d"]])
    "step 2 scored ['a', 'b'], expected ['c', 'd']"
    >>> check_prompts([["a", "b"]], [["a", "b"], ["c", "d"]])
    'scored 1 steps, expected 2'
    """
    for step, (got, want) in enumerate(zip(seen, expected), start=1):
        if list(got) != list(want):
            return f"step {step} scored {list(got)}, expected {list(want)}"
    if len(seen) != len(expected):
        return f"scored {len(seen)} steps, expected {len(expected)}"
    return ""


# --------------------------------------------------------------------------- report


def table(results: Sequence[RunResult], base_accuracy: float) -> str:
    """Side-by-side table: one column per run, one row per evaluated step: ``acc% @ seconds``."""
    steps = sorted({p.step for r in results for p in r.points} | {0})
    width = max(16, *(len(r.spec.name) + 2 for r in results))
    lines = ["step".ljust(6) + "".join(r.spec.name.rjust(width) for r in results)]
    for step in steps:
        cells = []
        for r in results:
            if step == 0:
                cells.append(f"{base_accuracy:.1%} @ 0s")
                continue
            match = [p for p in r.points if p.step == step]
            p = match[0] if match else None
            acc = "-" if p is None or p.accuracy is None else f"{p.accuracy:.1%}"
            cells.append("" if p is None else f"{acc} @ {p.train_s:.0f}s")
        lines.append(str(step).ljust(6) + "".join(c.rjust(width) for c in cells))
    lines.append("other".ljust(6) + "".join(f"{r.overhead_s:.0f}s".rjust(width) for r in results))
    lines.append("total".ljust(6) + "".join(f"{r.process_s:.0f}s".rjust(width) for r in results))
    errors = [f"{r.spec.name}: {r.error}" for r in results if r.error]
    return "\n".join(lines + errors)


def plot(results: Sequence[RunResult], base_accuracy: float, path: Path) -> Path | None:
    """Accuracy against training seconds, one line per run; None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in results:
        xs = [0.0] + [p.train_s for p in r.points if p.accuracy is not None]
        ys = [base_accuracy] + [p.accuracy for p in r.points if p.accuracy is not None]
        ax.plot(xs, [100 * y for y in ys], marker="o", label=r.spec.name)  # type: ignore[operator]
    ax.set_xlabel("training wall time (s): generate + score + update + sync")
    ax.set_ylabel("held-out greedy accuracy (%)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------- the race


@dataclass(frozen=True)
class Race:
    """One run's time-to-target: the first evaluated step whose accuracy reaches the target."""

    name: str
    trainer: str
    learning_rate: float
    best_accuracy: float | None
    step: int | None
    """First evaluated step at or above the target; None if the run never got there."""
    seconds: float | None
    """Training seconds to that step (the sum of its steps' times)."""
    mean_step_s: float | None
    """Mean seconds per step over the steps up to the target: seconds = step * mean_step_s."""
    median_step_s: float | None
    """Median seconds per step over the whole run (robust to a stall on a shared machine)."""


def race_of(result: RunResult, target: float) -> Race:
    """Time-to-target of one run (``target`` is an accuracy in [0, 1]).

    >>> r = RunResult(RunSpec("ours@2e-05", "ours", 4, 2e-5), step_s=[10.0, 20.0, 30.0, 40.0])
    >>> r.points = [Point(2, 30.0, "", 0.25), Point(4, 100.0, "", 0.5)]
    >>> race = race_of(r, 0.4)
    >>> race.step, race.seconds, race.mean_step_s, race.median_step_s, race.best_accuracy
    (4, 100.0, 25.0, 25.0, 0.5)
    >>> race_of(r, 0.6).step is None
    True
    """
    import statistics

    scored = [p for p in sorted(result.points, key=lambda p: p.step) if p.accuracy is not None]
    hit = next((p for p in scored if p.accuracy is not None and p.accuracy >= target), None)
    mean = hit.train_s / hit.step if hit is not None and hit.step > 0 else None
    return Race(
        name=result.spec.name,
        trainer=result.spec.trainer,
        learning_rate=result.spec.learning_rate,
        best_accuracy=max((p.accuracy for p in scored if p.accuracy is not None), default=None),
        step=None if hit is None else hit.step,
        seconds=None if hit is None else hit.train_s,
        mean_step_s=mean,
        median_step_s=statistics.median(result.step_s) if result.step_s else None,
    )


def decompose(ours: Race, trl: Race) -> str:
    """Ours' time-to-target over TRL's, split exactly into steps x seconds-per-step.

    time = steps * mean s/step, so time ratio = step ratio * s/step ratio:

    >>> a = Race("ours", "ours", 2e-5, 0.5, 4, 40.0, 10.0, 10.0)
    >>> b = Race("trl", "trl", 2e-5, 0.5, 8, 200.0, 25.0, 24.0)
    >>> print(*decompose(a, b).split("; "), sep="\\n")
    time 0.20x TRL = steps 0.50x (4 vs 8) * s/step 0.40x (10.0 vs 25.0 s)
    ours 2.4x faster per step (median 10.0 vs 24.0 s)
    >>> decompose(a, Race("trl", "trl", 2e-5, 0.3, None, None, None, 24.0))
    'TRL did not reach the target; ours 2.4x faster per step (median 10.0 vs 24.0 s)'
    """
    per_step = ""
    if ours.median_step_s and trl.median_step_s:
        per_step = (
            f"ours {trl.median_step_s / ours.median_step_s:.1f}x faster per step (median "
            f"{ours.median_step_s:.1f} vs {trl.median_step_s:.1f} s)"
        )
    if ours.seconds is None or trl.seconds is None or not ours.mean_step_s or not trl.mean_step_s:
        missing = " and ".join(n for n, r in (("ours", ours), ("TRL", trl)) if r.seconds is None)
        return f"{missing or 'one run'} did not reach the target" + (
            f"; {per_step}" if per_step else ""
        )
    assert ours.step is not None and trl.step is not None
    return (
        f"time {ours.seconds / trl.seconds:.2f}x TRL = steps {ours.step / trl.step:.2f}x "
        f"({ours.step} vs {trl.step}) * s/step {ours.mean_step_s / trl.mean_step_s:.2f}x "
        f"({ours.mean_step_s:.1f} vs {trl.mean_step_s:.1f} s)"
        + (f"; {per_step}" if per_step else "")
    )


def fastest(races: Sequence[Race]) -> Race | None:
    """The run that reached the target in the least training time (None if none did).

    >>> fastest([Race("a", "ours", 1e-5, .5, 4, 80.0, 20.0, 20.0),
    ...          Race("b", "ours", 2e-5, .6, 2, 50.0, 25.0, 25.0),
    ...          Race("c", "ours", 5e-6, .2, None, None, None, 22.0)]).name
    'b'
    """
    done = [r for r in races if r.seconds is not None]
    return min(done, key=lambda r: (r.seconds, -(r.best_accuracy or 0.0))) if done else None


def race_report(results: Sequence[RunResult], target: float) -> str:
    """Time-to-target for every run, then ours against TRL at each shared learning rate and at
    each trainer's best learning rate of the sweep.

    Tested in ``tests/benchmarks/test_learning_curve.py``.
    """
    races = [race_of(r, target) for r in results]
    lines = [
        f"target: held-out accuracy >= {target:.1%}",
        "| run | lr | best acc. | step to target | time to target | median s/step |",
        "|---|---|---|---|---|---|",
    ]
    for race, result in zip(races, results):
        best = "-" if race.best_accuracy is None else f"{race.best_accuracy:.1%}"
        step = str(race.step) if race.step is not None else f"not reached in {result.spec.steps}"
        secs = "-" if race.seconds is None else f"{race.seconds:.0f} s"
        med = "-" if race.median_step_s is None else f"{race.median_step_s:.1f}"
        lines.append(f"| {race.name} | {race.learning_rate:g} | {best} | {step} | {secs} | {med} |")
    ours = [r for r in races if r.trainer == "ours"]
    trl = [r for r in races if r.trainer == "trl"]
    for o in ours:
        for t in trl:
            if o.learning_rate == t.learning_rate:
                lines.append(f"same lr {o.learning_rate:g}: {decompose(o, t)}")
    best_o, best_t = fastest(ours), fastest(trl)
    if best_o is not None and best_t is not None:
        lines.append(
            f"best of sweep (ours {best_o.learning_rate:g}, TRL {best_t.learning_rate:g}): "
            f"{decompose(best_o, best_t)}"
        )
    elif ours and trl:
        who = " and ".join(n for n, b in (("ours", best_o), ("TRL", best_t)) if b is None)
        lines.append(f"best of sweep: {who} reached the target at no learning rate")
    return "\n".join(lines)


# --------------------------------------------------------------------------- across seeds


@dataclass(frozen=True)
class MeanSE:
    """A mean over seeds and its standard error (None with fewer than two values)."""

    mean: float
    se: float | None
    n: int

    def percent(self) -> str:
        """``mean ± se`` in percentage points (the mean alone when there is no standard error)."""
        se = "" if self.se is None else f" ± {100 * self.se:.1f}"
        return f"{100 * self.mean:.1f}{se}"


def mean_se(values: Sequence[float]) -> MeanSE:
    """Mean and standard error of the mean: the sample standard deviation (n - 1) over sqrt(n).

    >>> m = mean_se([0.266, 0.078, 0.375, 0.312, 0.109])  # five seeds' accuracies
    >>> round(m.mean, 4), round(m.se, 4), m.n
    (0.228, 0.0578, 5)
    >>> mean_se([0.5])
    MeanSE(mean=0.5, se=None, n=1)
    """
    import statistics

    if not values:
        raise ValueError("mean_se of no values")
    n = len(values)
    mean = statistics.fmean(values)
    se = statistics.stdev(values) / n**0.5 if n > 1 else None
    return MeanSE(mean, se, n)


Arm = tuple[str, float]
"""A trainer (with its overrides, ``RunSpec.arm_name``) at a learning rate: what the seeds are
repeats of."""


def by_arm(results: Sequence[RunResult]) -> dict[Arm, list[RunResult]]:
    """The runs of each (trainer, learning rate), in the order they ran."""
    arms: dict[Arm, list[RunResult]] = {}
    for r in results:
        arms.setdefault((r.spec.arm_name(), r.spec.learning_rate), []).append(r)
    return arms


def accuracy_at(result: RunResult, step: int) -> float | None:
    """Held-out accuracy of ``result``'s policy saved at ``step`` (None: not evaluated)."""
    return next((p.accuracy for p in result.points if p.step == step), None)


def seed_table(results: Sequence[RunResult], base: float) -> str:
    """Mean held-out accuracy ± its standard error across seeds, per step, one column per arm.

    >>> a = RunResult(RunSpec("ours#s0", "ours", 2, 2e-5, seed=0))
    >>> a.points = [Point(2, 10.0, "", 0.2)]
    >>> b = RunResult(RunSpec("ours#s1", "ours", 2, 2e-5, seed=1))
    >>> b.points = [Point(2, 12.0, "", 0.4)]
    >>> print(seed_table([a, b], 0.1))
    step          ours@2e-05
    0            10.0 (base)
    2        30.0 ± 10.0 (2)
    """
    arms = by_arm(results)
    steps = sorted({p.step for r in results for p in r.points if p.accuracy is not None})
    width = max(18, *(len(f"{t}@{lr:g}") + 2 for t, lr in arms))
    lines = ["step".ljust(6) + "".join(f"{t}@{lr:g}".rjust(width) for t, lr in arms)]
    lines.append("0".ljust(6) + "".join(f"{100 * base:.1f} (base)".rjust(width) for _ in arms))
    for step in steps:
        cells = []
        for runs in arms.values():
            accs = [a for a in (accuracy_at(r, step) for r in runs) if a is not None]
            cells.append(f"{mean_se(accs).percent()} ({len(accs)})" if accs else "-")
        lines.append(str(step).ljust(6) + "".join(c.rjust(width) for c in cells))
    return "\n".join(lines)


def signal_table(results: Sequence[RunResult], field_name: str = "train_accuracy") -> str:
    """A per-step quantity of the sampled batches, per arm: the mean over seeds at each step.

    ``train_accuracy`` (default, in percent): the right answers each arm drew, the signal its
    updates learned from, plus how many seeds drew none at all in their first two steps
    (nothing to learn from before the step-2 evaluation). ``truncated`` (percent) and
    ``mean_length`` (tokens): what else the batches held.

    >>> a = RunResult(RunSpec("ours#s0", "ours", 2, 2e-5, seed=0), train_accuracy=[0.0, 0.0])
    >>> b = RunResult(RunSpec("ours#s1", "ours", 2, 2e-5, seed=1), train_accuracy=[0.5, 0.0])
    >>> print(signal_table([a, b]))
    step                  ours@2e-05
    1                           25.0
    2                            0.0
    none in steps 1-2         1 of 2
    >>> a.mean_length, b.mean_length = [40.0, 30.0], [50.0]
    >>> print(signal_table([a, b], "mean_length"))
    step                  ours@2e-05
    1                           45.0
    2                           30.0
    """
    arms = by_arm(results)
    scale = 1.0 if field_name == "mean_length" else 100.0
    series = {id(r): list(getattr(r, field_name)) for r in results}
    steps = max((len(v) for v in series.values()), default=0)
    width = max(14, *(len(f"{t}@{lr:g}") + 2 for t, lr in arms))
    rows = [("step", [f"{t}@{lr:g}" for t, lr in arms])]
    for step in range(steps):
        cells = []
        for runs in arms.values():
            values = [series[id(r)][step] for r in runs if len(series[id(r)]) > step]
            values = [x for x in values if x == x]  # NaN: a step without a scored row
            cells.append(f"{scale * sum(values) / len(values):.1f}" if values else "-")
        rows.append((str(step + 1), cells))
    if field_name == "train_accuracy":
        dry = []
        for runs in arms.values():
            none = sum(1 for r in runs if r.train_accuracy[:2] and max(r.train_accuracy[:2]) == 0)
            dry.append(f"{none} of {len(runs)}")
        rows.append(("none in steps 1-2", dry))
    return "\n".join(
        label.ljust(18) + "".join(c.rjust(width) for c in cells) for label, cells in rows
    )


def arm_pairs(
    arms: dict[Arm, list[RunResult]],
) -> list[tuple[Arm, list[RunResult], Arm, list[RunResult]]]:
    """Every arm of ours with every TRL arm (``trl``, ``trl[sampling_seed=hashed]``) at the same
    learning rate: the pairs a race compares.

    >>> runs = [RunSpec("a", "ours", 2, 1e-5), RunSpec("b", "trl", 2, 1e-5), RunSpec("c", "trl",
    ...         2, 1e-5, {"sampling_seed": "hashed"}), RunSpec("d", "trl", 2, 3e-5)]
    >>> arms = by_arm([RunResult(s) for s in runs])
    >>> [(o[0], t[0]) for o, _, t, _ in arm_pairs(arms)]
    [('ours', 'trl'), ('ours', 'trl[sampling_seed=hashed]')]
    """
    return [
        (o, ours, t, trl)
        for o, ours in arms.items()
        if o[0].startswith("ours")
        for t, trl in arms.items()
        if t[0].startswith("trl") and t[1] == o[1]
    ]


def trl_label(arm_name: str) -> str:
    """How the report names a TRL arm: TRL, with its overrides when it has some.

    >>> trl_label("trl"), trl_label("trl[sampling_seed=hashed]")
    ('TRL', 'TRL[sampling_seed=hashed]')
    """
    return "TRL" + arm_name[len("trl") :]


def paired_differences(results: Sequence[RunResult]) -> list[str]:
    """Ours minus TRL at each learning rate and step, paired by seed (same prompts per seed).

    A difference within two standard errors of zero is reported as within noise; the sign-flip
    test's p-value (``sign_flip_p``) is printed beside it, since with outcomes as skewed as a
    sparse signal gives (a seed either learns early or not) a 2-standard-error rule on a few
    seeds leans on a normality that is not there.

    >>> def run(trainer, seed, acc):
    ...     r = RunResult(RunSpec(f"{trainer}#s{seed}", trainer, 2, 2e-5, seed=seed))
    ...     r.points = [Point(2, 1.0, "", acc)]
    ...     return r
    >>> rs = [run("ours", 0, 0.3), run("trl", 0, 0.1), run("ours", 1, 0.2), run("trl", 1, 0.3)]
    >>> print(*paired_differences(rs))
    lr 2e-05, step 2: ours - TRL = 5.0 ± 15.0 points over 2 seeds: within noise (sign-flip p 1.00)
    """
    arms = by_arm(results)
    lines = []
    for (name, lr), ours, (trl_name, _), trl in arm_pairs(arms):
        trl_by_seed = {r.spec.seed: r for r in trl}
        steps = sorted({p.step for r in ours + trl for p in r.points})
        for step in steps:
            diffs = []
            for o in ours:
                t = trl_by_seed.get(o.spec.seed)
                a, b = accuracy_at(o, step), None if t is None else accuracy_at(t, step)
                if a is not None and b is not None:
                    diffs.append(a - b)
            if not diffs:
                continue
            d = mean_se(diffs)
            noise = d.se is None or abs(d.mean) < 2 * d.se
            ahead = "ours ahead" if d.mean > 0 else f"{trl_label(trl_name)} ahead"
            verdict = "within noise" if noise else ahead
            lines.append(
                f"lr {lr:g}, step {step}: {name} - {trl_label(trl_name)} = {d.percent()} points "
                f"over {d.n} seeds: {verdict} (sign-flip p {sign_flip_p(diffs):.2f})"
            )
    return lines


def sign_flip_p(diffs: Sequence[float], draws: int = 200_000) -> float:
    """Two-sided p-value of the paired sign-flip (permutation) test of a zero mean difference.

    Under the null hypothesis that the two trainers learn alike, each seed's difference is as
    likely to have either sign, so the observed mean is compared with the means of every sign
    pattern (all 2^n of them up to n = 16, else ``draws`` random ones, seeded): the share whose
    absolute mean reaches the observed one. Needs no normality (Fisher, "The Design of
    Experiments", 1935, the permutation test of Darwin's paired plants).

    >>> sign_flip_p([0.1, 0.2, 0.3])  # only all + and all - reach |mean| 0.2: 2 of 8
    0.25
    >>> sign_flip_p([0.1, -0.1])
    1.0
    """
    import numpy as np

    d = np.asarray(diffs, dtype=np.float64)
    n = len(d)
    if n == 0:
        raise ValueError("sign_flip_p of no differences")
    if n <= 16:
        patterns = (np.arange(2**n)[:, None] >> np.arange(n)) & 1
    else:
        patterns = np.random.default_rng(0).integers(0, 2, size=(draws, n))
    means = np.abs(((1 - 2 * patterns) * d).mean(axis=1))
    observed = abs(d.mean())
    return float(np.mean(means >= observed - 1e-12))


@dataclass(frozen=True)
class SeededRace:
    """Time-to-target of one arm over its seeds; a seed that never got there is censored."""

    arm: Arm
    seeds: int
    reached: list[Race]
    censored: list[tuple[int | None, int, float]]
    """(seed, steps run, training seconds run) of each seed that never reached the target: its
    time-to-target is more than those seconds."""
    median_step_s: MeanSE | None
    """Each seed's median seconds per step, averaged over seeds."""

    def times(self) -> list[float | None]:
        """Every seed's time-to-target; None for a censored seed."""
        return [r.seconds for r in self.reached] + [None for _ in self.censored]

    def line(self) -> str:
        """One line: how many seeds got there, and in how long."""
        trainer, lr = self.arm
        text = f"{trainer}@{lr:g}: target reached by {len(self.reached)}/{self.seeds} seeds"
        if self.reached:
            secs = mean_se([r.seconds or 0.0 for r in self.reached])
            steps = mean_se([float(r.step or 0) for r in self.reached])
            spread = [r.seconds or 0.0 for r in self.reached]
            se = "" if secs.se is None else f" ± {secs.se:.0f}"
            step_se = "" if steps.se is None else f" ± {steps.se:.1f}"
            text += (
                f"; time {secs.mean:.0f}{se} s (min {min(spread):.0f}, max {max(spread):.0f}), "
                f"steps {steps.mean:.1f}{step_se}"
            )
        if self.censored:
            cells = ", ".join(
                f"s{seed} > {secs:.0f} s ({n} steps)" for seed, n, secs in self.censored
            )
            text += f"; censored: {cells}"
        if self.median_step_s is not None:
            text += f"; s/step {self.median_step_s.mean:.1f}"
        return text


def censored_median(times: Sequence[float | None]) -> float | None:
    """Median time-to-target over seeds, a censored seed (None) counted as slower than any.

    Defined only when the middle of the sorted times is reached, i.e. more than half the seeds
    got there; otherwise None (the median lies beyond what was run).

    >>> censored_median([30.0, None, 10.0, 20.0, None])
    30.0
    >>> censored_median([30.0, None, 10.0, None]) is None
    True
    >>> censored_median([40.0, 10.0, 20.0, None])
    30.0
    """
    ordered = sorted(times, key=lambda t: float("inf") if t is None else t)
    n = len(ordered)
    middle = ordered[(n - 1) // 2 : n // 2 + 1]
    if not middle or any(t is None for t in middle):
        return None
    return sum(t for t in middle if t is not None) / len(middle)


def seeded_races(results: Sequence[RunResult], target: float) -> list[SeededRace]:
    """Time-to-target of every arm over its seeds.

    >>> r0 = RunResult(RunSpec("ours#s0", "ours", 2, 2e-5, seed=0), step_s=[10.0, 10.0])
    >>> r0.points = [Point(2, 20.0, "", 0.5)]
    >>> r1 = RunResult(RunSpec("ours#s1", "ours", 2, 2e-5, seed=1), step_s=[12.0, 14.0])
    >>> r1.points = [Point(2, 26.0, "", 0.1)]
    >>> print(seeded_races([r0, r1], 0.4)[0].line())
    ours@2e-05: target reached by 1/2 seeds; time 20 s (min 20, max 20), steps 2.0; censored: s1 > 26 s (2 steps); s/step 11.5
    """  # noqa: E501
    out = []
    for arm, runs in by_arm(results).items():
        races = [race_of(r, target) for r in runs]
        reached = [race for race in races if race.seconds is not None]
        censored = [
            (r.spec.seed, len(r.step_s), sum(r.step_s))
            for r, race in zip(runs, races)
            if race.seconds is None
        ]
        medians = [race.median_step_s for race in races if race.median_step_s is not None]
        out.append(
            SeededRace(arm, len(runs), reached, censored, mean_se(medians) if medians else None)
        )
    return out


def seed_report(results: Sequence[RunResult], base: float, target: float) -> str:
    """The across-seeds report: accuracy per step, paired differences, time-to-target."""
    races = seeded_races(results, target)
    lines = [
        "held-out accuracy, mean ± standard error across seeds (seeds evaluated):",
        seed_table(results, base),
        "",
        "sampled training accuracy, % (the right answers each arm learned from):",
        signal_table(results),
        "",
        "sampled completions cut at the length limit, %:",
        signal_table(results, "truncated"),
        "",
        "sampled completion length, mean tokens:",
        signal_table(results, "mean_length"),
        "",
        "ours - TRL, paired by seed:",
        *paired_differences(results),
        "",
        f"time-to-target (held-out accuracy >= {target:.1%}), training seconds:",
        *(race.line() for race in races),
    ]
    race_of_arm = {race.arm: race for race in races}
    for ours_arm, _, trl_arm, _ in arm_pairs(by_arm(results)):
        o, t = race_of_arm[ours_arm], race_of_arm[trl_arm]
        label = trl_label(t.arm[0])
        if o.median_step_s and t.median_step_s:
            lines.append(
                f"lr {o.arm[1]:g}: {o.arm[0]} {t.median_step_s.mean / o.median_step_s.mean:.1f}x "
                f"faster per step than {label} (mean over seeds of each seed's median s/step)"
            )
        if o.reached and t.reached and not o.censored and not t.censored:
            ratio = (
                mean_se([r.seconds or 0.0 for r in o.reached]).mean
                / mean_se([r.seconds or 0.0 for r in t.reached]).mean
            )
            lines.append(
                f"lr {o.arm[1]:g}: mean time-to-target, {o.arm[0]} / {label} = {ratio:.2f}"
            )
        elif o.reached or t.reached:
            lines.append(
                f"lr {o.arm[1]:g}: some seeds never reached the target, so no ratio of means "
                "(means over the reached seeds alone would be biased)"
            )
        medians = [censored_median(race.times()) for race in (o, t)]
        if medians[0] is not None and medians[1] is not None:
            lines.append(
                f"lr {o.arm[1]:g}: median time-to-target (censored seeds counted as slowest), "
                f"{o.arm[0]} {medians[0]:.0f} s / {label} {medians[1]:.0f} s = "
                f"{medians[0] / medians[1]:.2f}"
            )
        else:
            who = " and ".join(n for n, m in zip((o.arm[0], label), medians) if m is None)
            lines.append(
                f"lr {o.arm[1]:g}: median time-to-target not defined for {who} (half the "
                "seeds or more never reached the target)"
            )
    return "\n".join(lines)


# --------------------------------------------------------------------------- driver


def default_learning_rate() -> float:
    """Our run's learning rate: the one the default ``grpo train`` uses."""
    from grpo_train.config import preset_config

    return preset_config().optim.learning_rate


def build_runs(args: argparse.Namespace) -> list[RunSpec]:
    """The runs asked for: ours, trl, and our loss/std-scaling variants."""
    ours_lr = args.lr if args.lr is not None else default_learning_rate()
    runs: list[RunSpec] = []
    import yaml

    ablation = {
        key: yaml.safe_load(value)  # a YAML value, as in a config file: 0.999, off, hf
        for key, value in (item.split("=", 1) for item in args.ours_overrides)
    }
    trl_overrides: dict[str, Any] = (
        {} if args.trl_sampling_seed == "race" else {"sampling_seed": args.trl_sampling_seed}
    )
    if args.seeds:
        # Seeds x learning rates, both trainers at each, interleaved and alternating which goes
        # first, so that load drifting on a shared machine falls on both alike.
        lrs = args.lrs or [ours_lr]
        for i, (seed, lr) in enumerate((s, lr) for s in args.seeds for lr in lrs):
            pair = [
                RunSpec(
                    f"{name}@{lr:g}#s{seed}",
                    name,
                    steps,
                    lr,
                    ablation if name == "ours" else trl_overrides,
                    seed=seed,
                )
                for name, steps in (("ours", args.steps), ("trl", args.trl_steps))
                if name in args.runs
            ]
            runs += pair if i % 2 == 0 else pair[::-1]
        return runs
    if args.lrs:
        # The sweep: both trainers at every learning rate, interleaved and alternating which
        # goes first, so that load drifting on a shared machine hits both alike.
        for i, lr in enumerate(args.lrs):
            pair = [
                RunSpec(f"{name}@{lr:g}", name, steps, lr)
                for name, steps in (("ours", args.steps), ("trl", args.trl_steps))
                if name in args.runs
            ]
            runs += pair if i % 2 == 0 else pair[::-1]
    else:
        if "ours" in args.runs:
            runs.append(RunSpec("ours", "ours", args.steps, ours_lr))
        if "trl" in args.runs:
            runs.append(RunSpec("trl", "trl", args.trl_steps, args.trl_lr))
    if "variants" in args.runs:
        # Loss aggregation x reward std scaling (Dr. GRPO, arXiv:2503.20783, drops both the
        # per-sequence length normalisation and the std division).
        for loss, scale in (
            ("grpo", "group"),
            ("dr_grpo", "none"),
            ("dapo", "group"),
            ("dapo", "none"),
        ):
            runs.append(
                RunSpec(
                    f"{loss}/{scale}",
                    "ours",
                    args.variant_steps,
                    ours_lr,
                    {"loss_type": loss, "scale_rewards": scale},
                )
            )
    return runs


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line options (see the module doc)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="default", help="HF folder; default: the converted SmolLM2")
    p.add_argument("--env", default="math/arithmetic-v0")
    p.add_argument(
        "--env-kwargs",
        default='{"task": "add2", "answer": "loose"}',
        help="JSON kwargs for grpo_envs.make (the same reward for both trainers)",
    )
    p.add_argument("--runs", nargs="+", default=["ours", "trl", "variants"])
    p.add_argument(
        "--ours-overrides",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="our config fields for every run of ours (an ablation: its own arm, paired with "
        "TRL's runs of the same seeds, e.g. from another saved race given to --report)",
    )
    p.add_argument(
        "--trl-sampling-seed",
        choices=SAMPLING_SEEDS,
        default="race",
        help="what seeds TRL's sampling: the race seed (default) or a hash of it, an arm of its "
        "own (trl[sampling_seed=hashed]) with the same prompts per seed",
    )
    p.add_argument("--steps", type=int, default=20, help="our training steps")
    p.add_argument("--trl-steps", type=int, default=20)
    p.add_argument("--variant-steps", type=int, default=10)
    p.add_argument("--eval-every", type=int, default=5)
    p.add_argument("--eval-size", type=int, default=64)
    p.add_argument("--prompts", type=int, default=4, help="prompts per step")
    p.add_argument("--group", type=int, default=8, help="completions per prompt")
    p.add_argument("--completion-length", type=int, default=64)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--lr", type=float, default=None, help="ours; default: DEFAULT_PRESET's")
    p.add_argument(
        "--trl-lr",
        type=float,
        default=5e-6,
        help="TRL's learning rate; 5e-6 is the TRL target run's (benchmarks/results/history.md)",
    )
    p.add_argument(
        "--lrs",
        type=float,
        nargs="+",
        default=None,
        help="learning-rate sweep: ours and TRL at every one (replaces --lr/--trl-lr)",
    )
    p.add_argument(
        "--target-gain",
        type=float,
        default=None,
        help=f"time-to-target: held-out accuracy >= base + this (default {TARGET_GAIN}: the "
        "TRL reference's gain)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        default=None,
        help="seeds: ours and TRL at every seed (and every --lrs rate), each seed giving both "
        "the same prompt order; reports means with standard errors across seeds",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=0,
        help="CPU threads of every process, both trainers and the evaluation alike (0: torch's "
        "choice). 1 on a small machine shared with other jobs: spinning OpenMP threads that wait "
        "for a busy core make every kernel several times slower",
    )
    p.add_argument("--out", default="", help="output folder (default: a temp folder)")
    p.add_argument("--keep", action="store_true", help="keep the saved policies")
    p.add_argument("--quick", action="store_true", help="smoke: 2 steps, 8 eval prompts")
    p.add_argument(
        "--report",
        nargs="+",
        default=[],
        metavar="JSON",
        help="print the tables of saved learning_curve.json files (also a stopped run's; several "
        "make one race) and exit",
    )
    p.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.steps = args.trl_steps = 2
        args.variant_steps, args.eval_every, args.eval_size = 1, 1, 8
        args.completion_length = min(args.completion_length, 24)
        args.prompts, args.group = 2, 4
    if args.eval_every < 1:
        p.error("--eval-every must be >= 1")
    if args.threads < 0:
        p.error(f"--threads: {args.threads}; must be >= 0 (0: torch's choice)")
    if args.lrs and any(lr <= 0 for lr in args.lrs):
        p.error(f"--lrs: {args.lrs}; every learning rate must be > 0")
    if args.target_gain is not None and not 0 < args.target_gain <= 1:
        p.error(f"--target-gain: {args.target_gain}; must be in (0, 1] (a share of prompts)")
    return args


def saved_report(args: argparse.Namespace) -> str:
    """The report of the runs saved in the ``--report`` files, taken together as one race."""
    # Several saved runs (e.g. one invocation per learning rate) make one race, provided
    # they share the base model's accuracy (the same evaluation).
    loaded = [load(Path(p)) for p in args.report]
    bases = {round(base, 6) for base, _, _ in loaded}
    if len(bases) != 1:
        raise SystemExit(f"--report: the files disagree on the base accuracy ({bases})")
    base, saved, results = loaded[0][0], loaded[0][1], [r for *_, rs in loaded for r in rs]
    gain = args.target_gain if args.target_gain is not None else saved.get("target_gain")
    load0 = results[0].load[0] if results else 0.0
    return report(results, base, gain if gain is not None else TARGET_GAIN, load0)


def child_main(args: argparse.Namespace) -> None:
    """The ``--child`` process: one TRL run, as ``run_trl`` asked for it."""
    data = json.loads(args.child)
    shared = data["shared"]
    shared["task"] = Task(**shared["task"])
    trl_child(RunSpec(**data["spec"]), Shared(**shared), Path(args.out))


def shared_settings(args: argparse.Namespace) -> Shared:
    """What both trainers share, from the command line."""
    from grpo_train.models.loading import resolve_model

    return Shared(
        model=resolve_model(args.model),
        task=Task(args.env, json.loads(args.env_kwargs)),
        prompts=args.prompts,
        group=args.group,
        completion_length=args.completion_length,
        temperature=args.temperature,
        eval_every=args.eval_every,
        seed=args.seed,
        threads=args.threads,
    )


def header(args: argparse.Namespace, task: Task, load0: float) -> str:
    """The first line printed: when, where, how loaded, and the workload."""
    return (
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, {os.cpu_count()} CPUs, "
        f"load {load0:.1f}; {task.env_id} {task.kwargs}; {args.prompts} prompts x "
        f"{args.group} completions, <= {args.completion_length} tokens; eval: greedy HF, "
        f"{args.eval_size} held-out prompts; threads per process: "
        f"{args.threads or 'torch default'}"
    )


def train_and_evaluate(
    spec: RunSpec, shared: Shared, run_dir: Path, args: argparse.Namespace
) -> RunResult:
    """Train one run, then score each policy it saved (and delete it unless ``--keep``)."""
    print(f"training {spec.name}: {spec.steps} steps, lr {spec.learning_rate:g} ...", flush=True)
    run = run_trl if spec.trainer == "trl" else run_ours
    load0 = os.getloadavg()[0]
    result = run(spec, shared, run_dir)
    result.load = (load0, os.getloadavg()[0])
    for point in result.points:
        point.accuracy = evaluate(point.path, shared.task, args.eval_size, args.completion_length)
        print(f"  step {point.step}: {point.accuracy:.1%} after {point.train_s:.0f} s", flush=True)
    if not args.keep:  # policies are 0.5-1.5 GB each
        for point in result.points:
            shutil.rmtree(
                Path(point.path).parent if spec.trainer == "ours" else point.path,
                ignore_errors=True,
            )
    return result


def main(argv: Sequence[str] | None = None) -> int:
    """Run every asked-for training, evaluate their policies, print the table, draw the plot."""
    args = parse_args(argv)
    if args.report:
        print(saved_report(args))
        return 0
    if args.child:
        child_main(args)
        return 0
    shared = shared_settings(args)
    if args.threads > 0:
        import torch

        torch.set_num_threads(args.threads)
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="learning-curve-"))
    out.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    print(header(args, shared.task, load_before[0]), flush=True)
    t = time.perf_counter()
    base = evaluate(shared.model, shared.task, args.eval_size, args.completion_length)
    print(f"base model: {base:.1%} ({time.perf_counter() - t:.0f} s to evaluate)", flush=True)
    results: list[RunResult] = []
    for spec in build_runs(args):
        run_dir = out / spec.name.replace("/", "-")
        results.append(train_and_evaluate(spec, shared, run_dir, args))
        save(out / "learning_curve.json", base, args, results)
    gain = args.target_gain if args.target_gain is not None else TARGET_GAIN
    print(report(results, base, gain, load_before[0]))
    png = plot(results, base, out / "learning_curve.png")
    save(out / "learning_curve.json", base, args, results)
    print(f"results: {out / 'learning_curve.json'}; plot: {png or 'not drawn (no matplotlib)'}")
    return 1 if any(r.error for r in results) else 0


def report(results: Sequence[RunResult], base: float, target_gain: float, load0: float) -> str:
    """The side-by-side table, the load during each run, and (ours and TRL) the race."""
    text = [f"\n{table(results, base)}"]
    text.append(f"load average (1 min) before {load0:.1f}, after {os.getloadavg()[0]:.1f}")
    loads = ", ".join(f"{r.spec.name} {r.load[0]:.1f}->{r.load[1]:.1f}" for r in results)
    text.append(f"load per run (1 min, start->end): {loads}")
    trainers = {r.spec.trainer for r in results}
    target = min(base + target_gain, 1.0)
    if any(r.spec.seed is not None for r in results):
        text.append("\n" + seed_report(results, base, target))
    elif {"ours", "trl"} <= trainers:
        text.append("\n" + race_report(results, target))
    return "\n".join(text)


def save(path: Path, base: float, args: argparse.Namespace, results: Sequence[RunResult]) -> None:
    """Write the results so far (after every run: a stopped benchmark keeps what it measured)."""
    summary = {"base_accuracy": base, "args": vars(args), "results": [asdict(r) for r in results]}
    path.write_text(json.dumps(summary, indent=1, default=str))


def load(path: Path) -> tuple[float, dict, list[RunResult]]:
    """Read back what ``save`` wrote: base accuracy, the arguments, the runs."""
    data = json.loads(path.read_text())
    results = []
    for r in data["results"]:
        points = [Point(**p) for p in r.pop("points")]
        spec = RunSpec(**r.pop("spec"))
        r["load"] = tuple(r.get("load", (0.0, 0.0)))
        results.append(RunResult(spec, points, **r))
    return float(data["base_accuracy"]), data["args"], results


if __name__ == "__main__":
    raise SystemExit(main())
