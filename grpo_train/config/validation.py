"""Checking a configuration: every problem found at once, each with the field and its fix.

``TrainConfig`` runs ``validate`` when it is built; a non-empty list becomes one ``ConfigError``
(``problems_text``). ``algorithm_notes`` is advice on valid but probably unintended settings,
logged at start.
"""

from __future__ import annotations

import re
from typing import Protocol

from grpo_train.algorithm.choices import Estimator, ImportanceLevel, ScaleRewards
from grpo_train.config.sections import (
    AlgorithmConfig,
    DataConfig,
    OptimConfig,
    PolicyConfig,
    RolloutConfig,
    RunConfig,
    SandboxConfig,
)


class Sections(Protocol):
    """The seven sections of a ``TrainConfig``, which the checks read.

    ``loading`` builds the ``TrainConfig`` and calls these checks, so they name its shape rather
    than import it.
    """

    @property
    def policy(self) -> PolicyConfig:
        """The model and how it is loaded."""
        ...

    @property
    def data(self) -> DataConfig:
        """Environments and prompts."""
        ...

    @property
    def rollout(self) -> RolloutConfig:
        """Generation."""
        ...

    @property
    def algorithm(self) -> AlgorithmConfig:
        """The GRPO objective and advantages."""
        ...

    @property
    def optim(self) -> OptimConfig:
        """The optimizer and the update."""
        ...

    @property
    def run(self) -> RunConfig:
        """The run folder, logging and checkpoints."""
        ...

    @property
    def sandbox(self) -> SandboxConfig:
        """Where the code environments run programs."""
        ...


class ConfigError(ValueError):
    """Invalid configuration; the message names each bad field and how to fix it."""


def problems_text(problems: list[str]) -> str:
    """One problem: one line; several: one per line under a heading."""
    if len(problems) == 1:
        return problems[0]
    return "invalid configuration:\n  " + "\n  ".join(problems)


def validate(cfg: Sections) -> list[str]:
    """List every problem with ``cfg`` as 'field: what is wrong; how to fix it'."""
    return [
        *_data_problems(cfg.data),
        *_rollout_problems(cfg.rollout),
        *_algorithm_problems(cfg.algorithm),
        *_optim_problems(cfg.optim),
        *_policy_problems(cfg.policy),
        *_run_problems(cfg.run),
        *_sandbox_problems(cfg.sandbox),
    ]


class _Problems(list[str]):
    """The problems found so far; ``need(ok, message)`` adds ``message`` when ``ok`` is False."""

    def need(self, ok: bool, message: str) -> None:
        """Record ``message`` unless ``ok``."""
        if not ok:
            self.append(message)


def _data_problems(d: DataConfig) -> list[str]:
    """List the problems of the ``data`` settings."""
    p = _Problems()
    p.need(bool(d.env), "env: no environment given; pass --env ID (see `grpo envs list`)")
    p.need(
        0 < d.curriculum_threshold <= 1,
        f"curriculum_threshold: {d.curriculum_threshold}; a training accuracy in (0, 1], e.g. 0.6",
    )
    p.need(d.curriculum_window >= 1, f"curriculum_window: {d.curriculum_window}; must be >= 1")
    p.need(d.filter_retry_after >= 1, f"filter_retry_after: {d.filter_retry_after}; must be >= 1")
    for e in d.env:
        p.need(bool(e.id), "env: an entry has an empty id")
        p.need(e.weight > 0, f"env: weight of {e.id} is {e.weight}; weights must be > 0")
    p.need(d.eval_size >= 0, f"eval_size: {d.eval_size} < 0; use 0 to disable evaluation")
    p.need(
        d.eval_suite_samples >= 1,
        f"eval_suite_samples: {d.eval_suite_samples}; must be >= 1 (1 is greedy)",
    )
    p.need(d.max_prompt_length >= 1, f"max_prompt_length: {d.max_prompt_length}; must be >= 1")
    p.need(
        "{prompt}" in d.prompt_template,
        f"prompt_template: {d.prompt_template!r} has no {{prompt}}; e.g. 'Q: {{prompt}}\\nA:'",
    )
    return p


def _rollout_problems(r: RolloutConfig) -> list[str]:
    """List the problems of the ``rollout`` settings."""
    p = _Problems()
    p.need(
        r.num_generations >= 2,
        f"num_generations: {r.num_generations}; group-relative advantages need at least 2 "
        "completions per prompt (8 is typical)",
    )
    p.need(r.prompts_per_step >= 1, f"prompts_per_step: {r.prompts_per_step}; must be >= 1")
    p.need(
        r.hf_max_batch_size >= 1,
        f"hf_max_batch_size: {r.hf_max_batch_size}; must be >= 1 (sequences decoded together)",
    )
    p.need(
        r.max_completion_length >= 1,
        f"max_completion_length: {r.max_completion_length}; must be >= 1",
    )
    p.need(
        r.max_turn_tokens >= 0,
        f"max_turn_tokens: {r.max_turn_tokens}; must be >= 0 (0: max_completion_length)",
    )
    p.need(r.temperature > 0, f"temperature: {r.temperature}; training samples need > 0 (try 1.0)")
    p.need(0 < r.top_p <= 1, f"top_p: {r.top_p}; must be in (0, 1]")
    p.need(
        0 < r.vllm_memory_fraction < 1,
        f"vllm_memory_fraction: {r.vllm_memory_fraction}; must be in (0, 1)",
    )
    p.need(
        r.vllm_cpu_kv_cache_gib > 0,
        f"vllm_cpu_kv_cache_gib: {r.vllm_cpu_kv_cache_gib}; must be > 0",
    )
    p.extend(_server_problems(r))
    p.need(r.max_staleness >= 0, f"max_staleness: {r.max_staleness}; must be >= 0 (0: synchronous)")
    if r.async_generation and r.max_staleness > 0:
        p.need(
            not r.vllm_sleep_mode,
            "async_generation: vllm_sleep_mode puts the engine to sleep during the update, when "
            "it generates the next batch; drop --vllm_sleep_mode or --async_generation",
        )
    p.extend(_tensor_parallel_problems(r))
    return p


def _tensor_parallel_problems(r: RolloutConfig) -> list[str]:
    """List the problems of ``vllm_tensor_parallel_size`` (the rank count is checked at start)."""
    p = _Problems()
    tp = r.vllm_tensor_parallel_size
    if tp == 1:
        return p
    if tp < 1:
        p.append(f"vllm_tensor_parallel_size: {tp}; must be >= 1 (1 = one whole engine per rank)")
    elif r.vllm_mode == "server":
        p.append(
            f"vllm_tensor_parallel_size: {tp} with vllm_mode server; the servers shard their "
            f"engines themselves: start them with `grpo serve --tensor_parallel_size {tp}` and "
            "drop it here"
        )
    elif r.engine == "hf":
        p.append(
            f"vllm_tensor_parallel_size: {tp} with engine hf; tensor parallelism is vLLM's: "
            "use --engine vllm, or set vllm_tensor_parallel_size to 1"
        )
    return p


def _server_problems(r: RolloutConfig) -> list[str]:
    """List the problems of the ``vllm_mode: server`` settings."""
    from grpo_train.rollout.server_address import parse_server_urls

    p = _Problems()
    p.need(
        r.vllm_mode in ("colocate", "server"),
        f"vllm_mode: {r.vllm_mode!r}; one of colocate, server",
    )
    if r.vllm_mode != "server":
        p.need(
            not r.vllm_server_urls,
            f"vllm_server_urls: {r.vllm_server_urls!r} given with vllm_mode colocate; "
            "add --vllm_mode server to use those servers, or drop the addresses",
        )
        return p
    p.need(
        r.engine != "hf",
        "engine: hf cannot run in vllm_mode server; use --engine vllm (or auto)",
    )
    if not r.vllm_server_urls:
        p.append(
            "vllm_server_urls: empty with vllm_mode server; start `grpo serve --model M` and "
            "pass its address, e.g. --vllm_server_urls http://localhost:8000"
        )
    else:
        try:
            parse_server_urls(r.vllm_server_urls)
        except ValueError as err:
            p.append(f"vllm_server_urls: {err}; e.g. http://gen1:8000,http://gen1:8001")
    p.need(
        r.vllm_server_timeout_s > 0,
        f"vllm_server_timeout_s: {r.vllm_server_timeout_s}; must be > 0 (seconds, e.g. 600)",
    )
    p.need(
        r.vllm_sync_timeout_s > 0,
        f"vllm_sync_timeout_s: {r.vllm_sync_timeout_s}; must be > 0 (seconds, e.g. 120)",
    )
    p.need(
        0 < r.vllm_sync_bucket_mb <= 16384,
        f"vllm_sync_bucket_mb: {r.vllm_sync_bucket_mb}; must be in (0, 16384] MiB (e.g. 256: "
        "larger buckets mean fewer collectives and more memory beside vLLM's share)",
    )
    return p


def _algorithm_problems(a: AlgorithmConfig) -> list[str]:
    """List the problems of the ``algorithm`` settings."""
    p = _Problems()
    p.need(a.mu >= 1, f"mu: {a.mu}; must be >= 1 (1 = one update per batch)")
    p.need(a.beta >= 0, f"beta: {a.beta}; must be >= 0 (0 disables the KL term)")
    p.need(
        0 <= a.epsilon_low < 1, f"epsilon_low: {a.epsilon_low}; must be in [0, 1) (0.2 is usual)"
    )
    p.need(a.epsilon_high >= 0, f"epsilon_high: {a.epsilon_high}; must be >= 0 (0.28 for DAPO)")
    p.need(
        0 < a.ema_alpha < 1,
        f"ema_alpha: {a.ema_alpha}; must be in (0, 1), the old baseline's weight per update "
        "(0.9-0.99 is useful, 0.95 the default)",
    )
    ema = a.advantage_estimator is Estimator.EMA
    p.need(
        not (ema and a.scale_rewards is ScaleRewards.GROUP),
        "scale_rewards: 'group' divides by each group's reward std, which is 0 for the "
        "equal-reward groups advantage_estimator=ema learns from; use --scale_rewards batch "
        "(or none)",
    )
    p.need(
        not (ema and a.dynamic_sampling == "on"),
        "dynamic_sampling: 'on' drops the equal-reward groups that advantage_estimator=ema "
        "learns from; use --dynamic_sampling off (auto stays off with ema)",
    )
    p.need(a.is_cap >= 1, f"is_cap: {a.is_cap}; must be >= 1 (TRL uses 3.0)")
    p.need(
        a.dynamic_sampling_rounds >= 0,
        f"dynamic_sampling_rounds: {a.dynamic_sampling_rounds}; must be >= 0",
    )
    return p


def _optim_problems(o: OptimConfig) -> list[str]:
    """List the problems of the ``optim`` settings."""
    p = _Problems()
    p.need(o.learning_rate > 0, f"learning_rate: {o.learning_rate}; must be > 0 (1e-6 is typical)")
    p.need(
        o.learning_rate < 1, f"learning_rate: {o.learning_rate} is far too large (1e-6 is typical)"
    )
    p.need(o.warmup_steps >= 0, f"warmup_steps: {o.warmup_steps}; must be >= 0")
    p.need(o.max_grad_norm >= 0, f"max_grad_norm: {o.max_grad_norm}; must be >= 0 (0 disables)")
    p.need(o.micro_batch_tokens >= 16, f"micro_batch_tokens: {o.micro_batch_tokens}; must be >= 16")
    p.need(
        o.fused_head_above_mib >= 0,
        f"fused_head_above_mib: {o.fused_head_above_mib}; must be >= 0",
    )
    p.need(
        0 <= o.adam_beta1 < 1 and 0 <= o.adam_beta2 < 1, "adam_beta1/adam_beta2: must be in [0, 1)"
    )
    return p


def _policy_problems(policy: PolicyConfig) -> list[str]:
    """List the problems of the ``policy`` settings."""
    p = _Problems()
    p.need(policy.lora_r >= 0, f"lora_r: {policy.lora_r}; must be >= 0 (0 disables LoRA)")
    p.need(policy.lora_alpha > 0, f"lora_alpha: {policy.lora_alpha}; must be > 0 (try 2 * r)")
    p.need(
        0 <= policy.lora_dropout < 1,
        f"lora_dropout: {policy.lora_dropout}; must be in [0, 1)",
    )
    p.need(bool(policy.target_modules.strip()), "target_modules: empty; use all-linear")
    p.need(
        policy.lora_r > 0 or not (policy.use_qlora or policy.save_merged),
        "use_qlora/save_merged: need LoRA; set lora_r (e.g. 16)",
    )
    p.need(policy.num_threads >= 0, f"num_threads: {policy.num_threads}; must be >= 0")
    p.need(
        is_attention_name(policy.attn_implementation),
        f"attn_implementation: {policy.attn_implementation!r} is not an attention transformers "
        f"runs; use one of {', '.join(ATTENTION_NAMES)} or a hub kernel org/repo",
    )
    return p


#: The ``attn_implementation`` names transformers takes (besides hub kernels, ``org/repo``).
ATTENTION_NAMES = (
    "auto", "eager", "sdpa", "flex_attention", "flash_attention_2", "flash_attention_3",
    "flash_attention_4",
)  # fmt: skip

#: A hub kernel as transformers names one (``hub_kernels.is_kernel``): org/repo[@rev][:function].
_HUB_KERNEL = re.compile(r"[^/:@\s]+/[^/:@\s]+(?:@[^/:@\s]+)?(?::[^/:@\s]+)?")


def is_attention_name(name: str) -> bool:
    """Whether ``attn_implementation`` may be ``name``: a built-in attention or a hub kernel.

    >>> [is_attention_name(n) for n in ("sdpa", "kernels-community/flash-attn2", "flash", "a/b/c")]
    [True, True, False, False]
    """
    return name in ATTENTION_NAMES or _HUB_KERNEL.fullmatch(name) is not None


def _run_problems(run: RunConfig) -> list[str]:
    """List the problems of the ``run`` settings."""
    p = _Problems()
    p.need(run.max_steps >= 0, f"max_steps: {run.max_steps}; must be >= 0")
    p.need(run.save_every >= 0, f"save_every: {run.save_every}; must be >= 0 (0: only at the end)")
    p.need(run.keep_last >= 1, f"keep_last: {run.keep_last}; keep at least 1 checkpoint")
    p.need(run.eval_every >= 0, f"eval_every: {run.eval_every}; must be >= 0")
    p.need(run.log_every_samples >= 0, f"log_every_samples: {run.log_every_samples}; must be >= 0")
    p.need(run.max_bad_steps >= 1, f"max_bad_steps: {run.max_bad_steps}; must be >= 1")
    p.need(
        not (run.resume and run.overwrite),
        "resume/overwrite: give one; resume continues the run, overwrite starts it afresh",
    )
    p.need(
        0 < run.max_reward_errors <= 1,
        f"max_reward_errors: {run.max_reward_errors}; must be in (0, 1] (1 never stops)",
    )
    p.need(
        0 <= run.target_accuracy <= 1,
        f"target_accuracy: {run.target_accuracy}; a held-out accuracy in (0, 1], e.g. 0.5 "
        "(0: report the time to the best accuracy)",
    )
    p.need(
        run.collective_timeout_s > 0,
        f"collective_timeout_s: {run.collective_timeout_s}; must be > 0 seconds",
    )
    p.need(
        not (run.resume and run.init_from),
        "resume/init_from: give one: --resume continues a run, --init_from starts a new one "
        "from a checkpoint's weights",
    )
    return p


def _sandbox_problems(s: SandboxConfig) -> list[str]:
    """List the problems of the ``sandbox`` settings (``grpo_envs.code.backend`` checks them)."""
    from grpo_envs.code.backend import remote_settings

    if s.sandbox_request_timeout_s < 0:
        return [
            f"sandbox_request_timeout_s: {s.sandbox_request_timeout_s}; must be >= 0 seconds "
            "(0: the job's own time limits plus 10 s)"
        ]
    if s.sandbox_backend == "local" and not s.sandbox_urls.strip():
        return []  # the default: nothing to check (and grpo_envs need not be imported)
    try:
        remote_settings(
            s.sandbox_backend,
            s.sandbox_urls,
            protocol=s.sandbox_protocol,
            token_env=s.sandbox_token_env,
            max_in_flight=s.sandbox_max_in_flight,
            retries=s.sandbox_retries,
            request_timeout_s=s.sandbox_request_timeout_s or None,
        )
    except ValueError as exc:
        return [str(exc)]
    return []


def algorithm_notes(cfg: Sections) -> list[str]:
    """Return advice on valid but probably unintended algorithm settings (logged at start).

    >>> from grpo_train.config import TrainConfig
    >>> algorithm_notes(TrainConfig())
    []
    >>> len(algorithm_notes(TrainConfig.from_flat({"importance_sampling_level": "sequence"})))
    2
    """
    a, notes = cfg.algorithm, []
    if a.importance_sampling_level is ImportanceLevel.SEQUENCE:
        if a.mu == 1:
            notes.append(
                "importance_sampling_level=sequence with mu=1: every ratio is exactly 1, so the "
                "update is the same as token level; GSPO acts on reused rollouts (e.g. --mu 2)"
            )
        if max(a.epsilon_low, a.epsilon_high) > 0.01:
            notes.append(
                f"importance_sampling_level=sequence with epsilon_low={a.epsilon_low:g}, "
                f"epsilon_high={a.epsilon_high:g}: a sequence ratio is a geometric mean of token "
                "ratios and stays near 1, so this range rarely clips; the GSPO paper uses "
                "--epsilon_low 3e-4 --epsilon_high 4e-4"
            )
    return notes
