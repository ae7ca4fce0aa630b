"""Several updates on identical data: our batches replayed through TRL's GRPOTrainer.

On one identical batch both trainers compute the same gradient and the same first AdamW step.
This script checks the next steps too: whatever acts only from the second update on (optimizer
state, the set of parameters the optimizer holds, the tied ``embed_tokens`` / ``lm_head``,
gradient clipping, loss normalisation over different batches, advantages, the model's mode, the
schedule) makes the two trainers' parameters drift apart here.

1. ``grpo train``'s default run (the embedded preset: SmolLM2-135M-Instruct, two-digit addition
   with loose answers, 4 prompts x 8 completions, 64 tokens, T = 1, lr 2e-5 constant, beta 0,
   float32, full fine-tuning) runs ``--steps`` steps on the ``hf`` engine. A ``Trainer`` subclass
   records, per step, what the update trained on (each row's prompt and completion ids, reward,
   advantage) and the parameters after the update. Before each update it also compares the
   engine's sampling log-probabilities with the trainer's own of the same tokens (current
   weights): a gap far below what one update moves them (measured right after the update) says
   the engine sampled from the updated weights.
2. TRL's ``GRPOTrainer`` (``rollout_func`` returns our completions, a reward function returns our
   rewards) trains on those batches in the same order with the race's settings
   (``benchmarks/learning_curve.py``'s ``trl_child``: beta 0, ``dapo``, group scaling, constant
   lr, float32, 32 rows per step, 8 per group, max_grad_norm 1), once with TRL's ``adam_beta2``
   (0.999) and once with ours (0.99).
3. After every step the two parameter sets are compared: the largest absolute difference, and
   for the update so far (``theta_t - theta_0``) and the step's own update
   (``theta_t - theta_{t-1}``) the cosine between ours and TRL's and the norm ratio TRL / ours,
   overall and per parameter group (``embed`` = the tied embedding / lm_head, attention, mlp,
   norms).

    .venv/bin/python benchmarks/replay_check.py --steps 6 --seed 0 --threads 1

Prints one table per TRL arm (a row per step) and the per-group table of the last step; writes
``replay_check.json`` into ``--out``. Parameter snapshots (about 540 MB each) go to a temporary
folder that is removed at the end.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

GROUPS = ("embed", "attention", "mlp", "norms")


def group_of(name: str) -> str:
    """The parameter group of a parameter name (Llama layout; ``lm_head`` is tied to embed)."""
    if "embed_tokens" in name or "lm_head" in name:
        return "embed"
    if "self_attn" in name:
        return "attention"
    if ".mlp." in name:
        return "mlp"
    if "norm" in name:
        return "norms"
    raise ValueError(f"parameter {name} is in no group")


@dataclass
class StepBatch:
    """What our update trained on at one step, row by row (group-major), and what it measured."""

    step: int
    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    sampling_logprobs: list[list[float]]
    rewards: list[float]
    advantages: list[float]
    grad_norm: float = math.nan
    engine_gap: float = math.nan
    """Max |engine sampling logprob - trainer logprob (weights the update starts from)|."""
    update_shift: float = math.nan
    """Max |trainer logprob after this step's update - before| over the same tokens."""

    @property
    def train_accuracy(self) -> float:
        """Share of the step's sampled completions that were right (reward 1)."""
        return sum(r >= 1.0 for r in self.rewards) / max(len(self.rewards), 1)


@dataclass
class Agreement:
    """Ours against TRL after one step, overall or for one parameter group."""

    max_abs_diff: float
    cos_total: float
    """Cosine of (theta_t - theta_0), ours vs TRL."""
    ratio_total: float
    """|theta_t - theta_0| TRL / ours."""
    rel_diff_total: float
    """|update TRL - update ours| / |update ours|, updates since step 0."""
    cos_step: float
    """Cosine of this step's own update (theta_t - theta_{t-1})."""
    ratio_step: float
    norm_total_ours: float


@dataclass
class ArmResult:
    """One TRL run's comparison, step by step."""

    name: str
    adam_beta2: float
    overall: list[Agreement] = field(default_factory=list)
    groups: list[dict[str, Agreement]] = field(default_factory=list)
    grad_norm: list[float] = field(default_factory=list)
    seconds: float = 0.0
    saved: str = ""
    """The final policy as saved for evaluation."""


# --------------------------------------------------------------------------- snapshots


def snapshot(model: torch.nn.Module, path: Path) -> None:
    """Save the parameters (each tied tensor once, under its first name)."""
    torch.save({n: p.detach().clone() for n, p in model.named_parameters()}, path)


def load_snapshot(path: Path) -> dict[str, torch.Tensor]:
    """Memory-mapped: comparing streams tensor by tensor instead of holding a second model."""
    return torch.load(path, mmap=True, weights_only=True)


def agreement(
    ours: dict[str, torch.Tensor],
    ours_prev: dict[str, torch.Tensor],
    theirs: dict[str, torch.Tensor],
    theirs_prev: dict[str, torch.Tensor],
    start: dict[str, torch.Tensor],
) -> tuple[Agreement, dict[str, Agreement]]:
    """Compare two trainers' parameters after a step, overall and per group (float64 sums).

    >>> a = {"model.norm.weight": torch.tensor([1.0, 2.0])}
    >>> z = {"model.norm.weight": torch.tensor([0.0, 0.0])}
    >>> overall, _ = agreement(a, z, a, z, z)
    >>> overall.cos_total, overall.ratio_total, overall.max_abs_diff
    (1.0, 1.0, 0.0)
    """
    keys = ("dot", "oo", "tt", "dd", "sdot", "soo", "stt", "max")
    sums = {g: dict.fromkeys(keys, 0.0) for g in (*GROUPS, "all")}
    for name, t in theirs.items():
        o, t = ours[name].double(), t.double()
        u_o, u_t = o - start[name].double(), t - start[name].double()
        s_o, s_t = o - ours_prev[name].double(), t - theirs_prev[name].double()
        values = {
            "dot": float((u_o * u_t).sum()),
            "oo": float((u_o * u_o).sum()),
            "tt": float((u_t * u_t).sum()),
            "dd": float(((u_o - u_t) ** 2).sum()),
            "sdot": float((s_o * s_t).sum()),
            "soo": float((s_o * s_o).sum()),
            "stt": float((s_t * s_t).sum()),
        }
        diff = float((o - t).abs().max())
        for g in (group_of(name), "all"):
            for k, v in values.items():
                sums[g][k] += v
            sums[g]["max"] = max(sums[g]["max"], diff)

    def of(s: dict[str, float]) -> Agreement:
        def cos(dot: float, a: float, b: float) -> float:
            return dot / math.sqrt(a * b) if a > 0 and b > 0 else math.nan

        def ratio(a: float, b: float) -> float:
            return math.sqrt(b / a) if a > 0 else math.nan

        return Agreement(
            max_abs_diff=s["max"],
            cos_total=cos(s["dot"], s["oo"], s["tt"]),
            ratio_total=ratio(s["oo"], s["tt"]),
            rel_diff_total=math.sqrt(s["dd"] / s["oo"]) if s["oo"] > 0 else math.nan,
            cos_step=cos(s["sdot"], s["soo"], s["stt"]),
            ratio_step=ratio(s["soo"], s["stt"]),
            norm_total_ours=math.sqrt(s["oo"]),
        )

    return of(sums["all"]), {g: of(sums[g]) for g in GROUPS}


# --------------------------------------------------------------------------- ours


def trainer_logprobs(
    model: torch.nn.Module, prompt: Sequence[int], completion: Sequence[int], temperature: float
) -> torch.Tensor:
    """The trainer's ``log_softmax(logits / T)`` of each completion token: one unpadded forward."""
    ids = torch.tensor([[*prompt, *completion]])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    return logp.gather(1, torch.tensor(completion)[:, None])[:, 0]


def run_ours(args: argparse.Namespace, snapshots: Path) -> tuple[list[StepBatch], str]:
    """Train ours for ``args.steps`` steps, recording every batch and the parameters after it."""
    from grpo_train.config import TrainConfig, preset_config
    from grpo_train.models.loading import resolve_model
    from grpo_train.trainer import Trainer

    config = TrainConfig.from_flat(
        {
            "engine": args.engine,
            "max_steps": args.steps,
            "seed": args.seed,
            "eval_size": 0,
            "num_threads": args.threads,
            "progress": False,
            "save_every": 0,
            "output_dir": str(snapshots / "ours-run"),
            "overwrite": True,
        },
        base=preset_config(),
    )
    batches: list[StepBatch] = []
    probe_rows = args.probe_rows

    class Recording(Trainer):
        """``Trainer`` that records each update's batch and the parameters after it."""

        def update(self, step, batch, advantages):  # type: ignore[no-untyped-def]
            if batch.completion_ids and len(batch.completion_ids) != batch.rewards.numel():
                raise RuntimeError("extra (re-rendered) rows: not a single-turn batch")
            if not bool(batch.trainable.all()) or not all(bool(m.all()) for m in batch.loss_mask):
                raise RuntimeError(f"step {step}: a row or token is masked out; TRL can't replay")
            if (
                batch.rewards.numel()
                != config.rollout.prompts_per_step * config.rollout.num_generations
            ):
                raise RuntimeError(
                    f"step {step}: {batch.rewards.numel()} rows (dynamic sampling dropped groups?)"
                )
            model = self.setup.model
            rows = batch.row_prompts()
            temperature = config.rollout.temperature
            probes = list(range(0, len(rows), max(1, len(rows) // probe_rows)))[:probe_rows]
            before = [
                trainer_logprobs(model, rows[r], batch.completion_ids[r], temperature)
                for r in probes
            ]
            gap = max(
                float((b - torch.tensor(batch.sampling_logprobs[r])).abs().max())
                for b, r in zip(before, probes)
            )
            metrics = super().update(step, batch, advantages)
            after = [
                trainer_logprobs(model, rows[r], batch.completion_ids[r], temperature)
                for r in probes
            ]
            shift = max(float((a - b).abs().max()) for a, b in zip(after, before))
            batches.append(
                StepBatch(
                    step=step,
                    prompt_ids=[list(p) for p in rows],
                    completion_ids=[list(c) for c in batch.completion_ids],
                    sampling_logprobs=[list(lp) for lp in batch.sampling_logprobs],
                    rewards=batch.rewards.flatten().tolist(),
                    advantages=advantages.flatten().tolist(),
                    grad_norm=float(metrics.get("grad_norm", math.nan)),
                    engine_gap=gap,
                    update_shift=shift,
                )
            )
            snapshot(model, snapshots / f"ours-{step}.pt")
            print(
                f"  ours step {step}: train accuracy {batches[-1].train_accuracy:.1%}, grad norm "
                f"{batches[-1].grad_norm:.4g}, engine gap {gap:.2e}, update shift {shift:.2e}",
                flush=True,
            )
            return metrics

    trainer = Recording(config)
    try:
        snapshot(trainer.setup.model, snapshots / "ours-0.pt")
        trainer.train()
    finally:
        trainer.close()
    return batches, resolve_model(config.policy.model)


# --------------------------------------------------------------------------- TRL


def run_trl(
    args: argparse.Namespace,
    name: str,
    adam_beta2: float,
    model_path: str,
    batches: Sequence[StepBatch],
    snapshots: Path,
) -> ArmResult:
    """Train TRL's GRPOTrainer on ``batches`` (ours' completions and rewards), step by step."""
    from datasets import Dataset
    from learning_curve import race_grpo_config
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOTrainer

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    group = 8
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    # One dataset row per group, in our order; TRL reads it unshuffled, 4 prompts per step.
    texts = [tokenizer.decode(b.prompt_ids[i]) for b in batches for i in range(0, 32, group)]
    dataset = Dataset.from_list([{"prompt": t} for t in texts])
    calls: list[int] = []

    def replay(prompts: list, trainer: object) -> dict[str, list]:
        """Our step's rows instead of a generation: prompt ids, completion ids, logprobs."""
        b = batches[len(calls)]
        calls.append(b.step)
        expected = [tokenizer.decode(p) for p in b.prompt_ids]
        if list(prompts) != expected:
            raise RuntimeError(f"step {b.step}: TRL's prompts are not the replayed batch's")
        return {
            "prompt_ids": b.prompt_ids,
            "completion_ids": b.completion_ids,
            "logprobs": b.sampling_logprobs,
        }

    def replayed_reward(completions: list, **kwargs: object) -> list[float]:
        """Our rewards of the completions ``replay`` just returned (checked by their ids)."""
        b = batches[len(calls) - 1]
        ids = kwargs.get("completion_ids")
        if ids is not None and [list(i) for i in ids] != b.completion_ids:  # type: ignore[attr-defined]
            raise RuntimeError(f"step {b.step}: TRL scores other completions than ours")
        return list(b.rewards)

    cfg = race_grpo_config(
        snapshots / f"trl-{name}",
        prompts=32 // group,
        group=group,
        completion_length=64,
        temperature=1.0,
        learning_rate=2e-5,
        steps=len(batches),
        seed=args.seed,
        adam_beta2=adam_beta2,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[replayed_reward],
        args=cfg,
        train_dataset=dataset,
        processing_class=tokenizer,
        rollout_func=replay,
    )
    result = ArmResult(name, adam_beta2)
    start = load_snapshot(snapshots / "ours-0.pt")
    start_diff = max(
        float((p.detach() - start[n]).abs().max()) for n, p in model.named_parameters()
    )
    if start_diff != 0.0:
        raise RuntimeError(f"TRL's initial weights differ from ours' by {start_diff}")
    previous = {n: p.detach().clone() for n, p in model.named_parameters()}

    class Compare(TrainerCallback):
        def on_step_end(self, args_, state, control, **kwargs):  # type: ignore[no-untyped-def]
            nonlocal previous
            step = state.global_step
            theirs = {n: p.detach() for n, p in kwargs["model"].named_parameters()}
            ours = load_snapshot(snapshots / f"ours-{step}.pt")
            ours_prev = load_snapshot(snapshots / f"ours-{step - 1}.pt")
            overall, groups = agreement(ours, ours_prev, theirs, previous, start)
            result.overall.append(overall)
            result.groups.append(groups)
            previous = {n: t.clone() for n, t in theirs.items()}
            print(
                f"  TRL {name} step {step}: cos total {overall.cos_total:.6f}, step "
                f"{overall.cos_step:.6f}, ratio {overall.ratio_total:.4f}, max diff "
                f"{overall.max_abs_diff:.2e}",
                flush=True,
            )

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    trainer.add_callback(Compare())
    t0 = time.perf_counter()
    trainer.train()
    result.seconds = time.perf_counter() - t0
    result.grad_norm = [
        float(h["grad_norm"]) for h in trainer.state.log_history if "grad_norm" in h
    ]
    # Saved as the race saves TRL's policies, for the one evaluation of both (``saved_check``).
    result.saved = str(snapshots / f"trl-{name}-final")
    trainer.model.save_pretrained(result.saved)  # type: ignore[union-attr,operator]
    tokenizer.save_pretrained(result.saved)
    # The next arm loads its own model: free this one's model, optimizer and buffers first (two
    # arms' trainers together with the parameter snapshots outgrew 24 GiB on a shared machine).
    del trainer, model
    gc.collect()
    if calls != [b.step for b in batches]:
        raise RuntimeError(f"TRL replayed steps {calls}, expected {[b.step for b in batches]}")
    return result


# --------------------------------------------------------------------------- saved policies


@dataclass
class Saved:
    """One saved final policy: how it differs from ours' and its held-out accuracy."""

    name: str
    path: str
    max_weight_diff: float = 0.0
    """Largest absolute difference of its saved tensors from ours' saved ones."""
    differing_files: list[str] = field(default_factory=list)
    """Saved json files (config, generation config, tokenizer) whose content differs from ours'."""
    accuracy: float = math.nan


def saved_check(ours: str, others: Sequence[tuple[str, str]], eval_size: int) -> list[Saved]:
    """Compare the saved final policies with ours' and score each with the race's evaluation.

    The race scores what each trainer saved (``learning_curve.evaluate``: greedy HF ``generate``
    on the first held-out prompts): with equal weights, a difference here would sit in what is
    saved beside them (generation config, EOS, tokenizer) rather than in training.
    """
    import sys

    from safetensors.torch import load_file

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from learning_curve import Task, evaluate

    task = Task("math/arithmetic-v0", {"task": "add2", "answer": "loose"})

    def tensors(folder: str) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for f in sorted(Path(folder).glob("*.safetensors")):
            out.update(load_file(f))
        return out

    def jsons(folder: str) -> dict[str, object]:
        return {f.name: json.loads(f.read_text()) for f in sorted(Path(folder).glob("*.json"))}

    mine, my_files = tensors(ours), jsons(ours)
    results = [Saved("ours", ours)]
    for name, path in others:
        theirs, files = tensors(path), jsons(path)
        saved = Saved(name, path)
        if set(theirs) != set(mine):
            saved.differing_files.append(f"tensors: {sorted(set(theirs) ^ set(mine))}")
        saved.max_weight_diff = max(
            (float((theirs[k] - mine[k]).abs().max()) for k in set(theirs) & set(mine)),
            default=math.nan,
        )
        for f in sorted(set(files) | set(my_files)):
            a, b = my_files.get(f), files.get(f)
            if a == b:
                continue
            if isinstance(a, dict) and isinstance(b, dict):  # which keys: ours -> theirs
                keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
                f += " (" + "; ".join(f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in keys) + ")"
            saved.differing_files.append(f)
        results.append(saved)
    for saved in results:
        saved.accuracy = evaluate(saved.path, task, eval_size, 64)
        print(f"  {saved.name}: held-out accuracy {saved.accuracy:.1%}", flush=True)
    return results


def saved_table(saved: Sequence[Saved]) -> str:
    """The saved final policies side by side."""
    lines = [
        "| final policy | held-out accuracy | max weight diff vs ours | files unlike ours |",
        "|---|---|---|---|",
    ]
    for s in saved:
        files = ", ".join(s.differing_files) or "none"
        lines.append(f"| {s.name} | {s.accuracy:.1%} | {s.max_weight_diff:.2e} | {files} |")
    return "\n".join(lines)


# --------------------------------------------------------------------------- report


def step_table(batches: Sequence[StepBatch], arm: ArmResult) -> str:
    """One row per step: ours vs TRL update norm, cosines, max diff, grad norms."""
    head = (
        f"TRL {arm.name} (adam_beta2 {arm.adam_beta2}) against ours (adam_beta2 0.99)\n\n"
        "| step | train acc | grad norm ours / TRL | update norm ours / TRL | cos (since 0) "
        "| cos (this step) | step norm TRL / ours | max abs diff |\n"
        "|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for b, a, g in zip(batches, arm.overall, arm.grad_norm or [math.nan] * len(batches)):
        lines.append(
            f"| {b.step} | {b.train_accuracy:.1%} | {b.grad_norm:.4f} / {g:.4f} "
            f"| {a.norm_total_ours:.4e} / {a.norm_total_ours * a.ratio_total:.4e} "
            f"| {a.cos_total:.6f} | {a.cos_step:.6f} | {a.ratio_step:.4f} | {a.max_abs_diff:.2e} |"
        )
    return "\n".join(lines)


def group_table(arm: ArmResult, index: int) -> str:
    """Per parameter group at one step."""
    lines = [
        f"TRL {arm.name}, step {index + 1}, per parameter group\n\n"
        "| group | update norm ours | cos (since 0) | norm TRL / ours | rel diff | cos (this step) "
        "| max abs diff |\n|---|---|---|---|---|---|---|"
    ]
    for g, a in arm.groups[index].items():
        lines.append(
            f"| {g} | {a.norm_total_ours:.4e} | {a.cos_total:.6f} | {a.ratio_total:.4f} "
            f"| {a.rel_diff_total:.2e} | {a.cos_step:.6f} | {a.max_abs_diff:.2e} |"
        )
    return "\n".join(lines)


def engine_table(batches: Sequence[StepBatch]) -> str:
    """Did the engine sample from the updated weights? Its gap against one update's shift."""
    lines = [
        "| step | sampling logprob - trainer's, max abs | one update's shift of them, max abs |",
        "|---|---|---|",
    ]
    lines += [f"| {b.step} | {b.engine_gap:.2e} | {b.update_shift:.2e} |" for b in batches]
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's choice)")
    p.add_argument(
        "--probe-rows", type=int, default=4, help="rows per step for the engine-weights check"
    )
    p.add_argument(
        "--beta2",
        type=float,
        nargs="*",
        default=[0.999, 0.99],
        help="one TRL replay per adam_beta2 (none: only ours and its engine check)",
    )
    p.add_argument(
        "--engine",
        choices=["hf", "vllm"],
        default="hf",
        help="ours' rollout engine (the engine check compares its logprobs with the trainer's)",
    )
    p.add_argument(
        "--eval-size",
        type=int,
        default=64,
        help="held-out prompts for the saved policies (0: none)",
    )
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="replay_check-") as folder:
        snapshots = Path(folder)
        print(f"ours: {args.steps} steps, seed {args.seed}, {args.engine} engine", flush=True)
        batches, model_path = run_ours(args, snapshots)
        ours_s = time.perf_counter() - t0
        # What ours trained on, kept whatever happens to the TRL arms.
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "replay_check_batches.json").write_text(
            json.dumps([asdict(b) for b in batches])
        )
        arms = []
        for beta2 in args.beta2:
            name = "default" if beta2 == 0.999 else f"beta2={beta2}"
            print(f"TRL replay, adam_beta2 {beta2}", flush=True)
            arms.append(run_trl(args, name, beta2, model_path, batches, snapshots))
        saved: list[Saved] = []
        if args.eval_size > 0 and arms:
            from grpo_train.run.checkpoint import MODEL_DIR, list_checkpoints

            print("saved final policies, evaluated", flush=True)
            final = list_checkpoints(snapshots / "ours-run")[-1] / MODEL_DIR
            others = [(f"TRL {a.name}", a.saved) for a in arms]
            saved = saved_check(str(final), others, args.eval_size)
    load1 = os.getloadavg()[0]
    print(
        f"\nload {load0:.1f} -> {load1:.1f}; ours {ours_s:.0f} s, TRL arms "
        + ", ".join(f"{a.seconds:.0f} s" for a in arms)
        + "\n"
    )
    print(f"Engine weights (ours, {args.engine} engine):\n")
    print(engine_table(batches) + "\n")
    for arm in arms:
        print(step_table(batches, arm) + "\n")
        print(group_table(arm, len(arm.groups) - 1) + "\n")
    if saved:
        print(saved_table(saved) + "\n")
    args.out.mkdir(parents=True, exist_ok=True)
    payload = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "load": [load0, load1],
        "steps": [
            {
                k: v
                for k, v in asdict(b).items()
                if k not in ("prompt_ids", "completion_ids", "sampling_logprobs")
            }
            | {"train_accuracy": b.train_accuracy}
            for b in batches
        ],
        "arms": [asdict(a) for a in arms],
        "saved": [asdict(s) for s in saved],
    }
    (args.out / "replay_check.json").write_text(json.dumps(payload, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
