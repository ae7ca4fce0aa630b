"""The seven sections of a run's configuration: one frozen dataclass per concern.

What a field is, is written once, beside it: its type and default, its docstring (the help
``grpo train --help`` prints, ``loading.field_docs``) and its resume class in the annotation
(``Fixed[int]``: ``--resume`` refuses another value; ``Free``; ``Identity``; ``field_resume``).
Field names are unique across sections (``loading.field_owners``), so YAML files may be flat.

Why one module over 400 lines: most of it is the docstring under every field, which
``grpo train --help`` prints.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cache
from typing import Annotated, Literal, TypeVar, get_type_hints

from grpo_train.algorithm.choices import (
    Estimator,
    ImportanceLevel,
    LossType,
    ObjectiveSettings,
    ScaleRewards,
)


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
    hf_max_batch_size: Free[int] = 64
    """The ``hf`` engine: sequences (prompts x num_generations) decoded together; a step's
    others wait for the next chunk. Each holds a static KV cache of max_prompt_length +
    max_completion_length tokens. A chunk that runs out of GPU memory is decoded again in
    halves, and the rest of the run keeps the smaller size (a warning says so)."""
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
    within this time, naming it. Likewise for a colocated engine in processes of its own
    (``vllm_in_process: false``): the longest wait for its workers to read a bucket."""
    vllm_sync_bucket_mb: Free[float] = 256.0
    """Server mode: a weight sync streams the model in buffers of at most this many MiB (a
    tensor larger than that travels alone), on the trainer and on every replica, beside vLLM's
    share of the GPU; never one buffer of the whole model. A colocated engine in processes of
    its own (``vllm_in_process: false``) gets its syncs in files of this size in ``/dev/shm``,
    at most two at a time."""
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
    """Generate the next steps' rollouts while this step trains (``collect/pipeline.py``), with
    weights at most max_staleness updates old; needs an engine with its own weights (vllm, or
    vllm_mode server) in one process. Off: generate, then train, as always."""
    max_staleness: Free[int] = 1
    """async_generation: the most updates a trained sample's weights may lag the policy (0: the
    synchronous loop); batch k is generated with version k-1-max_staleness, older ones are
    dropped (async/dropped_groups) and generated again."""
    overlap_scoring: Free[bool] = True
    """Score each prompt's completions as soon as the engine has sampled its whole group, on a
    background thread while the rest generates, so a step with slow rewards (code tests) costs
    about max(generation, scoring) instead of their sum; same scores either way. The hf engine
    reports a group after each chunk of rows that completes it, a server per replica's share,
    the colocated vllm engine after the whole call. Off: score after generation. Multi-turn
    environments' episodes are collected as before (``collect.episodes``)."""

    @property
    def tensor_parallel(self) -> int:
        """Ranks per colocated engine: ``vllm_tensor_parallel_size`` in colocate mode, else 1."""
        return self.vllm_tensor_parallel_size if self.vllm_mode == "colocate" else 1


#: The objective's own defaults (``grpo_loss`` without a configuration): one source for both.
_OBJECTIVE = ObjectiveSettings()


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
    importance_sampling_level: Fixed[ImportanceLevel] = _OBJECTIVE.importance_sampling_level
    """Clipped ratio per ``token`` (GRPO), or per ``sequence``: GSPO's length-normalised
    sequence ratio, clipped per completion (arXiv:2507.18071; it changes the update only when
    mu > 1, and the paper clips at epsilon_low 3e-4, epsilon_high 4e-4)."""
    loss_type: Fixed[LossType] = _OBJECTIVE.loss_type
    """Aggregation: ``grpo`` (per-sequence mean), ``dr_grpo`` (sum / max length), ``dapo``
    (token mean over the batch)."""
    mu: Fixed[int] = 1
    """Optimizer updates per generated batch (num_iterations); > 1 reuses rollouts with clipping."""
    beta: Fixed[float] = _OBJECTIVE.beta
    """KL coefficient to the initial policy (k3 estimator); 0 loads no reference model."""
    epsilon_low: Fixed[float] = _OBJECTIVE.epsilon_low
    """Lower clip range: the ratio is clipped below at 1 - epsilon_low."""
    epsilon_high: Fixed[float] = _OBJECTIVE.epsilon_high
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


@dataclass(frozen=True)
class SandboxConfig:
    """Where the code environments run the model's programs (``grpo_envs.code.backend``)."""

    sandbox_backend: Free[Literal["local", "remote"]] = "local"
    """``local``: this machine's sandbox (one worker per CPU); ``remote``: the services at
    sandbox_urls (``grpo sandbox serve``, or a plain SandboxFusion), so that code rewards scale
    beyond the trainer's CPUs. A service that fails yields ``sandbox_error`` outcomes, never
    wrong answers, and max_reward_errors stops the run when a step has too many."""
    sandbox_urls: Free[str] = ""
    """Remote backend: comma-separated base URLs of the services, e.g.
    ``http://sandbox-a:8080,http://sandbox-b:8080`` (requests are spread over them, and a URL
    that fails is avoided for a while)."""
    sandbox_protocol: Free[Literal["grpo", "sandbox_fusion"]] = "grpo"
    """Remote backend: ``grpo`` (``grpo sandbox serve``: every code environment, verdicts decided
    by the service's sandbox) or ``sandbox_fusion`` (a plain SandboxFusion's ``/run_code``:
    stdin/stdout tasks only, their outputs judged by the trainer; function-call tasks such as
    HumanEval and MBPP are refused at start)."""
    sandbox_token_env: Free[str] = ""
    """Remote backend: the NAME of the environment variable holding the services' bearer token
    (never the token: this config is saved with the run); empty: no token."""
    sandbox_max_in_flight: Free[int] = 64
    """Remote backend: requests in flight at once over all URLs (and the threads scoring them)."""
    sandbox_retries: Free[int] = 3
    """Remote backend: tries after the first for one request (429 after its Retry-After, 5xx,
    connection errors, timeouts); other refusals are not retried."""
    sandbox_request_timeout_s: Free[float] = 0.0
    """Remote backend: the deadline of one request in seconds; 0: the job's own time limits plus
    10 s. A job gets twice its request's deadline over all its tries."""


SECTIONS: dict[str, type] = {
    "policy": PolicyConfig,
    "data": DataConfig,
    "rollout": RolloutConfig,
    "algorithm": AlgorithmConfig,
    "optim": OptimConfig,
    "run": RunConfig,
    "sandbox": SandboxConfig,
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
