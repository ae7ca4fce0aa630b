"""TRL's batches replayed through our trainer: the converse of ``replay_check.py``.

``replay_check.py`` replays our batches through TRL's ``GRPOTrainer`` and finds the same
parameters after every step. This script goes the other way, on the race itself: the batches
TRL's ``GRPOTrainer`` drew in a ``learning_curve.py`` race (its reward function writes each
step's completion ids and rewards to ``batches.jsonl`` in the run's folder) are fed to ``grpo
train`` with the race's own settings for ours, through an engine that returns TRL's completions
instead of sampling (``ReplayEngine``). Our policies after steps 2, 4, 6... are scored by the
race's evaluation and set beside TRL's held-out accuracy at the same steps.

If our update learns from TRL's batches what TRL learned from them, a per-step gap between the
two trainers in the race comes from what each drew, not from how each learns from a batch.

Settings that change what is sampled have nothing to act on here and are off: dynamic sampling
and the curriculum would ask for more rounds than TRL drew, and the importance-sampling correction
needs the sampler's log-probabilities, which TRL does not record (TRL samples from the weights it
trains, so the correction's weights would be 1).

    .venv/bin/python benchmarks/trl_replay.py --race RACE_DIR --seeds 10 11 --threads 1
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import learning_curve as lc  # noqa: E402  (the race's settings, evaluation and saved runs)

#: What the replay turns off (module docstring: nothing to sample, or no sampler log-probs).
REPLAY_OVERRIDES = {
    "engine": "hf",  # started, then replaced by the replay engine; hf is the cheap one to start
    "dynamic_sampling": "off",
    "curriculum": "off",
    "is_correction": False,
}


@dataclass(frozen=True)
class RecordedStep:
    """One step of TRL's batches: completions in TRL's order (each prompt's group together)."""

    ids: list[str]
    completion_ids: list[list[int]]
    rewards: list[float]


def read_batches(path: Path) -> list[RecordedStep]:
    """The steps ``learning_curve.trl_child`` recorded, in order; a clear error if absent."""
    if not path.exists():
        raise SystemExit(
            f"{path}: no recorded batches (races run before batches were recorded have none)"
        )
    steps = []
    for line in path.read_text().splitlines():
        row = json.loads(line)
        steps.append(RecordedStep(row["ids"], row["completion_ids"], row["rewards"]))
    return steps


class ReplayEngine:
    """A rollout engine that returns recorded completions, one step's batch per call.

    It checks that each call asks for as many prompts and completions as the recorded step holds;
    the prompts themselves are the race's (``learning_curve.check_prompts`` checked TRL's ids).
    """

    name = "replay"
    last_sync_seconds = 0.0

    def __init__(self, steps: Sequence[RecordedStep], tokenizer: Any, eos_ids: set[int]) -> None:
        self.steps, self.tokenizer, self.eos_ids = list(steps), tokenizer, eos_ids
        self.calls = 0

    def generate(
        self, prompt_token_ids: Sequence[Sequence[int]], sampling: Any, on_done: Any = None
    ) -> list[list[Any]]:
        """Return the next recorded step's completions, grouped by prompt (reported at once)."""
        from grpo_train.rollout.base import Completion, report_groups

        if self.calls >= len(self.steps):
            raise RuntimeError(
                f"replay: asked for step {self.calls + 1}, recorded {len(self.steps)}"
            )
        step = self.steps[self.calls]
        self.calls += 1
        n = sampling.n
        if len(step.completion_ids) != len(prompt_token_ids) * n:
            raise RuntimeError(
                f"replay step {self.calls}: asked for {len(prompt_token_ids)} x {n} completions, "
                f"recorded {len(step.completion_ids)}"
            )
        out: list[list[Any]] = []
        for p in range(len(prompt_token_ids)):
            group = []
            for ids in step.completion_ids[p * n : (p + 1) * n]:
                finish: Literal["stop", "length"] = (
                    "stop" if ids and ids[-1] in self.eos_ids else "length"
                )
                group.append(
                    Completion(
                        prompt_index=p,
                        text=self.tokenizer.decode(ids, skip_special_tokens=True),
                        token_ids=tuple(ids),
                        logprobs=tuple(0.0 for _ in ids),  # unused: is_correction is off
                        finish_reason=finish,
                    )
                )
            out.append(group)
        report_groups(out, on_done)
        return out

    def shares_weights(self, model: Any) -> bool:
        """True: nothing samples, so there are no weights to send."""
        return True

    def sync_weights(self, state: Mapping[str, Any]) -> None:
        """Nothing to load: the completions are recorded."""

    def sleep(self, level: Literal[1, 2] = 1) -> bool:
        """Nothing to put to sleep."""
        return False

    def wake_up(self) -> None:
        """Nothing to wake."""

    def close(self) -> None:
        """Nothing to close."""


@dataclass
class ReplayResult:
    """One seed: TRL's held-out accuracy in the race and ours on TRL's batches, per step."""

    seed: int
    steps: list[int]
    trl: list[float | None]
    ours: list[float]
    rewards_agree: bool
    """Whether our environment scored TRL's completions as TRL's reward function did."""


def replay_seed(
    trl_run: lc.RunResult, race_dir: Path, shared: lc.Shared, eval_size: int, work: Path
) -> ReplayResult:
    """Train ours on one TRL run's batches and score its saved policies."""
    import torch
    import yaml

    from grpo_train.config import TrainConfig
    from grpo_train.run.checkpoint import MODEL_DIR, list_checkpoints
    from grpo_train.run.run_log import read_metrics
    from grpo_train.train_cli import build_parser, resolve_config
    from grpo_train.trainer import Trainer

    spec = trl_run.spec
    steps = read_batches(race_dir / spec.name / "batches.jsonl")
    if len(steps) < spec.steps:
        raise SystemExit(f"{spec.name}: {len(steps)} recorded steps, the run had {spec.steps}")
    ours_spec = lc.RunSpec(
        f"replay#s{spec.seed}", "ours", spec.steps, spec.learning_rate, dict(REPLAY_OVERRIDES),
        spec.seed,
    )  # fmt: skip
    run_dir = work / ours_spec.name
    config_path = work / f"{ours_spec.name}.yaml"
    config_path.write_text(yaml.safe_dump(lc.ours_config(ours_spec, shared, run_dir)))
    config: TrainConfig = resolve_config(build_parser().parse_args(["--config", str(config_path)]))
    if shared.threads > 0:
        torch.set_num_threads(shared.threads)
    from transformers import AutoTokenizer, GenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(shared.model)
    eos = lc._as_list(GenerationConfig.from_pretrained(shared.model).eos_token_id)
    engine = ReplayEngine(steps, tokenizer, {tokenizer.eos_token_id, *eos})
    trainer = Trainer(config, engine=engine)
    try:
        trainer.train()
    finally:
        trainer.close()
    rows = [r for r in read_metrics(run_dir) if "time/step" in r]
    ours_acc = [float(r["accuracy"]) for r in sorted(rows, key=lambda r: r["step"])]
    trl_acc = trl_run.train_accuracy[: len(ours_acc)]
    agree = len(ours_acc) == len(trl_acc) and all(
        abs(a - b) < 1e-9 for a, b in zip(ours_acc, trl_acc)
    )
    trl_points = {p.step: p.accuracy for p in trl_run.points}
    out = ReplayResult(spec.seed or 0, [], [], [], agree)
    for ckpt in list_checkpoints(run_dir):
        step = int(ckpt.name.split("-")[-1])
        out.steps.append(step)
        out.trl.append(trl_points.get(step))
        out.ours.append(
            lc.evaluate(str(ckpt / MODEL_DIR), shared.task, eval_size, shared.completion_length)
        )
        print(
            f"  seed {spec.seed} step {step}: TRL {trl_points.get(step)}, "
            f"ours on TRL's batches {out.ours[-1]:.1%}",
            flush=True,
        )
    shutil.rmtree(run_dir, ignore_errors=True)
    return out


def table(results: Sequence[ReplayResult]) -> str:
    """Per seed and step: TRL's held-out accuracy in the race, ours on TRL's batches, the gap.

    >>> print(table([ReplayResult(3, [2], [0.25], [0.3125], True)]))
    seed  step      TRL   ours on TRL's batches   ours - TRL   rewards agree
    3     2       25.0%                   31.2%         +6.2             yes
    """
    lines = ["seed  step      TRL   ours on TRL's batches   ours - TRL   rewards agree"]
    for r in results:
        for step, trl, ours in zip(r.steps, r.trl, r.ours):
            gap = "-" if trl is None else f"{100 * (ours - trl):+.1f}"
            trl_cell = "-" if trl is None else f"{trl:.1%}"
            lines.append(
                f"{r.seed:<6}{step:<6}{trl_cell:>7}{ours:>24.1%}{gap:>13}"
                f"{'yes' if r.rewards_agree else 'no':>16}"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Replay the asked-for seeds of a saved race; print the table."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--race", required=True, help="a learning_curve.py --out folder")
    p.add_argument("--seeds", type=int, nargs="+", required=True)
    p.add_argument("--eval-size", type=int, default=None, help="default: the race's")
    p.add_argument("--threads", type=int, default=None, help="default: the race's")
    p.add_argument("--out", default=None, help="folder for replay.json (default: the race's)")
    args = p.parse_args(argv)
    race = Path(args.race)
    _, saved, results = lc.load(race / "learning_curve.json")
    if args.threads is not None:
        saved["threads"] = args.threads
    shared = lc.shared_settings(argparse.Namespace(**saved))
    eval_size = args.eval_size or int(saved["eval_size"])
    trl_runs = {r.spec.seed: r for r in results if r.spec.trainer == "trl"}
    missing = [s for s in args.seeds if s not in trl_runs]
    if missing:
        raise SystemExit(f"--seeds {missing}: no TRL run of that seed in {race}")
    work = Path(tempfile.mkdtemp(prefix="trl-replay-"))
    replayed = []
    try:
        for seed in args.seeds:
            replayed.append(replay_seed(trl_runs[seed], race, shared, eval_size, work))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(table(replayed))
    out = Path(args.out) if args.out else race
    out.mkdir(parents=True, exist_ok=True)
    (out / "trl_replay.json").write_text(json.dumps([r.__dict__ for r in replayed], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
