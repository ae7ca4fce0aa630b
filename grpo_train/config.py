"""Training configuration: one frozen dataclass per concern, a docstring under every field.

A run's configuration is layered: a base, then a YAML file, then command-line overrides::

    grpo train --config run.yaml --learning_rate 1e-6

The base is the dataclass defaults, chosen for a real model (reasoning-length completions, bf16
where the hardware has it), unless the run names no model, env and config file: then it is
``DEFAULT_PRESET``, the embedded quick-start run (``--preset default`` asks for it explicitly).
TRL's ``GRPOConfig`` names (``num_iterations``, ``epsilon``, ``lr_scheduler_type``...) are accepted
as aliases (``TRL_ALIASES``) and saved under ours.

Field names are unique across sections, so YAML files may be flat (``learning_rate: 1e-6``) or
sectioned (``optim: {learning_rate: 1e-6}``), and every field is a ``--flag``. Invalid values fail
at start with the field name and the fix (``ConfigError``). The resolved configuration is saved in
the run folder as ``config.yaml`` and can be passed back with ``--config``.

What a field is, is written once, beside it: its type and default, its docstring (the help
``grpo train --help`` prints, ``field_docs``) and its resume class in the annotation
(``Fixed[int]``: ``--resume`` refuses another value; ``Free``; ``Identity``; ``field_resume``).
Booleans are read by one parser (``parse_bool``). Importing this module imports no torch: the
algorithm's choices come from ``grpo_train.algorithm.choices``.

Why argparse and this module rather than a dataclass-to-CLI library (tyro, simple-parsing,
jsonargparse): they derive flags and help from dataclasses as this module does, but not what the
users of ``grpo train`` rely on here: every bad field reported at once with its fix
(``ConfigError``), TRL's names whose values translate (``epsilon`` sets both clips,
``report_to``, ``use_vllm``, ``bf16``, a boolean ``scale_rewards``), YAML files that may be flat
or sectioned, layered over the embedded preset or the defaults. Each would need that code on
top, so the dependency would save little.

Why one module over 500 lines: most of it is the docstring under every field, which
``grpo train --help`` prints; the parsing, aliases and validation that read those fields sit
beside them so that a new field cannot miss one of them.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import inspect
import itertools
import re
import textwrap
import types
import typing
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from enum import StrEnum
from functools import cache
from pathlib import Path
from typing import Annotated, Literal, TypeVar, get_type_hints

import yaml

from grpo_train.algorithm.choices import Estimator, ImportanceLevel, LossType, ScaleRewards


class ConfigError(ValueError):
    """Invalid configuration; the message names each bad field and how to fix it."""


class Resume(StrEnum):
    """What ``--resume`` does with a field that differs from the checkpoint's (its resume class).

    Every field carries one in its annotation (``Fixed[int]``, ``Free[str]``, ``Identity[str]``),
    beside its default and its docstring: a new field cannot be left unclassified.
    """

    FIXED = "fixed"
    """Defines what the weights and optimizer state mean: a checkpoint saved with another value
    is refused (``checkpoint.resume_differences``)."""
    IDENTITY = "identity"
    """Part of the model's identity (``checkpoint.model_identity``: architecture, sizes,
    vocabulary, dtype, LoRA settings, base-weights fingerprint), checked through that identity,
    so a copy of the same base model in another folder is fine."""
    FREE = "free"
    """May change on resume: how a run is executed or recorded, not what it computes; and
    ``learning_rate`` and ``max_steps`` (the new values replace the schedule's peak and length;
    the trainer logs the effect)."""


_T = TypeVar("_T")
Fixed = Annotated[_T, Resume.FIXED]
Free = Annotated[_T, Resume.FREE]
Identity = Annotated[_T, Resume.IDENTITY]


@dataclass(frozen=True)
class EnvEntry:
    """One training environment and its share of the prompts."""

    id: str
    """Registered environment id (``grpo envs list``), e.g. ``math/arithmetic-v0``."""
    weight: float = 1.0
    """Relative share of the prompts drawn from this environment."""
    kwargs: Mapping[str, str | int | float | bool] = field(default_factory=dict)
    """Keyword arguments for ``grpo_envs.make(id, **kwargs)`` (YAML only)."""
    stages: tuple[Mapping[str, str | int | float | bool], ...] = ()
    """A curriculum (YAML only): kwargs overrides of easier versions, easiest first, e.g.
    ``[{digits: 1}, {operands: 2}]``; the environment as configured is the last stage. Training
    moves up a stage when its accuracy reaches ``curriculum_threshold``; evaluation always
    measures the last stage."""


@dataclass(frozen=True)
class PolicyConfig:
    """The model being trained."""

    model: Identity[str] = "default"
    """HF hub id or local folder; ``default`` is the embedded SmolLM2-135M-Instruct, ``tiny`` a
    tiny random model (seconds per step, learns nothing: for trying a setup)."""
    dtype: Identity[Literal["auto", "float32", "bfloat16"]] = "auto"
    """Parameter dtype for training: ``auto`` is bfloat16 on a GPU that supports it, else float32
    (the safe choice on CPU); the run's config.yaml records the resolved one."""
    attn_implementation: Free[str] = "auto"
    """Attention kernel of the policy and the KL reference (transformers' ``attn_implementation``):
    ``auto`` keeps transformers' choice (SDPA where the model has it, else eager); ``eager``,
    ``sdpa``, ``flex_attention``, ``flash_attention_2`` / ``flash_attention_3`` (a CUDA GPU and
    ``pip install flash-attn``, or ``pip install kernels``), or a hub kernel ``org/repo`` (the
    kernels package). Under flash-attention packed rows attend only within themselves (varlen
    kernels), so ``packing: auto`` packs more often; SDPA and eager run the shared prompt's
    completions in bins instead (``micro_batches.packing_pays``)."""
    gradient_checkpointing: Free[bool] = False
    """Recompute activations in the backward pass: less memory, more compute. ``grpo train``
    turns it on for a named model (``real_model_defaults``: 8.5x less memory per completion
    token on SmolLM2-135M for 1.1-1.2x the update's time); the embedded quick start and tiny
    models keep it off."""
    lora_r: Identity[int] = 0
    """LoRA rank (peft); 0 trains every weight (full fine-tuning). 16 is a common choice."""
    lora_alpha: Identity[int] = 32
    """LoRA scale numerator: the update is lora_alpha / lora_r * B @ A (common: 2 * lora_r)."""
    lora_dropout: Identity[float] = 0.0
    """Dropout on the adapters' input; 0 keeps the importance ratio exactly 1 at mu = 1."""
    target_modules: Identity[str] = "all-linear"
    """Layers that get adapters: ``all-linear`` or comma-separated names (``q_proj,v_proj``)."""
    use_qlora: Identity[bool] = False
    """QLoRA: load the frozen base in 4-bit NF4 (bitsandbytes, CUDA only); needs lora_r > 0."""
    save_merged: Free[bool] = False
    """LoRA: also write the merged policy as a plain HF folder (run_dir/merged) at the end."""
    offload_reference: Free[bool] = False
    """Full fine-tuning with beta > 0: keep the KL reference model in host RAM between uses."""
    cpu_autocast_bf16: Free[bool] = False
    """CPU only: run the training forward/backward under bf16 autocast (faster on CPUs with
    AVX512-BF16/AMX; logprobs then differ from float32 by ~1e-2). Parameters stay float32."""
    num_threads: Free[int] = 0
    """CPU threads for the trainer's torch ops (torch.set_num_threads); 0 keeps torch's choice."""


@dataclass(frozen=True)
class DataConfig:
    """Where prompts come from and how they are cut."""

    env: Fixed[tuple[EnvEntry, ...]] = (EnvEntry("math/arithmetic-v0"),)
    """Environment(s): an id, or ``id:weight,id:weight`` on the command line; a list in YAML."""
    train_split: Fixed[str] = "train"
    """Split that training prompts are drawn from."""
    eval_split: Free[str] = "test"
    """Held-out split for accuracy evaluation (greedy decoding)."""
    eval_size: Free[int] = 64
    """Held-out prompts evaluated per environment (the first ones of the split); 0 disables."""
    eval_suites: Free[str] = ""
    """Benchmark suites evaluated with the training envs, e.g. ``aime24,math500`` (``grpo eval``
    suite names or env ids; offline, their data must be local): the first ``eval_size`` problems
    of each, logged as ``eval/<suite>/avg@<n>`` (``eval/accuracy`` stays the training envs')."""
    eval_suite_samples: Free[int] = 1
    """Completions per problem for ``eval_suites``: 1 is greedy; more sample at the rollout
    temperature and top_p (avg@n, pass@k, maj@k)."""
    max_prompt_length: Fixed[int] = 512
    """Prompt tokens after the chat template; longer prompts keep their last tokens (warned)."""
    chat_template: Fixed[str] = ""
    """Prompt format: empty uses the tokenizer's chat template; a path to a Jinja file (or the
    template text itself) replaces it; ``plain`` uses prompt_template even if the tokenizer has a
    template. Training and ``grpo eval`` format prompts the same way
    (grpo_train/episodes/prompts.py)."""
    chat_template_kwargs: Fixed[Mapping[str, str | int | float | bool]] = field(
        default_factory=dict
    )
    """Extra variables for the chat template, e.g. ``{"enable_thinking": false}`` for Qwen3 (a
    YAML mapping, or JSON on the command line)."""
    system_prompt: Fixed[str] = ""
    """System message put before each prompt (replacing the environment's own, if any)."""
    prompt_template: Fixed[str] = "{prompt}"
    """Plain-text prompt for models without a chat template (base models): ``{prompt}`` is the
    messages' text joined by blank lines, e.g. ``Question: {prompt}\nAnswer:``."""
    curriculum: Fixed[Literal["auto", "on", "off"]] = "auto"
    """Easy-first training (grpo_train/collect/curriculum.py). An environment's stages are its
    ``stages`` in ``env``, else the easier versions it offers itself (``math/arithmetic-v0``
    chains: fewer digits and operands). ``on``: every environment with stages starts at its
    easiest. ``auto``: environments given ``stages`` start at the easiest; the others train as
    configured until the learning-signal guard sees no signal (equal rewards in nearly every group
    for several steps), then drop to their easiest version and climb back (once: a second stall
    turns on ``dynamic_sampling: auto`` instead). ``off``: never."""
    curriculum_threshold: Fixed[float] = 0.6
    """Training accuracy (share of correct completions, mean over ``curriculum_window`` steps at
    a stage) at which an environment moves to its next stage."""
    curriculum_window: Fixed[int] = 3
    """Steps of training accuracy averaged for ``curriculum_threshold``."""
    online_filtering: Fixed[bool] = False
    """Skip a prompt whose pass rate on its last visit was 0 or 1 (no gradient either way),
    retrying it after ``filter_retry_after`` skips ("Online Difficulty Filtering", arXiv
    2504.03380). Acts on prompts that repeat (several epochs over a dataset)."""
    filter_retry_after: Fixed[int] = 2
    """Times in a row a prompt is skipped by ``online_filtering`` before it is drawn again."""


@dataclass(frozen=True)
class RolloutConfig:
    """How completions are sampled."""

    engine: Free[Literal["auto", "vllm", "hf"]] = "auto"
    """Rollout engine: ``vllm`` (colocated vllm.LLM), ``hf`` (transformers, in the trainer's
    process), ``auto`` (vllm when importable)."""
    num_generations: Fixed[int] = 8
    """Completions per prompt (the group size G); at least 2."""
    prompts_per_step: Fixed[int] = 8
    """Prompts per training step; a step trains on prompts_per_step x num_generations samples."""
    max_completion_length: Fixed[int] = 1024
    """Maximum tokens per completion; longer ones are cut (finish reason 'length'). Reasoning
    needs room: 1024 fits GSM8K-style chains of thought; raise it for competition math."""
    max_turn_tokens: Fixed[int] = 0
    """Multi-turn environments: tokens one model turn may sample (0: max_completion_length).
    A whole episode (every turn and the environment's replies) fits in max_completion_length."""
    history_policy: Fixed[Literal["keep", "rerender"]] = "keep"
    """Multi-turn environments: what the model is shown at a later turn. ``keep``: its own
    sampled tokens, then the environment's reply rendered by the chat template after an anchor
    turn (one training sequence per episode). ``rerender``: the chat template's rendering of
    the whole history (Qwen3's drops earlier think blocks); where that differs from the kept
    tokens, a new training sequence starts from it (grpo_train/README.md, "Chat templates")."""
    template_breaks: Fixed[Literal["warn", "error"]] = "warn"
    """Multi-turn environments: a reply the chat template cannot render ends its episode there;
    ``warn`` says so (once per run, then ``episodes/broken_share``), ``error`` stops the run."""
    temperature: Fixed[float] = 1.0
    """Sampling temperature for training rollouts (> 0); evaluation is greedy."""
    top_p: Fixed[float] = 1.0
    """Nucleus sampling threshold for training rollouts."""
    vllm_memory_fraction: Free[float] = 0.3
    """GPU only: fraction of GPU memory vLLM may take (the rest stays for the trainer)."""
    vllm_cpu_kv_cache_gib: Free[float] = 1.0
    """CPU only: vLLM's KV-cache size in GiB (on CPU it takes a fixed size, not a fraction)."""
    vllm_dtype: Free[Literal["auto", "float32", "bfloat16"]] = "auto"
    """The colocated vLLM engine's weight dtype (a ``grpo serve`` replica takes ``--dtype``).
    ``auto``: bfloat16 for a float32 policy on a CPU with
    bfloat16 instructions (AVX512-BF16, AMX), else the policy's (``dtype``). There bfloat16
    halves the bytes of weights a decode step reads, which bound CPU decoding: SmolLM2-135M
    generated a step's 4 x 8 completions of up to 64 tokens in 5.1 s against 10.1 s in float32
    on one core. The engine then samples from a bfloat16 rounding of the policy; the update's
    truncated importance weights (``is_correction``) correct for the gap; the run's periodic
    held-out evaluation decodes on the same engine. ``float32`` keeps the engine's logprobs
    within 1e-5 of the trainer's (``grpo eval`` loads its own engine: float32 unless
    ``--dtype``)."""
    vllm_in_process: Free[bool] = True
    """CPU only: run vLLM's engine in the trainer's process (GPU always does). False: in child
    processes, whose engine core keeps a core busy-waiting during generation and leaves the
    worker the other cores (1.55x slower steps on 2 cores); for isolating a crashing engine."""
    vllm_sleep_mode: Free[bool] = False
    """GPU only: put the colocated vLLM engine to sleep during the update (frees its memory)."""
    vllm_tensor_parallel_size: Free[int] = 1
    """Colocate mode under a launch: shard each vLLM engine over this many consecutive ranks
    (vLLM's ``external_launcher``); the ranks of a group generate their prompts together and
    each keeps its own share. Must divide the number of ranks. Server mode: give
    ``grpo serve --tensor_parallel_size`` instead."""
    vllm_mode: Free[Literal["colocate", "server"]] = "colocate"
    """``colocate``: each trainer rank runs its own vLLM engine; ``server``: generation runs in
    ``grpo serve`` replicas on GPUs or machines of their own, reached at vllm_server_urls (new
    weights go to them in one broadcast per step)."""
    vllm_server_urls: Free[str] = ""
    """Server mode: comma-separated ``http://HOST:PORT`` of the ``grpo serve`` replicas (all
    of them share each step's prompts)."""
    vllm_server_timeout_s: Free[float] = 600.0
    """Server mode: the longest one request (a step's generation, a weight load) may take; a
    server that stalls past it ends the run with its last step saved."""
    vllm_sync_timeout_s: Free[float] = 120.0
    """Server mode: the longest one step of a weight sync may take (each bucket's broadcast, a
    replica's answer after the last one): a replica that dies or stalls mid-sync ends the run
    within this time, naming it."""
    vllm_sync_bucket_mb: Free[float] = 256.0
    """Server mode: a weight sync streams the model in buffers of at most this many MiB (a
    tensor larger than that travels alone), on the trainer and on every replica, beside vLLM's
    share of the GPU; never one buffer of the whole model."""
    vllm_sync_backend: Free[Literal["auto", "nccl", "gloo"]] = "auto"
    """Server mode: the weight broadcast's transport: ``nccl`` (GPU to GPU), ``gloo`` (through
    host memory; also for a server on the trainer's own GPU, which NCCL refuses); ``auto``:
    nccl when the trainer has CUDA, else gloo."""
    vllm_sync_address: Free[str] = ""
    """Server mode: ``HOST`` or ``HOST:PORT`` the servers reach this trainer at for the weight
    broadcast; empty: this machine's address towards the first server, a free port."""
    seed_per_prompt: Fixed[bool] = False
    """Sample each prompt's group with its own seed (run seed + global prompt index): rollouts do
    not depend on how prompts are split over ranks or batches (a multi-rank run then matches a
    single-process one); costs batching with the hf engine."""
    async_generation: Free[bool] = False
    """Generate the next steps' rollouts while this step trains (``rollout_pipeline.py``), with
    weights at most max_staleness updates old; needs an engine with its own weights (vllm, or
    vllm_mode server) in one process. Off: generate, then train, as always."""
    max_staleness: Free[int] = 1
    """async_generation: the most updates a trained sample's weights may lag the policy (0: the
    synchronous loop); batch k is generated with version k-1-max_staleness, older ones are
    dropped (async/dropped_groups) and generated again."""

    @property
    def tensor_parallel(self) -> int:
        """Ranks per colocated engine: ``vllm_tensor_parallel_size`` in colocate mode, else 1."""
        return self.vllm_tensor_parallel_size if self.vllm_mode == "colocate" else 1


@dataclass(frozen=True)
class AlgorithmConfig:
    """The GRPO objective and its variants."""

    advantage_estimator: Fixed[Estimator] = Estimator.GRPO
    """``grpo`` (reward minus group mean), ``rloo`` (leave-one-out baseline: unbiased, for small
    groups), or ``ema`` (reward minus a running mean of the prompt's past rewards, else the
    environment's: equal-reward groups still learn; needs scale_rewards batch or none)."""
    ema_alpha: Fixed[float] = 0.95
    """``ema`` only: weight of the old baseline at each update, in (0, 1); 0.9-0.99 is useful
    (lower follows a fast-improving policy, higher averages more visits)."""
    scale_rewards: Fixed[ScaleRewards] = ScaleRewards.GROUP
    """Divide centred rewards by the std of the ``group``, the ``batch``, or ``none`` (Dr. GRPO)."""
    importance_sampling_level: Fixed[ImportanceLevel] = ImportanceLevel.TOKEN
    """Clipped ratio per ``token`` (GRPO), or per ``sequence``: GSPO's length-normalised
    sequence ratio, clipped per completion (arXiv:2507.18071; it changes the update only when
    mu > 1, and the paper clips at epsilon_low 3e-4, epsilon_high 4e-4)."""
    loss_type: Fixed[LossType] = LossType.DAPO
    """Aggregation: ``grpo`` (per-sequence mean), ``dr_grpo`` (sum / max length), ``dapo``
    (token mean over the batch)."""
    mu: Fixed[int] = 1
    """Optimizer updates per generated batch (num_iterations); > 1 reuses rollouts with clipping."""
    beta: Fixed[float] = 0.0
    """KL coefficient to the initial policy (k3 estimator); 0 loads no reference model."""
    epsilon_low: Fixed[float] = 0.2
    """Lower clip range: the ratio is clipped below at 1 - epsilon_low."""
    epsilon_high: Fixed[float] = 0.28
    """Upper clip range (DAPO clip-higher: larger than epsilon_low)."""
    is_correction: Fixed[bool] = True
    """Truncated importance sampling for the gap between engine and trainer logprobs."""
    is_cap: Fixed[float] = 3.0
    """Cap of the truncated importance weight (TRL's default is 3.0)."""
    mask_truncated: Fixed[bool] = False
    """Exclude completions cut at max_completion_length from the loss (DAPO overlong filtering)."""
    dynamic_sampling: Fixed[Literal["auto", "on", "off"]] = "auto"
    """DAPO dynamic sampling: drop groups whose rewards all agree, refill from further prompts.
    ``auto`` turns it on once most groups have had equal rewards for several steps (the
    learning-signal guard), when it pays for its extra generation, unless the automatic
    curriculum answered that stall with an easier stage (then only if the signal stalls again);
    true/false force it."""
    dynamic_sampling_rounds: Fixed[int] = 3
    """Extra generation rounds allowed per step to refill dropped groups."""


@dataclass(frozen=True)
class OptimConfig:
    """The optimizer (AdamW) and its schedule."""

    learning_rate: Free[float] = 1e-6
    """Peak learning rate."""
    lr_scheduler: Fixed[Literal["constant", "linear", "cosine"]] = "constant"
    """Schedule after warmup: constant, linear decay to 0, or cosine decay to 0."""
    warmup_steps: Fixed[int] = 0
    """Optimizer updates with a linear warmup from 0 to the peak rate."""
    weight_decay: Free[float] = 0.0
    """AdamW weight decay."""
    adam_beta1: Free[float] = 0.9
    """AdamW beta1."""
    adam_beta2: Free[float] = 0.99
    """AdamW beta2."""
    max_grad_norm: Free[float] = 1.0
    """Clip the global gradient norm to this value (0 disables clipping)."""
    micro_batch_tokens: Free[int] = 2048
    """Token budget per forward/backward micro-batch: real tokens of the packed rows (``packing``),
    rows x padded length otherwise; bounds activation memory (SmolLM2-135M: about 1.2 GB per
    1,000 tokens in float32); raise it on a GPU. A row longer than the budget runs alone."""
    share_prompt_forward: Free[bool] = True
    """Run each group's prompt once in the update and reuse its KV cache for the group's
    completions (single process, no gradient checkpointing); with SDPA or eager attention a
    group's short completions also share rows as long as its longest one (``completion_bins``:
    a custom mask keeps each on the prompt and itself), so fewer padded positions run, equal
    within float tolerance. False runs one full forward per row (packed unless ``packing:
    off``): the same math in another float32 summation order, as data-parallel runs (which
    never share prompts) compute it, for comparisons with them."""
    packing: Free[Literal["auto", "on", "off"]] = "auto"
    """Padding-free micro-batches: each micro-batch's rows end to end in one sequence whose
    positions restart per row, cut at micro_batch_tokens real tokens (no padding to the longest
    row); run without attention mask or cache, so attention stays within each row (flash-
    attention's varlen kernels where the model is loaded with them). Equal to the padded
    forward within float tolerance. ``auto``: packed wherever the shared-prompt forward cannot
    run (several ranks, gradient checkpointing, share_prompt_forward off); where it can, each
    step takes whichever of the two costs less (``packing_pays``: token positions and
    attention pairs): similar lengths keep the shared prompt, a wide length spread (reasoning
    chains of 300-12,000 tokens) packs. The metric ``packed`` says which each step took."""
    logprob_head: Free[Literal["auto", "chunked", "fused", "liger"]] = "auto"
    """How the update turns the model's last hidden states into per-token log-probs without
    (tokens x vocabulary) float32 tensors (``grpo_train.learner.logprobs``). ``chunked``: over the
    logits the model returns, the log-softmax chunk by chunk and recomputed in the backward;
    bitwise the plain formula, but the logits and their gradient stay (2 vocabulary rows per
    token). ``fused``: the lm_head itself runs chunk by chunk under recomputation, the logits
    never exist (hidden-size memory per token); equal within float tolerance. ``auto``: fused
    for micro-batches whose float32 logits would exceed fused_head_above_mib, else chunked.
    ``liger``: the loss itself is Liger-Kernel's fused linear GRPO loss (``pip install
    liger-kernel``; ``grpo_train.learner.liger_loss``), hidden-size memory per token like ``fused``
    and equal to it within float tolerance; the metrics still come from our fused head."""
    fused_head_above_mib: Free[int] = 256
    """``logprob_head: auto`` switches to the fused head above this many MiB of float32 logits
    per micro-batch (about 440 completion tokens of a 151,936-row vocabulary; never for short
    completions of a small vocabulary, whose results then stay bitwise the plain formula's)."""


@dataclass(frozen=True)
class RunConfig:
    """Run length, seeding, outputs, checkpoints and logging."""

    max_steps: Free[int] = 100
    """Training steps (each: generate, score, mu optimizer updates)."""
    seed: Fixed[int] = 0
    """Seed for prompt order, sampling and initialisation; a run is reproducible on CPU."""
    output_dir: Free[str] = ""
    """Run folder: config.yaml, metrics.jsonl, samples.jsonl, tensorboard/, checkpoints/, plots/.
    Empty: a new folder per run, ``runs/<model>-<env>-<date>-<time>``. A folder that holds
    another run's config.yaml is refused unless resume or overwrite is given."""
    resume: Free[str] = ""
    """Resume from ``latest`` (the last checkpoint of output_dir's current lineage), a run
    folder, or a checkpoint folder. The checkpoint must match the model, environments and the
    fields listed in ``RESUME_FIXED`` (``--init_from`` starts a new run from its weights)."""
    init_from: Free[str] = ""
    """Start a new run (step 0, fresh optimizer) from the weights of a checkpoint folder (or a
    run folder: its last checkpoint), e.g. to change settings that ``--resume`` refuses."""
    overwrite: Free[bool] = False
    """Start afresh in an output_dir that holds another run: its metrics, samples, TensorBoard
    events, checkpoints and plots are deleted first."""
    save_every: Free[int] = 50
    """Save a checkpoint every N steps (and at the end); 0 saves only at the end."""
    keep_last: Free[int] = 2
    """Checkpoints to keep; older ones are deleted."""
    eval_every: Free[int] = 0
    """Evaluate held-out accuracy every N steps (always before and after training); 0: only then."""
    log_every_samples: Free[int] = 10
    """Write one group's completions to samples.jsonl on the first step, every N steps and on the
    last step; 0 disables."""
    max_bad_steps: Free[int] = 3
    """Abort after this many consecutive steps with a NaN/inf loss or gradient (skipped)."""
    max_reward_errors: Free[float] = 0.5
    """Stop the run when more than this fraction of a step's completions fail to score (the
    scorer raised, or returned None/NaN/inf): the scorer is broken. 1 never stops."""
    target_accuracy: Free[float] = 0.0
    """Held-out accuracy whose first reaching the run summary reports (step and wall time:
    time-to-target), in (0, 1]; 0: report when the best held-out accuracy was first reached."""
    collective_timeout_s: Free[float] = 1800.0
    """Distributed runs: seconds a rank waits in a collective (all-reduce, barrier) before the
    run fails with a timeout, e.g. when another rank hangs or was stopped."""
    wandb: Free[bool] = False
    """Also log to Weights & Biases (needs the wandb package); a resumed run continues the same
    W&B run (its id is kept in the run folder)."""
    wandb_project: Free[str] = "grpo-kit"
    """W&B project name."""
    wandb_entity: Free[str] = ""
    """W&B entity (team or user); empty: your default entity."""
    wandb_run_name: Free[str] = ""
    """W&B run name; empty: the run folder's name."""
    wandb_tags: Free[str] = ""
    """W&B tags, comma-separated (a YAML list works too)."""
    progress: Free[bool] = True
    """Show a progress bar with ETA."""
    log_level: Free[Literal["debug", "info", "warning", "error"]] = "info"
    """Log level. At ``info`` the console shows warnings and errors only (the rest goes to the
    run's ``train.log``) and hides the expected chatter of vLLM, Triton and NUMA probing;
    ``debug`` shows everything on the console."""


SECTIONS: dict[str, type] = {
    "policy": PolicyConfig,
    "data": DataConfig,
    "rollout": RolloutConfig,
    "algorithm": AlgorithmConfig,
    "optim": OptimConfig,
    "run": RunConfig,
}


@cache
def field_resume() -> dict[str, Resume]:
    """Map every field name to its resume class (the ``Fixed``/``Free``/``Identity`` marker)."""
    out: dict[str, Resume] = {}
    for cls in SECTIONS.values():
        for name, hint in get_type_hints(cls, include_extras=True).items():
            marks = [m for m in getattr(hint, "__metadata__", ()) if isinstance(m, Resume)]
            if len(marks) != 1:  # pragma: no cover - a new field without its marker
                raise AssertionError(f"{cls.__name__}.{name}: annotate it Fixed/Free/Identity[...]")
            out[name] = marks[0]
    return out


def _resume_class(kind: Resume) -> frozenset[str]:
    return frozenset(name for name, k in field_resume().items() if k is kind)


#: The fields ``--resume`` refuses to change (``Resume.FIXED``).
RESUME_FIXED: frozenset[str] = _resume_class(Resume.FIXED)
#: The fields of the model's identity (``Resume.IDENTITY``), checked through that identity.
RESUME_IDENTITY: frozenset[str] = _resume_class(Resume.IDENTITY)
#: The fields that may change on resume (``Resume.FREE``).
RESUME_FREE: frozenset[str] = _resume_class(Resume.FREE)

#: What ``grpo train`` runs with no arguments: the embedded SmolLM2-135M-Instruct on two-digit
#: addition, on CPU. The single place to tune the out-of-the-box run; flat field -> value.
#: Chosen by measurement (benchmarks/results/history.md, "Learning"): the converted model states
#: its sums in prose and almost never boxes a correct one (0/1024 samples), so a boxed-only reward
#: gives all-zero advantages and a reward for any box is hacked (\boxed{N}); ``answer="loose"`` (the
#: last integer of the text counts, as lm-eval's flexible GSM8K extraction does) gives a signal it
#: can earn: held-out greedy accuracy 10.9% -> 53% after 5 steps, 56% after 10 (lr 2e-5, 4 prompts
#: x 8 completions, <= 64 tokens). 8 steps with both evaluations fit 15 minutes on 2 CPU cores.
DEFAULT_PRESET: Mapping[str, object] = {
    "model": "default",
    "env": [{"id": "math/arithmetic-v0", "kwargs": {"task": "add2", "answer": "loose"}}],
    "engine": "auto",
    "num_generations": 8,
    "prompts_per_step": 4,
    "max_prompt_length": 256,
    "max_completion_length": 64,
    "temperature": 1.0,
    "learning_rate": 2e-5,
    "max_steps": 8,
    "eval_size": 64,
    "save_every": 10,
    "output_dir": "runs/grpo-default",
    "dtype": "float32",
    "dynamic_sampling": "auto",
}


#: Layers x hidden size under which a model's activations are too small for gradient
#: checkpointing to pay: the tiny test models (2 x 128 = 256) keep ~1/70 of SmolLM2-135M's
#: (30 x 576 = 17,280) per token, a few MiB per 1,000 tokens, and checkpointing would only add
#: its recomputation (and turn off the shared-prompt forward).
CHECKPOINTING_MIN_WIDTH = 4096


@dataclass(frozen=True)
class DefaultChoice:
    """A default ``grpo train`` chose for a named model, and why (said in the start-up line)."""

    field: str
    value: object
    why: str

    def describe(self) -> str:
        """Return ``field=value (why)``, as the start-up line prints it."""
        return f"{self.field}={str(self.value).lower()} ({self.why})"


def real_model_defaults(shape: tuple[int, int] | None) -> tuple[DefaultChoice, ...]:
    """Return the defaults a named model gets beyond the dataclass defaults.

    ``grpo train`` applies them under any YAML file and flag, which win. ``shape``: the
    model's (layers, hidden size) where its ``config.json`` is at hand, else None (a hub id:
    taken as a real model). Gradient checkpointing is on for a real model, as in TRL's
    ``GRPOConfig``: measured by ``benchmarks/checkpointing_bench.py`` on SmolLM2-135M, one
    update's peak grows 1,645 KiB per completion token without it and 194 KiB with it (8.5x
    less), for 1.06-1.20x the update's CPU time, so a 4k-token chain fits where it otherwise
    runs out of memory. A model narrower than ``CHECKPOINTING_MIN_WIDTH`` keeps it off.

    >>> [c.describe()[:27] for c in real_model_defaults((30, 576))]
    ['gradient_checkpointing=true']
    >>> real_model_defaults((2, 128))[0].value, real_model_defaults(None)[0].value
    (False, True)
    """
    if shape is not None and shape[0] * shape[1] < CHECKPOINTING_MIN_WIDTH:
        layers, hidden = shape
        why = f"{layers} layers x hidden {hidden}: activations too small to need it"
        return (DefaultChoice("gradient_checkpointing", False, why),)
    why = "a real model: 8.5x less memory per completion token, ~1.1-1.2x update time"
    return (DefaultChoice("gradient_checkpointing", True, why),)


def unknown_fields_text(unknown: Sequence[str], known: Sequence[str]) -> str:
    """Name the unknown fields, each with its closest known names (a likely typo).

    >>> text = unknown_fields_text(["learning_rte"], ["learning_rate", "lr_scheduler", "seed"])
    >>> text.split(";")[0]
    "unknown config field 'learning_rte' (did you mean learning_rate?)"
    """
    parts = []
    for name in unknown:
        close = difflib.get_close_matches(str(name), known, n=3, cutoff=0.6)
        hint = f" (did you mean {' or '.join(close)}?)" if close else ""
        parts.append(f"{name!r}{hint}")
    plural = "s" if len(unknown) > 1 else ""
    return f"unknown config field{plural} {', '.join(parts)}; `grpo train --help` lists them all"


@dataclass(frozen=True)
class TrainConfig:
    """The whole configuration of a training run."""

    policy: PolicyConfig = PolicyConfig()
    data: DataConfig = DataConfig()
    rollout: RolloutConfig = RolloutConfig()
    algorithm: AlgorithmConfig = AlgorithmConfig()
    optim: OptimConfig = OptimConfig()
    run: RunConfig = RunConfig()

    def __post_init__(self) -> None:
        problems = _validate(self)
        if problems:
            raise ConfigError(_problems_text(problems))

    @classmethod
    def from_flat(
        cls, values: Mapping[str, object], base: TrainConfig | None = None
    ) -> TrainConfig:
        """Build a config from ``{field: value}`` (values may be strings from the command line).

        TRL's ``GRPOConfig`` names are accepted too (``normalise_aliases``).
        """
        values = normalise_aliases(values)
        owners = field_owners()
        unknown = [k for k in values if k not in owners]
        if unknown:
            raise ConfigError(unknown_fields_text(unknown, [*owners, *SECTIONS]))
        problems: list[str] = []
        sections = {name: getattr(base or cls(), name) for name in SECTIONS}
        for section_name, section in sections.items():
            changes: dict[str, object] = {}
            for f in fields(section):
                if f.name in values:
                    try:
                        changes[f.name] = coerce(f.name, values[f.name], field_types()[f.name])
                    except (TypeError, ValueError) as err:
                        problems.append(str(err))
            sections[section_name] = dataclasses.replace(section, **changes)
        if problems:
            raise ConfigError(_problems_text(problems))
        return cls(**sections)

    @classmethod
    def from_yaml(cls, path: str | Path, base: TrainConfig | None = None) -> TrainConfig:
        """Load a flat or sectioned YAML file over ``base`` (default: the dataclass defaults)."""
        try:
            raw = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as err:
            raise ConfigError(f"cannot read config file {path}: {err}") from err
        if not isinstance(raw, Mapping):
            raise ConfigError(
                f"{path}: expected a mapping of field: value, got {type(raw).__name__}"
            )
        flat: dict[str, object] = {}
        for key, value in raw.items():
            if key in SECTIONS and isinstance(value, Mapping):
                flat.update(value)
            elif key in SECTIONS:
                example = next(f.name for f in fields(SECTIONS[key]))
                raise ConfigError(
                    f"{path}: {key}: is a section and needs a mapping of its fields, got "
                    f"{type(value).__name__} {value!r}; write e.g. `{key}: {{{example}: ...}}` "
                    f"or the fields flat at the top level"
                )
            else:
                flat[str(key)] = value
        return cls.from_flat(flat, base)

    def to_dict(self) -> dict[str, dict[str, object]]:
        """Return the sectioned, YAML-ready form (enums as strings, env entries as mappings)."""
        return {
            name: {k: _plain(v) for k, v in flat_items(getattr(self, name))} for name in SECTIONS
        }

    def to_yaml(self) -> str:
        """YAML text that ``from_yaml`` reads back to an equal config."""
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def save(self, path: str | Path) -> None:
        """Write ``to_yaml()`` to ``path``."""
        Path(path).write_text(self.to_yaml())


#: TRL ``GRPOConfig`` / ``TrainingArguments`` / ``ModelConfig`` names (TRL 1.16) -> ours, for
#: the ones that mean the same thing. ``epsilon``, ``report_to``, ``use_vllm`` and ``bf16`` need
#: a translation of their value too: ``normalise_aliases`` handles them.
TRL_ALIASES: Mapping[str, str] = {
    "model_name_or_path": "model",
    "num_iterations": "mu",
    "mask_truncated_completions": "mask_truncated",
    "vllm_importance_sampling_correction": "is_correction",
    "vllm_importance_sampling_cap": "is_cap",
    "vllm_importance_sampling_clip_max": "is_cap",
    "lr": "learning_rate",
    "lr_scheduler_type": "lr_scheduler",
    "save_steps": "save_every",
    "save_total_limit": "keep_last",
    "eval_steps": "eval_every",
    "vllm_gpu_memory_utilization": "vllm_memory_fraction",
    "vllm_enable_sleep_mode": "vllm_sleep_mode",
    "lora_target_modules": "target_modules",
    "load_in_4bit": "use_qlora",
    "use_peft": "",  # implied by lora_r > 0; accepted and dropped when consistent
}

#: TRL names whose value is translated as well: name -> what it sets.
TRL_TRANSLATED: Mapping[str, str] = {
    "epsilon": "epsilon_low, and epsilon_high unless given (TRL's symmetric clip)",
    "report_to": "wandb (true when it names wandb or all); TensorBoard is always written",
    "use_vllm": "engine (vllm or hf)",
    "bf16": "dtype (bfloat16 or float32)",
}

_SCHEDULER_ALIASES = {"constant_with_warmup": "constant", "linear": "linear", "cosine": "cosine"}


_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def is_bool_text(value: object) -> bool:
    """Return whether ``value`` is a bool or a word ``parse_bool`` reads (true/false/1/0/yes/no)."""
    return isinstance(value, bool) or str(value).strip().lower() in _TRUE | _FALSE


def parse_bool(name: str, value: object) -> bool:
    """Read a boolean field: a YAML bool, or ``true/false/1/0/yes/no/on/off`` in any case.

    The one boolean parser of the configuration (fields, TRL's boolean names, ``on``/``off``
    choices, TRL's boolean ``scale_rewards``).

    >>> parse_bool("progress", "No"), parse_bool("progress", True)
    (False, True)
    >>> parse_bool("progress", "maybe")
    Traceback (most recent call last):
    ...
    ValueError: progress: expected true or false, got 'maybe'
    """
    if isinstance(value, bool):
        return value
    if not is_bool_text(value):
        raise ValueError(f"{name}: expected true or false, got {value!r}")
    return str(value).strip().lower() in _TRUE


def normalise_aliases(values: Mapping[str, object]) -> dict[str, object]:
    """Rename TRL's field names to ours and translate their values; our own names pass through.

    >>> normalise_aliases({"num_iterations": 2, "epsilon": 0.1, "lr": "1e-6"})
    {'mu': 2, 'learning_rate': '1e-6', 'epsilon_low': 0.1, 'epsilon_high': 0.1}
    >>> normalise_aliases({"epsilon": 0.1, "epsilon_high": 0.3})
    {'epsilon_high': 0.3, 'epsilon_low': 0.1}
    >>> normalise_aliases({"report_to": ["wandb"], "lr_scheduler_type": "constant_with_warmup"})
    {'lr_scheduler': 'constant', 'wandb': True}
    """
    out: dict[str, object] = {}
    problems: list[str] = []
    given: dict[str, str] = {}  # our name -> the name it was given under

    def put(ours: str, value: object, source: str) -> None:
        if ours in given and given[ours] != source:
            problems.append(
                f"{source}: sets {ours}, which {given[ours]} also sets; give only one of them"
            )
            return
        given[ours] = source
        out[ours] = value

    translated: dict[str, object] = {}
    for key, value in values.items():
        if key in TRL_TRANSLATED:
            translated[key] = value
        elif key in TRL_ALIASES:
            ours = TRL_ALIASES[key]
            if key == "lr_scheduler_type":
                text = str(value)
                if text not in _SCHEDULER_ALIASES:
                    problems.append(
                        f"lr_scheduler_type: {text!r} is not supported; use one of "
                        f"{sorted(_SCHEDULER_ALIASES)}"
                    )
                    continue
                value = _SCHEDULER_ALIASES[text]
            if key == "save_total_limit" and value is None:
                value = 1_000_000  # TRL: None keeps every checkpoint
            if ours:
                put(ours, value, key)
        else:
            put(key, value, key)
    for key, value in translated.items():
        if key == "epsilon":
            put("epsilon_low", value, key)
            if "epsilon_high" not in out:
                out["epsilon_high"] = value
        elif key == "report_to":
            targets = value if isinstance(value, list | tuple) else str(value).split(",")
            names = {str(t).strip().lower() for t in targets}
            put("wandb", bool(names & {"wandb", "all"}), key)
        elif key in ("use_vllm", "bf16"):
            try:
                on = parse_bool(key, value)
            except ValueError as err:
                problems.append(str(err))
                continue
            if key == "use_vllm":
                put("engine", "vllm" if on else "hf", key)
            else:
                put("dtype", "bfloat16" if on else "float32", key)
    if problems:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(problems))
    return out


def _problems_text(problems: list[str]) -> str:
    """One problem: one line; several: one per line under a heading."""
    if len(problems) == 1:
        return problems[0]
    return "invalid configuration:\n  " + "\n  ".join(problems)


def preset_config() -> TrainConfig:
    """Return the embedded default run: the dataclass defaults overlaid with ``DEFAULT_PRESET``."""
    return TrainConfig.from_flat(DEFAULT_PRESET)


def flat_items(section: object) -> Iterator[tuple[str, object]]:
    """Yield the ``(field, value)`` pairs of one section dataclass."""
    for f in fields(section):  # type: ignore[arg-type]
        yield f.name, getattr(section, f.name)


def _plain(value: object) -> object:
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, EnvEntry):
        plain: dict[str, object] = {"id": value.id, "weight": value.weight}
        plain["kwargs"] = dict(value.kwargs)
        if value.stages:
            plain["stages"] = [dict(stage) for stage in value.stages]
        return plain
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, str):  # StrEnum members become plain strings
        return str(value)
    return value


@cache
def field_owners() -> dict[str, str]:
    """Map every field name to the section it belongs to."""
    owners: dict[str, str] = {}
    for section, cls in SECTIONS.items():
        for f in fields(cls):
            if f.name in owners:  # pragma: no cover - guarded by a test
                raise AssertionError(f"field {f.name} appears in two sections")
            owners[f.name] = section
    return owners


@cache
def field_types() -> dict[str, object]:
    """Map every field name to its resolved type annotation."""
    out: dict[str, object] = {}
    for cls in SECTIONS.values():
        out.update(get_type_hints(cls))
    return out


@cache
def field_docs() -> dict[str, str]:
    """Map every field name to the docstring written under it (read from the source by ``ast``)."""
    docs: dict[str, str] = {}
    for cls in SECTIONS.values():
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
        body = tree.body[0].body  # type: ignore[attr-defined]
        for node, nxt in itertools.pairwise(body):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)
            ):
                docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def coerce(name: str, value: object, annotation: object) -> object:
    """Convert ``value`` (a YAML value or a command-line string) to the field's type."""
    origin = typing.get_origin(annotation)
    if annotation is bool:
        return parse_bool(name, value)
    if annotation in (int, float):
        if isinstance(value, bool):
            raise ValueError(f"{name}: expected a number, got {value!r}")
        try:
            number = float(value) if annotation is float else int(str(value))  # type: ignore[arg-type]
        except ValueError:
            raise ValueError(f"{name}: expected {annotation.__name__}, got {value!r}") from None  # type: ignore[union-attr]
        return number
    if annotation is str:
        if isinstance(value, list | tuple):  # YAML lists of names (target_modules)
            return ",".join(str(v) for v in value)
        return str(value)
    if origin is Literal:
        allowed = typing.get_args(annotation)
        if "on" in allowed and is_bool_text(value):
            return "on" if parse_bool(name, value) else "off"
        if value not in allowed:
            raise ValueError(f"{name}: {value!r} is not one of {list(allowed)}")
        return value
    if isinstance(annotation, type) and issubclass(annotation, str):  # StrEnum
        if annotation is ScaleRewards and is_bool_text(value):
            # TRL's scale_rewards also takes a bool: true is "group", false is "none"
            return ScaleRewards.GROUP if parse_bool(name, value) else ScaleRewards.NONE
        try:
            return annotation(value)
        except ValueError:
            allowed_values = [m.value for m in annotation]  # type: ignore[attr-defined]
            raise ValueError(f"{name}: {value!r} is not one of {allowed_values}") from None
    if name == "chat_template_kwargs":
        return parse_mapping(name, value)
    if origin in (tuple, types.UnionType) or name == "env":
        return parse_envs(value)
    raise TypeError(f"{name}: unsupported field type {annotation}")  # pragma: no cover


def parse_mapping(name: str, value: object) -> dict[str, str | int | float | bool]:
    """Read a mapping field: a YAML mapping, or JSON / ``key=value,key=value`` text.

    >>> parse_mapping("chat_template_kwargs", '{"enable_thinking": false}')
    {'enable_thinking': False}
    >>> parse_mapping("chat_template_kwargs", "enable_thinking=false")
    {'enable_thinking': False}
    """
    if isinstance(value, str):
        text = value.strip()
        if not text:
            return {}
        if text.startswith("{"):
            loaded = yaml.safe_load(text)  # JSON is YAML; YAML also takes unquoted keys
        else:
            loaded = {}
            for part in text.split(","):
                key, sep, raw = part.partition("=")
                if not sep:
                    raise ValueError(f"{name}: cannot read {part!r}; use key=value or JSON")
                loaded[key.strip()] = yaml.safe_load(raw)
        value = loaded
    if not isinstance(value, Mapping):
        raise ValueError(f"{name}: expected a mapping such as {{enable_thinking: false}}")
    return {str(k): v for k, v in value.items()}


def parse_envs(value: object) -> tuple[EnvEntry, ...]:
    """Parse ``id``, ``id:weight,id:weight``, or a YAML list of ids / ``{id, weight, kwargs}``.

    On the command line a flow-style YAML value carries kwargs too:
    ``--env '{id: math/dataset-v0, kwargs: {path: q.jsonl, question: problem}}'``.
    """
    if isinstance(value, EnvEntry):
        return (value,)
    if isinstance(value, str) and value.lstrip().startswith(("[", "{")):
        import yaml

        try:
            value = yaml.safe_load(value)
        except yaml.YAMLError as exc:
            raise ValueError(f"env: {value!r} is not valid flow YAML/JSON: {exc}") from None
    items: list[object]
    if isinstance(value, str):
        items = [part.strip() for part in value.split(",") if part.strip()]
    elif isinstance(value, list | tuple):
        items = list(value)
    else:
        items = [value]
    entries: list[EnvEntry] = []
    for item in items:
        if isinstance(item, EnvEntry):
            entries.append(item)
        elif isinstance(item, str):
            # ``module:ns/name-v0`` (import the module first) also has a colon: a weight is only
            # what follows the last colon when there is no "/" after it.
            env_id, sep, weight = item.rpartition(":")
            if not sep or "/" in weight:
                env_id, weight = item, ""
            try:
                entries.append(EnvEntry(env_id.strip(), float(weight) if weight else 1.0))
            except ValueError:
                raise ValueError(
                    f"env: weight of {item!r} is {weight!r}, not a number; "
                    "use id:weight with a positive number (math/arithmetic-v0:2)"
                ) from None
        elif isinstance(item, Mapping) and "id" in item:
            extra = set(item) - {"id", "weight", "kwargs", "stages"}
            if extra:
                raise ValueError(
                    f"env: unknown key(s) {sorted(extra)} in {dict(item)}; use id, weight, "
                    "kwargs, stages"
                )
            weight, kwargs = item.get("weight", 1.0), item.get("kwargs") or {}
            try:
                number = float(weight)  # type: ignore[arg-type]
            except (TypeError, ValueError):
                raise ValueError(
                    f"env: weight of {item['id']} is {weight!r}, not a number; "
                    "give a positive number such as 1.0"
                ) from None
            if not isinstance(kwargs, Mapping):
                raise ValueError(
                    f"env: kwargs of {item['id']} is {kwargs!r}; give a mapping of "
                    "argument: value (`grpo envs show ID` lists the arguments)"
                )
            stages = _parse_stages(str(item["id"]), item.get("stages") or [])
            entries.append(EnvEntry(str(item["id"]), number, dict(kwargs), stages))
        else:
            raise ValueError(f"env: cannot read {item!r}; give an id or a mapping with an 'id' key")
    return tuple(entries)


def _parse_stages(env_id: str, value: object) -> tuple[Mapping[str, str | int | float | bool], ...]:
    """Read an env entry's ``stages``: a list of kwargs mappings, easiest first."""
    if not isinstance(value, list | tuple) or not all(isinstance(s, Mapping) for s in value):
        raise ValueError(
            f"env: stages of {env_id} is {value!r}; give a list of kwargs overrides, easiest "
            "first, e.g. [{digits: 1}, {operands: 2}]"
        )
    return tuple(dict(stage) for stage in value)


def _validate(cfg: TrainConfig) -> list[str]:
    """List every problem with ``cfg`` as 'field: what is wrong; how to fix it'."""
    return [
        *_data_problems(cfg.data),
        *_rollout_problems(cfg.rollout),
        *_algorithm_problems(cfg.algorithm),
        *_optim_problems(cfg.optim),
        *_policy_problems(cfg.policy),
        *_run_problems(cfg.run),
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


def algorithm_notes(cfg: TrainConfig) -> list[str]:
    """Return advice on valid but probably unintended algorithm settings (logged at start).

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
