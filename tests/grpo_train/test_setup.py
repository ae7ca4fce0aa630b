"""``grpo_train.setup``: the dtype full fine-tuning trains in, and the optimizer built for it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from grpo_train.config import ConfigError, OptimConfig, PolicyConfig, TrainConfig
from grpo_train.setup.run import (
    build_optimizer,
    load_run_policy,
    parameter_dtype,
    training_autocast,
)


def _config(model: Path, dtype: str, lora_r: int = 0) -> TrainConfig:
    base = TrainConfig()
    return dataclasses.replace(
        base,
        policy=PolicyConfig(model=str(model), dtype=dtype, lora_r=lora_r),  # type: ignore[arg-type]
        optim=OptimConfig(learning_rate=1e-6, warmup_steps=0),
    )


def _moved_fraction(cfg: TrainConfig, model_path: Path, steps: int = 5) -> dict[str, float]:
    """Train ``steps`` AdamW steps as a run would; return the fraction of changed elements."""
    from grpo_train.setup.settings import lora_settings

    model = load_run_policy(cfg, lora_settings(cfg), "cpu", str(model_path), None, None)[0]
    optimizer, _ = build_optimizer(cfg, model)
    trained = {n: p for n, p in model.named_parameters() if p.requires_grad and p.dim() == 2}
    before = {n: p.detach().clone() for n, p in trained.items()}
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (2, 24), generator=generator)
    for _ in range(steps):
        with training_autocast(cfg.policy, "cpu"):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return {n: (p.detach() != before[n]).float().mean().item() for n, p in trained.items()}


def test_bfloat16_full_fine_tuning_moves_every_weight_at_a_small_learning_rate(
    tiny_model_path: Path,
) -> None:
    """bfloat16 parameters would round a 1e-6 AdamW step away (under 1% of elements change);
    float32 master weights under bfloat16 autocast take it on (nearly all change)."""
    cfg = _config(tiny_model_path, "bfloat16")
    moved = _moved_fraction(cfg, tiny_model_path)
    assert min(moved.values()) > 0.9, sorted(moved.items(), key=lambda kv: kv[1])[:3]
    reference = _moved_fraction(_config(tiny_model_path, "float32"), tiny_model_path)
    assert min(reference.values()) > 0.9  # the same steps in float32, for comparison


def test_bfloat16_run_computes_in_bfloat16_over_float32_weights(tiny_model_path: Path) -> None:
    cfg = _config(tiny_model_path, "bfloat16")
    model = load_run_policy(cfg, None, "cpu", str(tiny_model_path), None, None)[0]
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    with training_autocast(cfg.policy, "cpu"):
        logits = model(input_ids=torch.tensor([[1, 2, 3]])).logits
    assert logits.dtype == torch.bfloat16


@pytest.mark.parametrize(
    ("dtype", "lora_r", "loaded"),
    [("bfloat16", 0, "float32"), ("float32", 0, "float32"), ("bfloat16", 8, "bfloat16"),
     ("float32", 8, "float32")],
)  # fmt: skip
def test_parameter_dtype(dtype: str, lora_r: int, loaded: str) -> None:
    policy = PolicyConfig(dtype=dtype, lora_r=lora_r)  # type: ignore[arg-type]
    assert parameter_dtype(policy) == loaded
    # float32 runs on CPU are never autocast (their tests compare results exactly)
    autocast = training_autocast(policy, "cpu")
    assert isinstance(autocast, torch.autocast) == (loaded != dtype)


# ------------------------------------------------------------------ attn_implementation


def _attention_config(model: Path, attention: str, lora_r: int = 0, beta: float = 0.0):
    from grpo_train.config import AlgorithmConfig

    base = _config(model, "float32", lora_r)
    policy = dataclasses.replace(base.policy, attn_implementation=attention)
    return dataclasses.replace(base, policy=policy, algorithm=AlgorithmConfig(beta=beta))


@pytest.mark.parametrize(
    ("attention", "loaded", "bins"),
    [("auto", "sdpa", True), ("sdpa", "sdpa", True), ("eager", "eager", True)],
)
@pytest.mark.parametrize("lora_r", [0, 4])
def test_attn_implementation_reaches_the_policy_the_reference_and_the_packing_choice(
    tiny_model_path: Path, attention: str, loaded: str, bins: bool, lora_r: int
) -> None:
    """The setting is what the loaded policy (and the KL reference) attend with, and what the
    update's packing choice reads (``ForwardCost``: bins under SDPA/eager, varlen none)."""
    from grpo_train.setup.run import _learner, _load_reference
    from grpo_train.setup.settings import lora_settings

    cfg = _attention_config(tiny_model_path, attention, lora_r, beta=0.1)
    lora = lora_settings(cfg)
    model, tokenizer = load_run_policy(cfg, lora, "cpu", str(tiny_model_path), None, None)[:2]
    assert model.config._attn_implementation == loaded
    reference = _load_reference(cfg, lora, "cpu", str(tiny_model_path))
    if lora is None:
        assert reference is not None and reference.config._attn_implementation == loaded
    learner = _learner(cfg, model, reference, tokenizer, "cpu", lora, None, False)
    assert (learner.forward_cost.bins, learner.forward_cost.varlen) == (bins, False)


@pytest.mark.parametrize("attention", ["flash_attention_2", "kernels-community/flash-attn2"])
def test_flash_attention_setting_reaches_from_pretrained_and_turns_bins_into_varlen_packing(
    tiny_model_path: Path, monkeypatch: pytest.MonkeyPatch, attention: str
) -> None:
    """On a GPU transformers dispatches the flash kernels from ``attn_implementation``; here
    only that dispatch is stood in for (the CPU has no flash kernels): the loader must hand the
    setting to ``from_pretrained``, and the update then packs with varlen kernels, no bins."""
    from transformers import AutoModelForCausalLM

    from grpo_train.setup.run import _learner

    real = AutoModelForCausalLM.from_pretrained
    asked: list[object] = []

    def dispatch_on_gpu(*args: object, **kwargs: object) -> object:
        asked.append(kwargs.get("attn_implementation"))
        kwargs["attn_implementation"] = "sdpa"
        model = real(*args, **kwargs)
        model.config._attn_implementation = attention  # what the GPU load would have set
        return model

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", dispatch_on_gpu)
    cfg = _attention_config(tiny_model_path, attention)
    model, tokenizer = load_run_policy(cfg, None, "cpu", str(tiny_model_path), None, None)[:2]
    assert asked == [attention]
    learner = _learner(cfg, model, None, tokenizer, "cpu", None, None, False)
    assert (learner.forward_cost.bins, learner.forward_cost.varlen) == (False, True)


# ------------------------------------------------------------ the components' settings


def test_each_components_settings_carry_the_configurations_values() -> None:
    from grpo_train.collect.learning_signal import AutoSettings
    from grpo_train.collect.training_prompts import PromptSettings
    from grpo_train.setup.settings import (
        auto_settings,
        collector_settings,
        prompt_format_for,
        prompt_settings,
        suite_settings,
    )

    cfg = TrainConfig.from_flat(
        {"num_generations": 4, "prompts_per_step": 3, "max_prompt_length": 100,
         "max_completion_length": 50, "max_turn_tokens": 20, "temperature": 0.7, "top_p": 0.9,
         "seed": 11, "seed_per_prompt": True, "template_breaks": "error",
         "history_policy": "rerender", "dynamic_sampling_rounds": 5,
         "curriculum_threshold": 0.4, "max_reward_errors": 0.25, "train_split": "dev",
         "online_filtering": True, "filter_retry_after": 4, "curriculum_window": 2,
         "eval_suites": "aime24", "eval_size": 7, "eval_suite_samples": 3,
         "system_prompt": "Be brief.", "chat_template_kwargs": "enable_thinking=false"}
    )  # fmt: skip
    collect = collector_settings(cfg)
    assert (collect.num_generations, collect.prompts_per_step, collect.seed) == (4, 3, 11)
    assert (collect.max_prompt_length, collect.max_completion_length) == (100, 50)
    assert (collect.max_turn_tokens, collect.temperature, collect.top_p) == (20, 0.7, 0.9)
    assert collect.seed_per_prompt and collect.fatal_template_breaks
    assert (collect.history_policy, collect.dynamic_sampling_rounds) == ("rerender", 5)
    assert (collect.curriculum_threshold, collect.max_reward_errors) == (0.4, 0.25)
    assert collect.tensor_parallel == 1
    assert prompt_settings(cfg.data) == PromptSettings("dev", 0.4, 2, True, 4)
    assert auto_settings(cfg).temperature == 0.7 and auto_settings(cfg).num_generations == 4
    suites = suite_settings(cfg)
    assert (suites.suites, suites.size, suites.samples, suites.temperature) == ("aime24", 7, 3, 0.7)
    fmt = prompt_format_for(cfg.data)
    assert fmt.system_prompt == "Be brief." and dict(fmt.chat_template_kwargs) == {
        "enable_thinking": False
    }
    # The settings' own defaults are the configuration's.
    assert auto_settings(TrainConfig()) == AutoSettings()
    assert prompt_settings(TrainConfig().data) == PromptSettings()


def test_run_log_settings_parse_wandb_tags_and_leave_wandb_off_unless_asked() -> None:
    from grpo_train.setup.settings import run_log_settings

    off = run_log_settings(TrainConfig.from_flat({"max_steps": 9, "progress": False}))
    assert (off.max_steps, off.progress, off.wandb) == (9, False, None)
    on = run_log_settings(TrainConfig.from_flat({"wandb": True, "wandb_tags": "a, b,,"}))
    assert on.wandb is not None and on.wandb.tags == ("a", "b")
    assert (
        on.wandb.project == "grpo-kit"
        and on.wandb.config
        == TrainConfig.from_flat({"wandb": True, "wandb_tags": "a, b,,"}).to_dict()
    )


def test_start_notes_explain_a_zero_loss_and_warn_about_gspo_without_reuse() -> None:
    from grpo_train.setup.settings import start_notes

    plain = start_notes(TrainConfig())
    assert len(plain.info) == 1 and "Why is the loss 0?" in plain.info[0] and not plain.warnings
    gspo = start_notes(
        TrainConfig.from_flat({"importance_sampling_level": "sequence", "beta": 0.1})
    )
    assert gspo.info == () and len(gspo.warnings) == 2


def test_a_folder_holding_another_run_is_refused_with_both_fixes(tmp_path: Path) -> None:
    from grpo_train.run.run_dir import clear_run_dir, other_run_problem
    from grpo_train.setup.settings import run_folder

    first = TrainConfig.from_flat({"output_dir": str(tmp_path), "seed": 0})
    assert other_run_problem(run_folder(first)) is None  # an empty folder
    first.save(tmp_path / "config.yaml")
    assert other_run_problem(run_folder(first)) is None  # the same run: a restart
    other = dataclasses.replace(first, run=dataclasses.replace(first.run, seed=1))
    problem = other_run_problem(run_folder(other))
    assert problem == (
        f"output_dir: {tmp_path} holds another run (its config.yaml differs: seed: 0 -> 1); "
        "add --resume to continue that run, --overwrite to replace it, or choose another "
        "--output_dir (leave it out for a new folder per run)"
    )
    overwrite = dataclasses.replace(other, run=dataclasses.replace(other.run, overwrite=True))
    assert other_run_problem(run_folder(overwrite)) is None
    (tmp_path / "metrics.jsonl").write_text("{}\n")
    (tmp_path / "notes.txt").write_text("mine\n")
    clear_run_dir(run_folder(overwrite))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_a_lone_process_of_a_cpu_launch_of_several_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from grpo_train.parallel import distributed
    from grpo_train.setup.run import _start_process

    monkeypatch.setenv("ACCELERATE_USE_CPU", "true")
    monkeypatch.setattr(distributed, "requested_processes", lambda cmdline: 2)
    assert "asked for --num_processes 2 but started 1 process" in str(distributed.launch_problem())
    with pytest.raises(ConfigError, match="--multi_gpu --num_processes 2"):
        _start_process(TrainConfig())


def test_a_lone_process_of_a_gpu_launch_of_several_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``accelerate launch --num_processes 2`` (or ``grpo launch``) without --multi_gpu on a
    machine with one GPU starts one process, silently; it is refused as on CPU."""
    from grpo_train.parallel import distributed

    monkeypatch.delenv("ACCELERATE_USE_CPU", raising=False)
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(distributed, "requested_processes", lambda cmdline: 2)
    problem = str(distributed.launch_problem())
    assert "asked for --num_processes 2 but started 1 process" in problem
    assert "this one has 1; launch one process per GPU (--num_processes 1)" in problem
    monkeypatch.setattr(distributed, "requested_processes", lambda cmdline: 1)
    assert distributed.launch_problem() is None


def test_a_deepspeed_clipping_other_than_max_grad_norm_is_refused_at_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """DeepSpeed clips inside its own step, at its ``gradient_clipping``: a launcher config that
    sets another number than max_grad_norm is refused before anything loads, naming both."""
    from types import SimpleNamespace

    import accelerate
    from accelerate.utils import DeepSpeedPlugin, DistributedType

    from grpo_train.setup.run import _start_process

    plugin = DeepSpeedPlugin(zero_stage=2, gradient_accumulation_steps=1, gradient_clipping=1.0)

    class DeepSpeedAccelerator:  # accelerate's under `accelerate launch` with such a config
        def __init__(self, **kwargs: object) -> None:
            self.state = SimpleNamespace(deepspeed_plugin=plugin)
            self.distributed_type = DistributedType.DEEPSPEED
            self.device = torch.device("cpu")

    monkeypatch.setattr(accelerate, "Accelerator", DeepSpeedAccelerator)
    cfg = TrainConfig.from_flat({"max_grad_norm": 0.5})
    with pytest.raises(ConfigError, match=r"max_grad_norm is 0.5 .*gradient_clipping: 1.0"):
        _start_process(cfg)
    assert plugin.deepspeed_config["gradient_clipping"] == 1.0  # left as the user set it


def test_a_bfloat16_runs_kl_reference_computes_exactly_as_the_policy_before_any_update(
    tiny_model_path: Path,
) -> None:
    """Full fine-tuning in bfloat16 keeps float32 master weights under bf16 autocast; the KL
    reference must be the same computation, or the KL is not 0 before the first update (a
    bfloat16 copy kept its residual stream and norms in bfloat16). Same weights, same autocast:
    equal logprobs, so KL 0 at step 0."""
    from grpo_train.learner.forward import token_logprobs
    from grpo_train.learner.micro_batches import make_micro_batches
    from grpo_train.setup.run import _learner, _load_reference

    cfg = dataclasses.replace(
        _config(tiny_model_path, "bfloat16"), algorithm=dataclasses.replace(
            TrainConfig().algorithm, beta=0.1
        ),
    )  # fmt: skip
    model, tokenizer = load_run_policy(cfg, None, "cpu", str(tiny_model_path), None, None)[:2]
    reference = _load_reference(cfg, None, "cpu", str(tiny_model_path))
    assert reference is not None
    assert {p.dtype for p in reference.parameters()} == {torch.float32}
    learner = _learner(cfg, model, reference, tokenizer, "cpu", None, None, False)
    assert learner.reference is not None
    completions = ((5, 6, 7, 8, 9, 10), (11, 12, 13))
    mb = make_micro_batches(((1, 2, 3, 4),) * 2, completions, 1000, pad_id=0)[0]
    with learner.autocast(), torch.no_grad():
        policy = token_logprobs(model, mb, 1.0, False, learner.share_prompts, learner.head)[0]
        under_reference = learner.reference(mb)
    assert torch.equal(policy.float(), under_reference.float())
