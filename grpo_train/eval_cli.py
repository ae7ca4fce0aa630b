"""``grpo eval``: evaluate a model on suites; ``grpo eval compare RUN_A RUN_B``: compare two runs.

Examples::

    grpo eval --model default --suite gsm8k --limit 100                 # greedy accuracy
    grpo eval --model ./ckpt --suite humaneval,mbpp --n 8 --k 1,4,8     # pass@k, T = 0.8
    grpo eval --suite my-math --suites_file suites.yaml --out runs/eval/a
    grpo eval compare runs/eval/a runs/eval/b --png delta.png

Why over 500 lines: the command's parser, its resolution of models, prompt formats, suites and
protocols, the run record and the run with its stop handling all share ``EvalArgs``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import re
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grpo_train.episodes.prompts import PromptFormat
from grpo_train.eval.passk import parse_ks
from grpo_train.eval.protocol_cli import ResolvedDecoding, add_protocol_arguments, apply_protocol
from grpo_train.eval.protocols import PROTOCOL_FILE

if TYPE_CHECKING:
    from grpo_train.eval.runner import EvalTask
    from grpo_train.eval.suites import Task
    from grpo_train.rollout.base import RolloutEngine, SamplingConfig
    from grpo_train.run.stop import StopRequest
    from sandbox.remote import RemoteSettings

logger = logging.getLogger(__name__)

#: Codex (Chen et al. 2021) sampled at T = 0.8 for pass@k with large k; our default when n > 1.
DEFAULT_SAMPLING_TEMPERATURE = 0.8
EVAL_LOG_FILE = "eval.log"
"""The run folder's log: every record of the command at its level, with times."""
CPU_TOKENS_PER_S = 150.0
"""vLLM's CPU build decoding SmolLM2-135M, all sequences together: 147-168 tokens/s in
benchmarks/README.md; a larger model is slower."""
CPU_TOKEN_WARNING = 1_000_000
"""Above this many tokens at most, a run on a CPU says what it may cost before starting."""
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
"""vLLM's GPU share in ``grpo eval`` (vLLM's own default, as ``grpo serve``): the evaluation has
the GPU to itself, unlike a training run's colocated engine (``vllm_memory_fraction``, 0.3 by
default, leaves the rest to the trainer). At 0.3 a 7B model in bfloat16 (15 GB of weights) left
no KV cache on a 24 or 40 GB GPU, and vLLM refused to start."""


def _has_cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def default_dtype() -> str:
    """Return the weights' dtype without ``--dtype``: ``auto_dtype`` of the GPU, float32 on a CPU.

    float32 everywhere put a 7B model's 30 GB of weights on a GPU (more than a 24 GB one holds,
    most of a 40 GB one's share) and decoded at half the speed of the bfloat16 that training
    generates and evaluates in (``dtype: auto``); a GPU without native bfloat16 and the CPU
    keep float32.
    """
    from grpo_train.models.loading import auto_dtype

    return auto_dtype("cuda" if _has_cuda() else "cpu")


@dataclass(frozen=True)
class EvalArgs:
    """Validated ``grpo eval`` arguments."""

    model: str | None
    suite: str
    suites_file: str | None
    n: int
    ks: tuple[int, ...] | None
    temperature: float
    top_p: float
    max_tokens: int
    seed: int | None
    limit: int | None
    out: str | None
    engine: str
    dtype: str
    max_model_len: int
    split: str
    batch_size: int
    env_kwargs: Mapping[str, Mapping[str, object]]
    progress: bool
    argv: tuple[str, ...] = ()
    chat_template: str | None = None
    """None: the run's setting (a checkpoint inside a run folder), else the tokenizer's."""
    chat_template_kwargs: Mapping[str, object] | None = None
    system_prompt: str | None = None
    prompt_template: str | None = None
    log_level: str = "info"
    """The command line as given (recorded in summary.json)."""
    decoding: ResolvedDecoding | None = None
    """The protocol, reasoning tags and --data_dir folders (None: built by hand, no protocol)."""
    sandbox: RemoteSettings | None = None
    """Remote sandbox services the code suites score on (``--sandbox_*``); None: the local one."""
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION
    """vLLM on a GPU: the share of the GPU's memory it takes (nothing else runs there)."""


def _eval_parser() -> argparse.ArgumentParser:
    from grpo_train.eval.suites import BUILTIN_SUITES

    suites = "; ".join(f"{s.name}: {', '.join(s.env_ids)}" for s in BUILTIN_SUITES.values())
    from grpo_envs.cli import ShortErrorParser

    p = ShortErrorParser(
        prog="grpo eval",
        usage="grpo eval [--model M] [--suite S,...] [--OPTION VALUE ...]; "
        "grpo eval compare RUN_A RUN_B",
        description="Evaluate a model on benchmark suites (`grpo eval compare A B` compares runs). "
        "Reported per suite: avg@n, the accuracy averaged over the n completions of each problem, "
        "with its standard error across problems (and the part of it due to sampling only n); "
        "pass@k, the unbiased estimator of Chen et al. 2021, for each k of --k (default 1, n and "
        "the powers of 2 between); maj@k, the majority vote over equivalent answers, for "
        "1 < k <= n (not for code, whose programs are not compared); and, for math, strict "
        "accuracy (only an <answer> tag, a \\boxed{} or '#### N' counts) beside flexible "
        "accuracy (the final stated answer is extracted).",
        epilog=f"Built-in suites: {suites}. Any env id `grpo train --env` accepts works too "
        "(registered, module:id, plugins, rg/<task>-v0; `grpo envs list`). "
        "A checkpoint inside a training run folder is prompted as that run trained it (chat "
        "template, kwargs, system prompt from its config.yaml) unless the prompt flags are given.",
        allow_abbrev=False,
    )
    p.add_argument(
        "--model",
        default=None,
        help="HF id, local folder, or a LoRA checkpoint folder (adapter: its base model is read "
        "from adapter_config.json); 'tiny': a tiny random model for trying a setup in seconds "
        "(default: SmolLM2-135M-Instruct)",
    )
    p.add_argument("--suite", default="gsm8k", help="comma-separated suite names or env ids")
    p.add_argument(
        "--suites_file",
        default=None,
        help="YAML file defining more suites: names mapped to env ids, or to {id, kwargs} "
        "entries, e.g. `mine: [{id: math/dataset-v0, kwargs: {path: data/q.jsonl, "
        "question: problem, answer: solution}}]` (a data file needs a question and an answer "
        "column, named by those kwargs; `grpo envs show math/dataset-v0` lists them all)",
    )
    p.add_argument(
        "--n", type=int, default=None, help="completions per prompt (default 1: greedy accuracy)"
    )
    p.add_argument("--k", default=None, help="pass@k values, e.g. 1,4,8 (each <= n)")
    p.add_argument(
        "--temperature",
        type=float,
        default=None,
        help=f"sampling temperature (default 0 for n=1, {DEFAULT_SAMPLING_TEMPERATURE} for n>1)",
    )
    p.add_argument("--top_p", type=float, default=None, help="nucleus sampling (default 1)")
    p.add_argument(
        "--max_tokens", type=int, default=None, help="max new tokens per completion (default 512)"
    )
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--limit", type=int, default=None, help="first N prompts of each environment")
    p.add_argument(
        "--out", default=None, help="run folder (default: eval_runs/<model>-<suite>-...)"
    )
    p.add_argument(
        "--engine",
        default="auto",
        choices=("auto", "vllm", "hf"),
        help="what generates: vllm (fast; its CPU build on a CPU), hf (transformers' generate, "
        "slow, no vLLM needed); auto: vllm where installed",
    )
    p.add_argument(
        "--dtype",
        default=None,
        help="weight dtype: float32, bfloat16, ... (default: bfloat16 on a GPU with native "
        "bfloat16, else float32)",
    )
    p.add_argument(
        "--gpu_memory_utilization",
        type=float,
        default=DEFAULT_GPU_MEMORY_UTILIZATION,
        help="vLLM on a GPU: the share of its memory vLLM takes (weights, KV cache)",
    )
    p.add_argument(
        "--max_model_len",
        type=int,
        default=None,
        help="vLLM context, prompt + completion (default 2048, or max_tokens + 2048 above 512)",
    )
    p.add_argument(
        "--split",
        default="test",
        help="the environments' split to evaluate (default test, the held-out one; "
        "`grpo envs show ID` lists an environment's splits)",
    )
    p.add_argument("--batch_size", type=int, default=64, help="prompts per generate call")
    p.add_argument(
        "--env_kwargs",
        default=None,
        help="JSON {env_id: {kwarg: value}} passed to grpo_envs.make",
    )
    p.add_argument("--no_progress", action="store_true", help="no progress bar")
    fmt = p.add_argument_group("prompt format (as `grpo train`; grpo_train/episodes/prompts.py)")
    fmt.add_argument(
        "--chat_template",
        default=None,
        help="a Jinja file or template text; 'plain' for the plain-text format (default: the "
        "tokenizer's)",
    )
    fmt.add_argument(
        "--chat_template_kwargs",
        default=None,
        help="JSON or key=value,... for the template, e.g. '{\"enable_thinking\": false}'",
    )
    fmt.add_argument("--system_prompt", default=None, help="system message before each prompt")
    fmt.add_argument(
        "--prompt_template",
        default=None,
        help="plain-text format for models without a chat template (default '{prompt}')",
    )
    p.add_argument(
        "--log_level",
        default="info",
        choices=("debug", "info", "warning", "error"),
        help="what the run folder's eval.log records (the console shows warnings and results; "
        "debug: everything, on the console too)",
    )
    add_protocol_arguments(p)
    from grpo_envs.code.backend import add_sandbox_arguments

    add_sandbox_arguments(p)
    return p


def parse_eval_args(argv: list[str]) -> EvalArgs:
    """Parse and validate ``grpo eval`` options; ``ValueError`` says what to fix."""
    ns = _eval_parser().parse_args(argv)
    decoding = apply_protocol(ns)  # fills --n, --top_p, --max_tokens... the user left out
    ns.n, ns.top_p, ns.max_tokens = decoding.n, decoding.top_p, decoding.max_tokens
    ns.temperature, ns.max_model_len = decoding.temperature, decoding.max_model_len
    if ns.n < 1:
        raise ValueError(f"--n must be >= 1, got {ns.n}")
    temperature = ns.temperature
    if temperature is None:
        temperature = 0.0 if ns.n == 1 else DEFAULT_SAMPLING_TEMPERATURE
    if temperature < 0:
        raise ValueError(f"--temperature must be >= 0, got {temperature}")
    if temperature == 0 and ns.n > 1:
        raise ValueError(
            f"--n {ns.n} with --temperature 0 samples the same greedy completion {ns.n} times; "
            f"set --temperature (e.g. {DEFAULT_SAMPLING_TEMPERATURE}) or use --n 1"
        )
    ks = parse_ks(ns.k) if ns.k else None
    most_n = ns.n  # a protocol's per-suite counts may exceed its default n
    if decoding.protocol is not None and "n" not in decoding.protocol.overridden:
        most_n = max([ns.n, *decoding.protocol.n_per_suite.values()])
    if ks and ks[-1] > most_n:
        raise ValueError(
            f"pass@{ks[-1]} needs at least {ks[-1]} samples per prompt: raise --n to >= {ks[-1]}"
        )
    if ns.max_tokens < 1:
        raise ValueError(f"--max_tokens must be >= 1, got {ns.max_tokens}")
    if ns.max_tokens >= ns.max_model_len:
        raise ValueError(
            f"--max_tokens {ns.max_tokens} leaves no room for the prompt in --max_model_len "
            f"{ns.max_model_len}; raise --max_model_len"
        )
    if ns.limit is not None and ns.limit < 1:
        raise ValueError(f"--limit must be >= 1, got {ns.limit}")
    if not 0 < ns.top_p <= 1:
        raise ValueError(f"--top_p must be in (0, 1], got {ns.top_p}")
    if not 0 < ns.gpu_memory_utilization <= 1:
        raise ValueError(
            f"--gpu_memory_utilization must be in (0, 1], got {ns.gpu_memory_utilization}"
        )
    env_kwargs: dict[str, dict[str, object]] = {}
    if ns.env_kwargs:
        try:
            raw = json.loads(ns.env_kwargs)
        except json.JSONDecodeError as err:
            raise ValueError(f"--env_kwargs is not valid JSON: {err}") from err
        if not isinstance(raw, dict) or not all(isinstance(v, dict) for v in raw.values()):
            raise ValueError("--env_kwargs must be a JSON object {env_id: {kwarg: value}}")
        env_kwargs = {str(k): dict(v) for k, v in raw.items()}
    template_kwargs = None
    if ns.chat_template_kwargs is not None:
        from grpo_train.config import parse_mapping

        template_kwargs = parse_mapping("--chat_template_kwargs", ns.chat_template_kwargs)
    if ns.prompt_template is not None and "{prompt}" not in ns.prompt_template:
        raise ValueError(f"--prompt_template {ns.prompt_template!r} has no {{prompt}} placeholder")
    from grpo_envs.code.backend import sandbox_settings_from

    sandbox = sandbox_settings_from(ns)  # ValueError names the --sandbox_* flag to fix
    return EvalArgs(
        model=ns.model,
        suite=ns.suite,
        suites_file=ns.suites_file,
        n=ns.n,
        ks=ks,
        temperature=temperature,
        top_p=ns.top_p,
        max_tokens=ns.max_tokens,
        seed=ns.seed,
        limit=ns.limit,
        out=ns.out,
        engine=ns.engine,
        dtype=ns.dtype or default_dtype(),
        max_model_len=ns.max_model_len,
        split=ns.split,
        batch_size=ns.batch_size,
        env_kwargs=env_kwargs,
        progress=not ns.no_progress,
        argv=tuple(argv),
        chat_template=ns.chat_template,
        chat_template_kwargs=template_kwargs,
        system_prompt=ns.system_prompt,
        prompt_template=ns.prompt_template,
        log_level=ns.log_level,
        decoding=decoding,
        sandbox=sandbox,
        gpu_memory_utilization=ns.gpu_memory_utilization,
    )


def model_label(model: str) -> str:
    """Name a model for a folder: the whole checkpoint path, not just its last part.

    ``runs/a/checkpoints/step-000010/model`` and ``.../step-000020/model`` must not share a
    folder; a local path gets its last meaningful parts plus a short hash of the full path (two
    runs named alike stay apart), a hub id its own name.

    >>> model_label("Qwen/Qwen2.5-0.5B-Instruct")
    'Qwen_Qwen2.5-0.5B-Instruct'
    """
    path = Path(model.rstrip("/")).expanduser()
    if not path.exists():
        return model.replace("/", "_")
    full = path.resolve()
    parts = [p for p in full.parts[-4:] if p not in ("model", "checkpoints", "/")]
    digest = hashlib.sha256(str(full).encode()).hexdigest()[:8]
    return "-".join([*parts[-2:], digest])


def default_out_dir(args: EvalArgs, model_path: str) -> Path:
    """Name the run folder after the model and settings, so rerunning a command resumes it."""
    model = model_label(args.model) if args.model else Path(model_path.rstrip("/")).name
    parts = [
        model,
        args.suite,
        args.split,
        f"n{args.n}",
        f"t{args.temperature:g}",
        f"max{args.max_tokens}",
    ]
    if args.decoding is not None and args.decoding.protocol is not None:
        parts.append(f"protocol_{args.decoding.protocol.name}")
    name = "-".join(re.sub(r"[^A-Za-z0-9_.]+", "_", p) for p in parts)
    return Path("eval_runs") / name


def is_adapter_folder(model: str) -> bool:
    """Return whether ``--model`` is a LoRA checkpoint folder (adapter files, no config.json)."""
    folder = Path(model).expanduser()
    return (folder / "adapter_config.json").is_file() and not (folder / "config.json").is_file()


def training_run_config(model: str | None) -> Path | None:
    """Return the config.yaml of the training run a checkpoint folder belongs to, if any.

    A checkpoint is ``RUN/checkpoints/step-N/model`` (or a run's ``merged/`` folder).
    """
    if not model:
        return None
    path = Path(model).expanduser()
    if not path.is_dir():
        return None
    for parent in list(path.resolve().parents)[:4]:
        candidate = parent / "config.yaml"
        if candidate.is_file():
            return candidate
    return None


def resolve_prompt_format(args: EvalArgs) -> PromptFormat:
    """Return the prompt format: the flags, else the training run's (a checkpoint), else plain.

    Evaluating a checkpoint with the prompt it was trained on is what a user means: a run with a
    system prompt or ``enable_thinking: false`` is scored on that prompt unless told otherwise.
    """
    import yaml

    from grpo_train.config import TrainConfig
    from grpo_train.setup.settings import prompt_format_for

    base = PromptFormat()
    run_config = training_run_config(args.model)
    if run_config is not None:
        try:
            raw = yaml.safe_load(run_config.read_text()) or {}
            data = raw.get("data", {}) if isinstance(raw, dict) else {}
            keys = ("chat_template", "chat_template_kwargs", "system_prompt", "prompt_template")
            flat = {k: data[k] for k in keys if isinstance(data, dict) and k in data}
            base = prompt_format_for(TrainConfig.from_flat(flat).data)
            if flat:
                logger.info("prompt format of the training run (%s)", run_config)
        except (OSError, ValueError, yaml.YAMLError) as err:
            logger.warning("cannot read the prompt format of %s: %s", run_config, err)
    return PromptFormat(
        chat_template=base.chat_template if args.chat_template is None else args.chat_template,
        chat_template_kwargs=(
            base.chat_template_kwargs
            if args.chat_template_kwargs is None
            else args.chat_template_kwargs
        ),
        system_prompt=base.system_prompt if args.system_prompt is None else args.system_prompt,
        prompt_template=(
            base.prompt_template if args.prompt_template is None else args.prompt_template
        ),
    )


def _eval_tasks(args: EvalArgs) -> tuple[list[Task], list[EvalTask]]:
    """Resolve the suites into tasks and build their environments, data loaded.

    The data loads before the engine starts: a bad path fails in seconds.
    """
    import grpo_envs
    from grpo_train.eval.runner import EvalTask
    from grpo_train.eval.suites import load_suites_file, resolve_tasks

    user_suites = load_suites_file(args.suites_file) if args.suites_file else None
    registered = [getattr(spec, "id", spec) for spec in grpo_envs.list_envs()]
    tasks = resolve_tasks(
        args.suite, user_suites=user_suites, registered_env_ids=map(str, registered)
    )
    unknown_kw = set(args.env_kwargs) - {t.env_id for t in tasks}
    if unknown_kw:
        raise ValueError(f"--env_kwargs names env ids that are not evaluated: {sorted(unknown_kw)}")
    from grpo_train.eval.protocol_cli import samples_per_task, task_overrides

    decoding = args.decoding
    data = task_overrides(tasks, decoding.data_dirs if decoding else {})
    counts = samples_per_task(tasks, decoding.protocol if decoding else None)
    envs = [
        EvalTask(
            t.label,
            grpo_envs.make(
                t.env_id,
                **{**t.kwargs, **data.get(t.env_id, {}), **args.env_kwargs.get(t.env_id, {})},
            ),
            n=counts[t.label],
            thinking=decoding.thinking if decoding else None,
        )
        for t in tasks
    ]
    for task in envs:
        task.env.dataset(args.split)
    from grpo_envs.code.backend import check_sandbox_backend, use_remote_sandbox

    use_remote_sandbox(args.sandbox)
    check_sandbox_backend([task.env for task in envs], args.split)
    return tasks, envs


@dataclass(frozen=True)
class TaskBudget:
    """The most one task can generate: problems x samples x tokens."""

    label: str
    problems: int
    samples: int
    max_tokens: int

    @property
    def tokens(self) -> int:
        """The most new tokens the task can generate."""
        return self.problems * self.samples * self.max_tokens


def budget_note(budgets: Sequence[TaskBudget], tokens_per_s: float = CPU_TOKENS_PER_S) -> str:
    """Say what an evaluation can cost at most, per task and in all, and how to make it smaller.

    ``tokens_per_s``: a rough decoding rate (tokens a second, all sequences together).

    >>> print(budget_note([TaskBudget("aime24", 30, 64, 32768), TaskBudget("amc23", 40, 32, 32768)],
    ...                   tokens_per_s=100))  # doctest: +NORMALIZE_WHITESPACE
    this evaluation generates up to 104,857,600 tokens (aime24: 30 problems x 64 samples x 32,768
    tokens; amc23: 40 x 32 x 32,768): about 291 hours at 100 tokens/s (a 135M model on a CPU;
    larger models are slower); make it smaller with --limit (problems), --n (samples) and
    --max_tokens
    """
    total = sum(b.tokens for b in budgets)
    parts = [
        f"{b.label}: {b.problems} problems x {b.samples} samples x {b.max_tokens:,} tokens"
        if i == 0
        else f"{b.label}: {b.problems} x {b.samples} x {b.max_tokens:,}"
        for i, b in enumerate(budgets)
    ]
    hours = total / tokens_per_s / 3600
    return (
        f"this evaluation generates up to {total:,} tokens ({'; '.join(parts)}): about "
        f"{hours:,.0f} hours at {tokens_per_s:g} tokens/s (a 135M model on a CPU; larger models "
        "are slower); make it smaller with --limit (problems), --n (samples) and --max_tokens"
    )


def _eval_model_path(args: EvalArgs) -> str:
    """Return the model folder to evaluate: a LoRA adapter is merged into its base (cached)."""
    from grpo_train.models.loading import resolve_model

    if not (args.model and is_adapter_folder(args.model)):
        return resolve_model(args.model)
    # A LoRA run's checkpoint holds only the adapter: merge it into the base model it names
    # (once, cached) and evaluate that like any full checkpoint.
    from grpo_train.learner.lora import adapter_base_model, merged_checkpoint
    from grpo_train.models.loading import cache_dir

    logger.info(
        "%s is a LoRA adapter on %s: merging it for evaluation",
        args.model,
        adapter_base_model(args.model),
    )
    return str(merged_checkpoint(args.model, cache_dir() / "merged"))


def run_eval(args: EvalArgs) -> int:
    """Build the engine and environments, evaluate, print the table."""
    from grpo_train.rollout.base import SamplingConfig

    tasks, envs = _eval_tasks(args)
    budgets = [
        TaskBudget(
            t.label,
            min(len(t.env.dataset(args.split)), args.limit or 10**12),
            t.n or args.n,
            args.max_tokens,
        )
        for t in envs
    ]
    if sum(b.tokens for b in budgets) > CPU_TOKEN_WARNING and not _has_cuda():
        print(f"grpo eval: {budget_note(budgets)}", file=sys.stderr, flush=True)
    prompt_format = resolve_prompt_format(args)
    prompt_format.template_text()  # a missing template file fails before the model loads
    model_path = _eval_model_path(args)
    # torch and transformers load only now (tens of seconds on a busy machine): input errors
    # above are reported without waiting for them.
    from transformers import AutoTokenizer

    from grpo_train.run.stop import StopRequest

    out = Path(args.out) if args.out else default_out_dir(args, model_path)
    from grpo_train.run.console import attach_run_log

    attach_run_log(out, EVAL_LOG_FILE)
    sampling = SamplingConfig(
        n=args.n,
        max_new_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        seed=args.seed,
    )
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    record = _run_record(args, tasks, envs, out, tokenizer, prompt_format)
    stop = StopRequest()
    with stop.installed():  # Ctrl-C / SIGTERM: finish the batch, keep what is done, stop
        return _generate(
            args, tasks, envs, model_path, out, sampling, tokenizer, prompt_format, record, stop
        )


def engine_options(args: EvalArgs) -> dict[str, Any]:
    """Return the engine's own options: vLLM's GPU share (it ignores it on a CPU); none for hf.

    Without it vLLM took ``VLLMEngine``'s default, the share a training run leaves its
    colocated engine, though an evaluation has the GPU to itself.
    """
    from grpo_train.rollout import resolve_engine_name

    if resolve_engine_name(args.engine) != "vllm":
        return {}
    return {"gpu_memory_utilization": args.gpu_memory_utilization}


def _generate(
    args: EvalArgs,
    tasks: list[Task],
    envs: list[EvalTask],
    model_path: str,
    out: Path,
    sampling: SamplingConfig,
    tokenizer: Any,
    prompt_format: PromptFormat,
    record: Mapping[str, object],
    stop: StopRequest,
) -> int:
    """Run the evaluation with the stop request installed; print the table or how to resume."""
    import torch

    from grpo_train.episodes.driver import STEP_WORKERS, EpisodeSettings
    from grpo_train.eval.runner import EvalStopped, evaluate
    from grpo_train.rollout import make_engine
    from grpo_train.rollout.base import EngineDied
    from grpo_train.run.memory_advice import Change, failed_allocation
    from grpo_train.run.stop import pause_point

    again = shlex.join(["grpo", "eval", *args.argv])
    pause_point("eval engine start")
    engine: RolloutEngine | None = None
    try:
        if stop.signum is None:
            engine = make_engine(
                args.engine,
                model_path,
                dtype=args.dtype,
                max_model_len=args.max_model_len,
                **engine_options(args),
            )
        if stop.signum is not None:
            raise EvalStopped(0, 0)
        assert engine is not None
        summary = evaluate(
            engine,
            tokenizer,
            envs,
            split=args.split,
            limit=args.limit,
            sampling=sampling,
            ks=args.ks,
            out_dir=out,
            batch_size=args.batch_size,
            progress=args.progress,
            model=args.model or model_path,
            prompt_format=prompt_format,
            metadata={
                "command": ["grpo", "eval", *args.argv],
                "env_kwargs": {k: dict(v) for k, v in args.env_kwargs.items()},
                "suites": [{"label": t.label, "suite": t.suite, "env_id": t.env_id} for t in tasks],
                "protocol": record["protocol"],
                "run_record": PROTOCOL_FILE,
            },
            stop_requested=lambda: stop.signum is not None,
            # Multi-turn environments: each turn gets --max_tokens; an episode runs until the
            # environment or its budgets end it, or the history fills --max_model_len.
            episodes=EpisodeSettings(
                args.max_model_len, workers=STEP_WORKERS, max_sequence_tokens=args.max_model_len
            ),
        )
    except EvalStopped as stopped:
        kept = out / "samples.jsonl"
        print(
            f"grpo eval: interrupted by {stop.name}: {stopped}"
            + (f"; every finished sample is in {kept}" if kept.exists() else "")
            + f"; resume with `{again}`",
            file=sys.stderr,
        )
        return stop.exit_code
    except EngineDied as err:
        print(
            f"grpo eval: error: {err}; finished samples are kept; rerun `{again}`", file=sys.stderr
        )
        return 1
    except torch.OutOfMemoryError as err:
        # The hf engine already halved its rows down to one sequence: a completion this long
        # does not fit beside the model.
        tokens = args.max_tokens
        lower = [Change("max_tokens", str(max(1, tokens // 2)), str(tokens))]
        if args.dtype == "float32":
            lower.append(Change("dtype", "bfloat16", "float32"))
        print(
            f"grpo eval: error: out of GPU memory during generation ({failed_allocation(err)}); "
            f"settings that lower it: {', '.join(map(str, lower))}; finished samples are kept; "
            f"rerun `{again}` with them",
            file=sys.stderr,
        )
        return 1
    except Exception:
        if stop.signum is None:
            raise
        # The engine's start failed because its processes got the signal too.
        print(f"grpo eval: interrupted by {stop.name}; resume with `{again}`", file=sys.stderr)
        return stop.exit_code
    finally:
        if engine is not None:
            engine.close()
    table = summary.table()
    label = _protocol_label(record)
    (out / "summary.md").write_text(
        f"model: {args.model or model_path}\nprotocol: {label}\n\n{table}\n"
    )
    print(
        f"\nmodel {args.model or model_path}  split {args.split}  n={args.n}  "
        f"T={args.temperature:g}  max_tokens={args.max_tokens}  ({summary.num_generated} "
        f"generated, {summary.num_reused} resumed, {summary.elapsed_s:.1f} s)\nprotocol: {label}\n"
    )
    print(table)
    print(f"\nwrote {out}/samples.jsonl, {out}/summary.json")
    return 0


def _run_record(
    args: EvalArgs,
    tasks: list[Task],
    envs: list[EvalTask],
    out: Path,
    tokenizer: object,
    prompt_format: PromptFormat,
) -> dict[str, object]:
    """Write the run's protocol.json before generating (a folder of another protocol: refused)."""
    from grpo_train.eval.protocol_cli import build_run_record, write_run_record
    from grpo_train.eval.runner import template_info

    decoding: dict[str, object] = {
        "n": args.n,
        "temperature": args.temperature,
        "top_p": args.top_p,
        "max_tokens": args.max_tokens,
        "seed": args.seed,
        "thinking": None,
    }
    if args.decoding is not None and args.decoding.thinking is not None:
        decoding["thinking"] = {
            "open": args.decoding.thinking.open,
            "close": args.decoding.thinking.close,
        }
    record = build_run_record(
        protocol=args.decoding.protocol if args.decoding else None,
        decoding=decoding,
        template=template_info(tokenizer, prompt_format),
        max_prompt_tokens=None,
        max_model_len=args.max_model_len,
        split=args.split,
        limit=args.limit,
        tasks=tasks,
        eval_tasks=envs,
    )
    write_run_record(out, record)
    return record


def _protocol_label(record: Mapping[str, object]) -> str:
    proto = record.get("protocol")
    if isinstance(proto, Mapping):
        return str(proto.get("label") or proto.get("name"))
    return "custom"


def run_compare(argv: list[str]) -> int:
    """``grpo eval compare RUN_A RUN_B``."""
    from grpo_envs.cli import ShortErrorParser
    from grpo_train.eval.compare import (
        compare_notes,
        compare_rates,
        compare_table,
        load_run,
        plot_deltas,
    )

    p = ShortErrorParser(
        prog="grpo eval compare",
        description="Per-suite deltas B - A with a test and a confidence interval. Runs that "
        "scored the same problems are compared per problem (exact McNemar test with one "
        "completion per problem, sign-flip permutation test with several); runs with no shared "
        "problems with Newcombe's interval for independent proportions.",
        allow_abbrev=False,
    )
    p.add_argument("run_a")
    p.add_argument("run_b")
    p.add_argument("--png", default="eval_compare.png", help="bar chart path")
    p.add_argument(
        "--confidence", type=float, default=0.95, help="interval level; the test's alpha is 1 - it"
    )
    p.add_argument(
        "--resamples",
        type=int,
        default=10_000,
        help="random sign patterns or bootstrap resamples, where exact enumeration is too large",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of those random resamples")
    p.add_argument(
        "--allow_mismatch",
        action="store_true",
        help="compare runs made under different protocols, data or prompts (printed as warnings)",
    )
    ns = p.parse_args(argv)
    from grpo_train.eval.compare import metric_table
    from grpo_train.eval.protocol_cli import comparability_report
    from grpo_train.eval.protocols import Severity, read_record

    for tag, run in (("A", ns.run_a), ("B", ns.run_b)):
        # The label names every field the run overrode from its protocol, per suite.
        rec = read_record(run)
        print(f"{tag}: {run}  protocol: {_protocol_label(rec) if rec else 'not recorded'}")
    differences, note = comparability_report(ns.run_a, ns.run_b)
    if note:
        print(note)
    blocking = [d for d in differences if d.severity is Severity.INCOMPARABLE]
    for d in differences:
        print(d.describe())
    if blocking and not ns.allow_mismatch:
        raise ValueError(
            f"the runs are not comparable ({len(blocking)} difference(s) above); rerun one under "
            "the other's protocol, or pass --allow_mismatch to compare anyway"
        )
    run_a, run_b = load_run(ns.run_a), load_run(ns.run_b)
    rows = compare_rates(
        run_a, run_b, confidence=ns.confidence, resamples=ns.resamples, seed=ns.seed
    )
    only = sorted(set(run_a) ^ set(run_b))
    if only:
        print(f"(tasks in only one run, not compared: {', '.join(only)})")
    print(compare_table(rows, Path(ns.run_a).name, Path(ns.run_b).name))
    print("")
    for note in compare_notes(rows):
        print(note)
    metrics = metric_table(ns.run_a, ns.run_b)
    if metrics:
        print("\n" + metrics)
    png = plot_deltas(rows, ns.png, title=f"{Path(ns.run_b).name} - {Path(ns.run_a).name}")
    print(f"wrote {png}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``grpo eval``; returns the exit status (2 on bad input)."""
    args = list(sys.argv[1:] if argv is None else argv)
    from grpo_envs.registration import RegistryError
    from grpo_envs.types import DataUnavailableError
    from grpo_train.models.loading import ModelNotAvailableError
    from grpo_train.run.console import setup_logging

    try:
        if args and args[0] == "compare":
            setup_logging("info")
            return run_compare(args[1:])
        parsed = parse_eval_args(args)
        # As grpo train: the console keeps warnings and the results; every record, with its
        # time, goes to the run folder's eval.log.
        setup_logging(parsed.log_level, details_to_file=True)
        return run_eval(parsed)
    except (
        ValueError,
        FileNotFoundError,
        RegistryError,
        ModelNotAvailableError,
        DataUnavailableError,
    ) as err:
        # Bad input (unknown env, missing model or data, settings that conflict): one line that
        # says what to fix, not a traceback.
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        print(f"grpo eval: error: {message}", file=sys.stderr)
        return 2
