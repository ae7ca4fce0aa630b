"""GRPO against PPO, measured: peak memory and time per step, ours against TRL's PPO trainer.

GRPO's selling point is that it needs no value model (DeepSeekMath, arXiv:2402.03300, section
4.1: the group mean replaces the learned baseline). This script measures what that buys on one
machine, side by side: our GRPO update (``grpo_train.trainer.Trainer``) and TRL's ``PPOTrainer``
(policy, value model, reference), full fine-tuning and LoRA, on the same model, prompts, batch
(prompts x completions), prompt and completion lengths, sampling temperature, learning rate and
reward::

    python benchmarks/ppo_bench.py                  # every configuration, 2 rounds
    python benchmarks/ppo_bench.py --quick          # smoke: 2 steps, 2 x 2 rows, 8 tokens
    python benchmarks/ppo_bench.py --configs ours-full trl-ppo-full --steps 5

**Which PPO.** TRL 1.16 (the installed version) ships no PPO trainer: ``trl.PPOTrainer`` moved to
``trl.experimental.ppo`` in TRL 1.10 and was deleted in 1.13 (huggingface/trl pull 7020). The PPO
configurations therefore run ``trl.experimental.ppo.PPOTrainer`` from TRL 1.12.0, the last release
that has it, installed with ``pip install --no-deps --target`` into ``--trl-ppo-dir`` (done on
first use; the project's own TRL is untouched) and put first on ``sys.path`` in the PPO child
process only. Everything else (torch, transformers, peft, accelerate) is the project's.

**What each side does per step.** PPO (TRL's loop, unchanged): sample with ``model.generate``,
a forward of the policy, the reference and the value model over the batch, GAE advantages, then one
PPO epoch of one mini-batch (policy and value model forward + backward, one AdamW step on both).
TRL's PPO scores completions with a reward *model*; to give both sides the same (rule) reward and
no fourth network, ``trl``'s ``get_reward`` is wrapped so that calls on the reward model return the
environment's score of the decoded completion (value-model calls are untouched). Ours: sample
(our HF engine, the same transformers model), score, one GRPO update (``dapo`` loss, one
optimizer step), with ``beta`` > 0 so that ours holds and runs a reference too. ``ours-*-beta0`` is
our default (beta 0: no reference, and rows whose advantage is 0 skip the update), for scale.
LoRA: r 16, alpha 32, all linear layers, for our policy and TRL's; the reference is the base
model with the adapter switched off on both sides; TRL's value model stays a full model (that is
how TRL's PPO builds it: ``peft_config`` applies to the policy only).

**How it is measured.** Each configuration runs in a fresh subprocess (clean memory); rounds of
all configurations alternate, so that load drifting on a shared machine hits all alike. Peak
memory is the child's ``resource.getrusage(RUSAGE_SELF).ru_maxrss`` (peak resident set size of
the process; torch's CPU allocations are ordinary heap memory and count in it, and so do the pages
of the memory-mapped safetensors weights once read), read at the end of the run. Time per step is
the wall time of each step (median over the steps after the first, which warms caches), with the
process CPU time per step beside it (less sensitive to other jobs on a shared machine). Every
process gets the same number of CPU threads (``--threads``). The table shows the median over
rounds of each column.

Why one module over 500 lines: the script is one measurement, run as a parent that alternates
fresh child processes; both sides' setup (ours, TRL's PPO with its separately installed version)
must stay side by side to be seen to match.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent

TRL_PPO_VERSION = "1.12.0"
"""The last TRL release with a PPO trainer (``trl.experimental.ppo``); 1.13 deleted it."""

CONFIGS = (
    "ours-full",
    "trl-ppo-full",
    "ours-lora",
    "trl-ppo-lora",
    "ours-full-beta0",
    "ours-lora-beta0",
)


@dataclass(frozen=True)
class Workload:
    """What every configuration trains on (the same for all)."""

    model: str
    env_id: str
    env_kwargs: dict[str, str | int | float]
    prompts: int
    group: int
    completion_length: int
    learning_rate: float
    beta: float
    steps: int
    threads: int
    lora_r: int = 16
    lora_alpha: int = 32

    @property
    def rows(self) -> int:
        """Completions per step (the batch)."""
        return self.prompts * self.group


@dataclass
class Measure:
    """One configuration's run in its own process."""

    config: str
    step_s: list[float] = field(default_factory=list)
    cpu_s: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    """Completion tokens generated per step."""
    rewards: list[float] = field(default_factory=list)
    setup_rss_mb: float = 0.0
    peak_rss_mb: float = 0.0
    trainable_m: float = 0.0
    """Trainable parameters, millions (policy, plus the value model for PPO)."""
    models: str = ""
    load: tuple[float, float] = (0.0, 0.0)
    error: str = ""


def maxrss_mb() -> float:
    """Peak resident set size of this process so far, MiB (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# --------------------------------------------------------------------------- ours


def run_ours(config: str, w: Workload, m: Measure) -> None:
    """Our trainer: HF engine, ``dapo`` loss, one optimizer step per step."""
    import grpo_envs
    from grpo_train.config import TrainConfig
    from grpo_train.run.run_log import read_metrics
    from grpo_train.trainer import Trainer

    lora = "-lora" in config
    beta = 0.0 if config.endswith("-beta0") else w.beta
    out = tempfile.mkdtemp(prefix=f"ppo-bench-{config}-")
    cfg = TrainConfig.from_flat(
        {
            "model": w.model,
            "engine": "hf",
            "dtype": "float32",
            "num_generations": w.group,
            "prompts_per_step": w.prompts,
            "max_prompt_length": 256,
            "max_completion_length": w.completion_length,
            "temperature": 1.0,
            "learning_rate": w.learning_rate,
            "lr_scheduler": "constant",
            "beta": beta,
            "loss_type": "dapo",
            "lora_r": w.lora_r if lora else 0,
            "lora_alpha": w.lora_alpha,
            "dynamic_sampling": "off",
            "max_steps": w.steps,
            "output_dir": out,
            "eval_size": 0,
            "save_every": 0,
            "keep_last": 1,
            "progress": False,
            "log_every_samples": 0,
            "num_threads": w.threads,
        }
    )
    env = grpo_envs.make(w.env_id, **w.env_kwargs)
    trainer = Trainer(cfg, env=env)
    m.models = "policy" + (" + LoRA" if lora else "") + (" + reference" if beta > 0 else "")
    if beta > 0 and lora:
        m.models = "policy + LoRA (reference: adapter off)"
    policy_params = trainer.setup.model.parameters()
    m.trainable_m = sum(p.numel() for p in policy_params if p.requires_grad) / 1e6
    m.setup_rss_mb = maxrss_mb()
    original = trainer.train_step

    def timed(step, log):
        t, c = time.perf_counter(), time.process_time()
        metrics = original(step, log)
        m.step_s.append(time.perf_counter() - t)
        m.cpu_s.append(time.process_time() - c)
        return metrics

    trainer.train_step = timed  # type: ignore[method-assign]
    trainer.save = lambda step: None  # type: ignore[method-assign,assignment,return-value]
    try:
        trainer.train()
    finally:
        trainer.close()
    for row in read_metrics(Path(out)):
        if "length/mean" in row:
            m.tokens.append(round(row["length/mean"] * w.rows))
            m.rewards.append(float(row["reward/mean"]))


# --------------------------------------------------------------------------- TRL's PPO


def ensure_trl_ppo(target: Path) -> Path:
    """The folder holding TRL ``TRL_PPO_VERSION`` (installed there, without dependencies, once)."""
    if (target / "trl" / "experimental" / "ppo" / "ppo_trainer.py").is_file():
        return target
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "-q",
        "--no-deps",
        "--target",
        str(target),
        f"trl=={TRL_PPO_VERSION}",
    ]
    print(f"installing TRL {TRL_PPO_VERSION}'s PPO into {target}: {' '.join(cmd)}", flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(
            f"could not install trl=={TRL_PPO_VERSION} into {target} (pip exit "
            f"{proc.returncode}: {proc.stderr.strip()[-300:]}); install it there by hand or pass "
            "--trl-ppo-dir pointing at a folder that has it"
        )
    return target


def ppo_dataset(w: Workload, env, tokenizer):
    """TRL's training set for ``w``, and the sample behind each encoded prompt (for scoring)."""
    import datasets

    from grpo_envs.types import Sample
    from grpo_train.episodes.prompts import encode_prompt

    rows = env.dataset("train")
    samples = [Sample.from_row(rows[i]) for i in range(w.prompts * w.steps)]
    # The same prompts as ours, through the same chat template; each prompt G times, so that a
    # batch of prompts x G rows holds the same number of completions as one GRPO step.
    encoded = [encode_prompt(tokenizer, s, max_tokens=256).ids for s in samples]
    by_prompt = {tuple(ids): s for ids, s in zip(encoded, samples)}
    data = datasets.Dataset.from_list(
        [{"input_ids": ids} for ids in encoded for _ in range(w.group)]
    )
    return data, by_prompt


def rule_reward(env, tokenizer, by_prompt, m: Measure):
    """A stand-in reward model whose scores TRL's ``get_reward`` takes from the environment.

    Patches ``get_reward`` in TRL's PPO module; calls on any other model (the value model) go to
    TRL's own. Counts the completion tokens of each scored batch into ``m.tokens``.
    """
    import torch
    from trl.experimental.ppo import ppo_trainer as ppo_module

    class RuleReward(torch.nn.Module):
        """Stands where TRL expects a reward model; ``get_reward`` below scores by rule."""

    rule = RuleReward()
    plain_get_reward = ppo_module.get_reward
    pad = int(tokenizer.pad_token_id)

    def get_reward(model, query_responses, pad_token_id, context_length):
        if model is not rule:
            return plain_get_reward(model, query_responses, pad_token_id, context_length)
        scores, lengths, tokens = [], [], 0
        for row in query_responses.tolist():
            query = row[:context_length]
            while query and query[0] == pad:  # left padding
                query = query[1:]
            response = row[context_length:]
            cut = response.index(pad) if pad in response else len(response)
            text = tokenizer.decode(response[:cut], skip_special_tokens=True)
            sample = by_prompt[tuple(query)]
            scores.append(env.score(text, sample).reward)
            lengths.append(context_length + cut - 1)
            tokens += min(cut + 1, len(response))  # the EOS counts, as in ours
        m.tokens.append(tokens)
        return None, torch.tensor(scores), torch.tensor(lengths)

    ppo_module.get_reward = get_reward
    return rule


def ppo_models(w: Workload, lora: bool):
    """Policy, value model, reference (None with LoRA: the adapter switched off) and LoRA config."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    policy = AutoModelForCausalLM.from_pretrained(w.model, dtype=torch.float32)
    value = AutoModelForSequenceClassification.from_pretrained(
        w.model, num_labels=1, dtype=torch.float32
    )
    reference = None if lora else AutoModelForCausalLM.from_pretrained(w.model, dtype=torch.float32)
    peft_config = None
    if lora:
        from peft import LoraConfig

        peft_config = LoraConfig(
            r=w.lora_r,
            lora_alpha=w.lora_alpha,
            lora_dropout=0.0,
            target_modules="all-linear",
            task_type="CAUSAL_LM",
        )
    return policy, value, reference, peft_config


def ppo_config(config: str, w: Workload):
    """TRL's ``PPOConfig`` for ``w``: one PPO epoch of one mini-batch per step, on the CPU."""
    from trl.experimental.ppo import PPOConfig

    return PPOConfig(
        output_dir=tempfile.mkdtemp(prefix=f"ppo-bench-{config}-"),
        per_device_train_batch_size=w.rows,
        gradient_accumulation_steps=1,
        num_mini_batches=1,
        num_ppo_epochs=1,  # one optimizer step per step, like ours (mu = 1)
        local_rollout_forward_batch_size=w.rows,
        total_episodes=w.rows * w.steps,
        response_length=w.completion_length,
        stop_token="eos",
        temperature=1.0,
        learning_rate=w.learning_rate,
        lr_scheduler_type="constant",
        num_sample_generations=0,
        missing_eos_penalty=None,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        bf16=False,
        seed=0,
        dataloader_num_workers=0,
    )


def step_clock(m: Measure):
    """A callback that records each step's wall and CPU time, and its mean score, into ``m``."""
    from transformers import TrainerCallback

    clock = {"t": 0.0, "c": 0.0}

    class StepClock(TrainerCallback):
        # TRL's PPO loop calls on_train_begin and on_step_end, not on_step_begin.
        def on_train_begin(self, *a, **kw):
            clock["t"], clock["c"] = time.perf_counter(), time.process_time()

        def on_step_end(self, *a, **kw):
            t, c = time.perf_counter(), time.process_time()
            m.step_s.append(t - clock["t"])
            m.cpu_s.append(c - clock["c"])
            clock["t"], clock["c"] = t, c

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "objective/scores" in logs:
                m.rewards.append(float(logs["objective/scores"]))

    return StepClock()


def run_trl_ppo(config: str, w: Workload, m: Measure, trl_dir: Path) -> None:
    """TRL 1.12's ``trl.experimental.ppo.PPOTrainer``, its own training loop, unchanged."""
    sys.path.insert(0, str(trl_dir))
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import trl
    from transformers import AutoTokenizer

    import grpo_envs

    # Checked before anything imports trl.experimental: the wrong TRL has no PPO to import.
    if trl.__version__ != TRL_PPO_VERSION:
        raise RuntimeError(f"expected TRL {TRL_PPO_VERSION} from {trl_dir}, got {trl.__version__}")
    from trl.experimental.ppo import PPOTrainer

    lora = "-lora" in config
    env = grpo_envs.make(w.env_id, **w.env_kwargs)
    tokenizer = AutoTokenizer.from_pretrained(w.model)
    tokenizer.padding_side = "left"  # generation continues each prompt, not its padding
    data, by_prompt = ppo_dataset(w, env, tokenizer)
    rule = rule_reward(env, tokenizer, by_prompt, m)
    policy, value, reference, peft_config = ppo_models(w, lora)
    trainer = PPOTrainer(
        args=ppo_config(config, w),
        processing_class=tokenizer,
        model=policy,
        ref_model=reference,
        reward_model=rule,
        value_model=value,
        train_dataset=data,
        peft_config=peft_config,
    )
    m.models = (
        "policy + LoRA (reference: adapter off) + value model (full)"
        if lora
        else "policy + reference + value model"
    )
    m.trainable_m = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad) / 1e6
    m.setup_rss_mb = maxrss_mb()
    trainer.add_callback(step_clock(m))
    trainer.train()


# --------------------------------------------------------------------------- driver


def child(config: str, w: Workload, trl_dir: Path, out: Path) -> None:
    """Run one configuration in this process and write its ``Measure`` to ``out``."""
    import torch

    torch.set_num_threads(w.threads)
    m = Measure(config)
    try:
        if config.startswith("trl-ppo"):
            run_trl_ppo(config, w, m, trl_dir)
        else:
            run_ours(config, w, m)
    except Exception as exc:  # a failed configuration is a row in the table
        m.error = f"{type(exc).__name__}: {str(exc)[:300]}"
    m.peak_rss_mb = maxrss_mb()
    out.write_text(json.dumps(asdict(m)))


def run_config(config: str, w: Workload, trl_dir: Path) -> Measure:
    """One configuration in a fresh subprocess."""
    out = Path(tempfile.mkdtemp(prefix="ppo-bench-")) / "measure.json"
    payload = json.dumps({"config": config, "workload": asdict(w), "trl_dir": str(trl_dir)})
    count = str(w.threads)
    env = {
        **os.environ,
        "OMP_NUM_THREADS": count,
        "MKL_NUM_THREADS": count,
        "TOKENIZERS_PARALLELISM": "false",
        "TRL_EXPERIMENTAL_SILENCE": "1",
    }
    load0 = os.getloadavg()[0]
    cmd = [sys.executable, str(HERE), "--child", payload, "--json", str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.is_file():
        data = json.loads(out.read_text())
        data["load"] = tuple(data["load"])
        m = Measure(**data)
    else:
        m = Measure(config, error=f"exit {proc.returncode}: {proc.stderr.strip()[-300:]}")
    m.load = (load0, os.getloadavg()[0])
    return m


@dataclass(frozen=True)
class Row:
    """One configuration's summary over its rounds (medians)."""

    config: str
    models: str
    trainable_m: float
    step_s: float
    cpu_s: float
    tokens: float
    setup_rss_mb: float
    peak_rss_mb: float
    rounds: int
    error: str = ""


def summarize(config: str, runs: Sequence[Measure]) -> Row:
    """Median over rounds of each round's median over its steps after the first (the warm-up).

    >>> a = Measure("x", step_s=[9.0, 2.0, 4.0], cpu_s=[9.0, 1.0, 3.0], tokens=[10, 20, 30],
    ...             setup_rss_mb=100.0, peak_rss_mb=300.0, trainable_m=1.5, models="policy")
    >>> b = Measure("x", step_s=[9.0, 6.0, 8.0], cpu_s=[9.0, 5.0, 7.0], tokens=[10, 40, 50],
    ...             setup_rss_mb=110.0, peak_rss_mb=320.0, trainable_m=1.5, models="policy")
    >>> r = summarize("x", [a, b])
    >>> r.step_s, r.cpu_s, r.tokens, r.peak_rss_mb, r.rounds
    (5.0, 4.0, 35.0, 310.0, 2)
    >>> summarize("x", [Measure("x", error="boom")]).error
    'boom'
    """
    med = statistics.median
    ok = [m for m in runs if not m.error and len(m.step_s) >= 2]
    if not ok:
        errors = [m.error for m in runs if m.error] or ["fewer than 2 steps"]
        return Row(config, "", 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0, errors[0])
    return Row(
        config=config,
        models=ok[0].models,
        trainable_m=ok[0].trainable_m,
        step_s=med(med(m.step_s[1:]) for m in ok),
        cpu_s=med(med(m.cpu_s[1:]) for m in ok),
        tokens=med(med(m.tokens[1:]) if len(m.tokens) > 1 else 0.0 for m in ok),
        setup_rss_mb=med(m.setup_rss_mb for m in ok),
        peak_rss_mb=med(m.peak_rss_mb for m in ok),
        rounds=len(ok),
    )


def peer(row: Row, rows: Sequence[Row]) -> Row | None:
    """The TRL PPO row of the same fine-tuning mode (full or LoRA) as ``row``.

    >>> rows = [Row("trl-ppo-full", "", 0, 1, 1, 1, 1, 1, 1), Row("trl-ppo-lora", "", 0, 1, 1, 1,
    ...         1, 1, 1)]
    >>> peer(Row("ours-lora-beta0", "", 0, 1, 1, 1, 1, 1, 1), rows).config
    'trl-ppo-lora'
    """
    mode = "lora" if "-lora" in row.config else "full"
    return next((r for r in rows if r.config == f"trl-ppo-{mode}" and not r.error), None)


def table(rows: Sequence[Row]) -> str:
    """Markdown table; ratios are TRL PPO's value over this row's (same fine-tuning mode).

    >>> rows = [Row("ours-full", "policy + reference", 134.5, 10.0, 9.0, 500, 1000, 3000, 2),
    ...         Row("trl-ppo-full", "policy + reference + value model", 269.0, 25.0, 27.0, 520,
    ...             1500, 6000, 2)]
    >>> table(rows).splitlines()[2].split(" | ")[3:]
    ['10.00', '9.00', '500', '3000', '2.5x', '3.0x', '2.0x |']
    """
    cols = (
        "configuration",
        "models in memory",
        "trainable M params",
        "s/step (wall)",
        "CPU s/step",
        "completion tokens/step",
        "peak RSS MB",
        "PPO/ours s/step",
        "PPO/ours CPU s",
        "PPO/ours peak RSS",
    )
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        if r.error:
            lines.append(f"| {r.config} | failed: {r.error} |" + " |" * (len(cols) - 2))
            continue
        p = peer(r, rows)
        if p is None or p is r:
            ratios = ["-", "-", "-"]
        else:
            ratios = [
                f"{p.step_s / r.step_s:.1f}x",
                f"{p.cpu_s / r.cpu_s:.1f}x",
                f"{p.peak_rss_mb / r.peak_rss_mb:.1f}x",
            ]
        lines.append(
            f"| {r.config} | {r.models} | {r.trainable_m:.1f} | {r.step_s:.2f} | {r.cpu_s:.2f} | "
            f"{r.tokens:.0f} | {r.peak_rss_mb:.0f} | " + " | ".join(ratios) + " |"
        )
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line options (see the module doc)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="default", help="HF folder; default: the converted SmolLM2")
    p.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=CONFIGS)
    p.add_argument("--rounds", type=int, default=2, help="runs of every configuration, alternated")
    p.add_argument("--steps", type=int, default=4, help="steps per run (the first is warm-up)")
    p.add_argument("--env", default="math/arithmetic-v0")
    p.add_argument("--env-kwargs", default='{"task": "add2", "answer": "loose"}')
    p.add_argument("--prompts", type=int, default=4, help="prompts per step")
    p.add_argument("--group", type=int, default=4, help="completions per prompt")
    p.add_argument("--completion-length", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--beta", type=float, default=0.04, help="ours' KL weight (> 0: a reference)")
    p.add_argument("--threads", type=int, default=1, help="CPU threads of every configuration")
    p.add_argument(
        "--trl-ppo-dir",
        default=str(Path.home() / ".cache" / "grpo-kit" / f"trl-{TRL_PPO_VERSION}"),
        help=f"folder with TRL {TRL_PPO_VERSION} (installed there on first use)",
    )
    p.add_argument("--out", default="", help="also write the raw measures as JSON here")
    p.add_argument("--quick", action="store_true", help="smoke: 2 steps, 2 x 2 rows, 8 tokens")
    p.add_argument("--child", default="", help=argparse.SUPPRESS)
    p.add_argument("--json", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.steps, args.prompts, args.group, args.completion_length, args.rounds = 2, 2, 2, 8, 1
    for name in ("rounds", "prompts", "group", "completion_length", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')}: {getattr(args, name)}; must be >= 1")
    if args.steps < 2:
        p.error(f"--steps: {args.steps}; must be >= 2 (the first step is warm-up, not counted)")
    if args.beta <= 0:
        p.error(f"--beta: {args.beta}; must be > 0 (PPO holds a reference; beta0 configs drop it)")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run every configuration ``--rounds`` times, alternating, and print the table."""
    args = parse_args(argv)
    if args.child:
        data = json.loads(args.child)
        child(data["config"], Workload(**data["workload"]), Path(data["trl_dir"]), Path(args.json))
        return 0
    from grpo_train.models.loading import resolve_model

    w = Workload(
        model=resolve_model(args.model),
        env_id=args.env,
        env_kwargs=json.loads(args.env_kwargs),
        prompts=args.prompts,
        group=args.group,
        completion_length=args.completion_length,
        learning_rate=args.lr,
        beta=args.beta,
        steps=args.steps,
        threads=args.threads,
    )
    trl_dir = Path(args.trl_ppo_dir)
    if any(c.startswith("trl-ppo") for c in args.configs):
        trl_dir = ensure_trl_ppo(trl_dir)
    load0 = os.getloadavg()[0]
    print(
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, {os.cpu_count()} CPUs, load "
        f"{load0:.1f}; {w.env_id} {w.env_kwargs}; {w.prompts} prompts x {w.group} completions, "
        f"<= {w.completion_length} tokens, lr {w.learning_rate:g}, {w.steps} steps (first not "
        f"counted), {w.threads} thread(s), {args.rounds} round(s)",
        flush=True,
    )
    runs: dict[str, list[Measure]] = {c: [] for c in args.configs}
    for round_ in range(args.rounds):
        # Alternate the order too, so that no configuration always runs first in a round.
        order = args.configs if round_ % 2 == 0 else args.configs[::-1]
        for config in order:
            m = run_config(config, w, trl_dir)
            runs[config].append(m)
            steps = ", ".join(f"{s:.1f}" for s in m.step_s)
            print(
                f"  round {round_ + 1} {config}: steps {steps} s; peak RSS {m.peak_rss_mb:.0f} MB;"
                f" load {m.load[0]:.1f}->{m.load[1]:.1f}" + (f"; {m.error}" if m.error else ""),
                flush=True,
            )
    rows = [summarize(c, runs[c]) for c in args.configs]
    print()
    print(table(rows))
    print(f"load average (1 min) before {load0:.1f}, after {os.getloadavg()[0]:.1f}")
    if args.out:
        Path(args.out).write_text(
            json.dumps({c: [asdict(m) for m in ms] for c, ms in runs.items()}, indent=1)
        )
    return 1 if any(r.error for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
