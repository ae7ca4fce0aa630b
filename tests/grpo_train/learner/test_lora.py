"""LoRA on the tiny model: trainable set, KL reference, merged weights, checkpoints."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from grpo_train.learner.forward import token_logprobs
from grpo_train.learner.lora import (
    LoraSettings,
    QLoraUnavailableError,
    apply_lora,
    load_adapter,
    qlora_quantization_config,
    reference_logprobs,
    reference_policy,
    save_adapter,
    save_merged,
    trainable_parameters,
    unwrap_peft,
)
from grpo_train.learner.micro_batches import MicroBatch, make_micro_batches
from grpo_train.learner.weight_export import export_state_dict, merge_lora_state_dict

SETTINGS = LoraSettings(lora_r=4, lora_alpha=8)


def _load(path: Path) -> Any:
    from grpo_train.models.loading import load_policy

    return load_policy(str(path))[0]


def _randomize_adapter(model: torch.nn.Module, seed: int = 1) -> None:
    """peft initialises B = 0 (the adapter starts as a no-op); give it a real update."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.05)


def _batch() -> MicroBatch:
    prompts = [[5, 6, 7, 8], [9, 10, 11]]
    completions = [[20, 21, 22], [30, 31, 32, 33, 34]]
    return make_micro_batches(prompts, completions, token_budget=10_000, pad_id=0)[0]


@pytest.fixture
def lora_model(tiny_model_path: Path) -> torch.nn.Module:
    model = apply_lora(_load(tiny_model_path), SETTINGS)
    _randomize_adapter(model)
    return model


def test_settings_validation() -> None:
    with pytest.raises(ValueError, match="lora_r"):
        LoraSettings(lora_r=0)
    with pytest.raises(ValueError, match="lora_dropout"):
        LoraSettings(lora_dropout=1.0)
    with pytest.raises(ValueError, match="target_modules"):
        LoraSettings(target_modules=())
    assert LoraSettings(lora_r=8, lora_alpha=16).scale == 2.0


def test_only_lora_parameters_train(tiny_model_path: Path) -> None:
    model = apply_lora(_load(tiny_model_path), SETTINGS)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    assert names and all(".lora_A." in n or ".lora_B." in n for n in names)
    # all-linear: every projection of both layers gets an adapter, the tied output head does not.
    assert sum(".lora_A." in n for n in names) == 2 * 7
    assert not any("lm_head" in n or "embed_tokens" in n for n in names)
    trainable, total = trainable_parameters(model)
    assert 0 < trainable < total / 5


def test_target_modules_subset_and_bad_name(tiny_model_path: Path) -> None:
    model = apply_lora(_load(tiny_model_path), LoraSettings(target_modules=("q_proj", "v_proj")))
    adapted = {
        n.split(".lora_A")[0].rsplit(".", 1)[1]
        for n, _ in model.named_parameters()
        if ".lora_A." in n
    }
    assert adapted == {"q_proj", "v_proj"}
    with pytest.raises(ValueError, match="target_modules"):
        apply_lora(_load(tiny_model_path), LoraSettings(target_modules=("no_such_proj",)))


def test_qlora_refuses_cleanly_without_cuda(tiny_model_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA present: QLoRA may run here")
    with pytest.raises(QLoraUnavailableError, match="CUDA"):
        qlora_quantization_config()
    with pytest.raises(QLoraUnavailableError, match="CUDA"):
        apply_lora(_load(tiny_model_path), LoraSettings(use_qlora=True))


@pytest.mark.parametrize(
    ("native", "policy", "expected"),
    [
        (False, "float32", torch.float32),  # V100 / T4: bfloat16 only emulated
        (True, "float32", torch.bfloat16),  # Ampere and later
        (False, "bfloat16", torch.bfloat16),  # asked for: as asked
    ],
)
def test_qlora_computes_in_bfloat16_only_on_a_gpu_that_has_it(
    monkeypatch: pytest.MonkeyPatch, native: bool, policy: str, expected: torch.dtype
) -> None:
    """The 4-bit base of a float32 policy computes in bfloat16 only where it is native.

    ``load_lora_policy`` hands ``load_quantized_base`` the compute dtype (the stand-in records
    it and stops the load); ``torch.cuda`` is stood in for: a GPU that makes bfloat16 tensors
    (so emulated bfloat16 passes), native only on ``native``.
    """
    import grpo_train.learner.lora as lora

    class Loaded(Exception):
        pass

    asked: list[torch.dtype] = []

    def record(path: str, compute_dtype: torch.dtype, *args: object) -> None:
        asked.append(compute_dtype)
        raise Loaded

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(
        torch.cuda,
        "is_bf16_supported",
        lambda including_emulation=True: native or including_emulation,
    )
    monkeypatch.setattr(lora, "require_qlora", lambda: None)
    monkeypatch.setattr(lora, "load_quantized_base", record)
    qlora = LoraSettings(lora_r=4, lora_alpha=8, use_qlora=True)
    with pytest.raises(Loaded):
        lora.load_lora_policy("org/model", qlora, dtype=policy, device="cuda:0")
    assert asked == [expected]
    assert lora.qlora_compute_dtype(policy, "cuda:0") == expected


def test_reference_is_base_model(tiny_model_path: Path, lora_model: torch.nn.Module) -> None:
    mb = _batch()
    base = _load(tiny_model_path)
    with torch.no_grad():
        expected = token_logprobs(base, mb)[0]
        adapted = token_logprobs(lora_model, mb)[0]
    ref = reference_logprobs(lora_model, mb)
    torch.testing.assert_close(ref, expected, rtol=0, atol=1e-5)
    assert (adapted - expected).abs().max() > 1e-3  # the adapter really changes the policy
    # The adapter is back on afterwards, and the reference carries no gradient.
    with torch.no_grad():
        torch.testing.assert_close(token_logprobs(lora_model, mb)[0], adapted)
    assert not ref.requires_grad
    with reference_policy(lora_model) as m:
        assert m is lora_model


def test_reference_through_a_wrapper(lora_model: torch.nn.Module) -> None:
    class Wrapper(torch.nn.Module):  # stands in for DDP: the peft model sits at `.module`
        def __init__(self, module: torch.nn.Module) -> None:
            super().__init__()
            self.module = module

        def forward(self, **kwargs: object) -> object:
            return self.module(**kwargs)

    wrapped = Wrapper(lora_model)
    assert unwrap_peft(wrapped) is lora_model
    torch.testing.assert_close(
        reference_logprobs(wrapped, _batch()), reference_logprobs(lora_model, _batch())
    )
    with pytest.raises(TypeError, match="peft model"):
        unwrap_peft(torch.nn.Linear(2, 2))


def test_merged_weights_give_the_adapter_logprobs(
    tiny_model_path: Path, lora_model: torch.nn.Module
) -> None:
    state = export_state_dict(lora_model)
    assert not any(
        "lora_" in k or k.startswith("base_model.") or ".base_layer." in k for k in state
    )
    plain = _load(tiny_model_path)
    assert set(state) <= set(plain.state_dict())
    missing, unexpected = plain.load_state_dict(state, strict=False)
    assert unexpected == [] and set(missing) <= {"lm_head.weight"}  # tied to the embeddings
    mb = _batch()
    with torch.no_grad():
        torch.testing.assert_close(
            token_logprobs(plain, mb)[0], token_logprobs(lora_model, mb)[0], rtol=0, atol=1e-5
        )


def test_merging_never_changes_the_model(lora_model: torch.nn.Module) -> None:
    before = {k: v.clone() for k, v in lora_model.state_dict().items()}
    first = export_state_dict(lora_model)
    for _ in range(10):
        again = export_state_dict(lora_model)
    after = lora_model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # bit for bit: no drift
    assert all(torch.equal(first[k], again[k]) for k in first)


def test_dequantizing_walk_matches_the_engine_merge(lora_model: torch.nn.Module) -> None:
    from grpo_train.learner.weight_export import _dequantized_merge, _merged_view_stream

    walked = dict(_dequantized_merge(lora_model))
    reference = dict(_merged_view_stream(lora_model))
    assert set(walked) == set(reference)
    for name, tensor in reference.items():
        torch.testing.assert_close(walked[name], tensor, rtol=0, atol=1e-6)


def test_state_dict_merge_matches_module_merge(lora_model: torch.nn.Module) -> None:
    from_state = merge_lora_state_dict(lora_model.state_dict(), SETTINGS.scale)
    from_module = export_state_dict(lora_model)
    # The state dict carries the tied output head too; the module merge emits it once.
    assert set(from_module) <= set(from_state)
    for name, tensor in from_module.items():
        torch.testing.assert_close(from_state[name], tensor, rtol=0, atol=1e-6)


def test_adapter_round_trip(
    tmp_path: Path, tiny_model_path: Path, lora_model: torch.nn.Module
) -> None:
    out = save_adapter(lora_model, tmp_path / "adapter")
    files = {p.name for p in out.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors"} <= files
    size = (out / "adapter_model.safetensors").stat().st_size
    assert size < sum(f.stat().st_size for f in tiny_model_path.glob("*.safetensors")) / 4
    reloaded = load_adapter(_load(tiny_model_path), out)
    mb = _batch()
    with torch.no_grad():
        torch.testing.assert_close(
            token_logprobs(reloaded, mb)[0], token_logprobs(lora_model, mb)[0], rtol=0, atol=1e-6
        )
    assert any(p.requires_grad for n, p in reloaded.named_parameters() if "lora_" in n)
    with pytest.raises(FileNotFoundError, match="adapter_config"):
        load_adapter(_load(tiny_model_path), tmp_path)


def test_save_merged_loads_in_transformers(
    tmp_path: Path, tiny_model_path: Path, lora_model: torch.nn.Module
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    out = save_merged(lora_model, tokenizer, tmp_path / "merged")
    loaded = AutoModelForCausalLM.from_pretrained(out)
    assert AutoTokenizer.from_pretrained(out).get_vocab() == tokenizer.get_vocab()
    mb = _batch()
    with torch.no_grad():
        torch.testing.assert_close(
            token_logprobs(loaded, mb)[0], token_logprobs(lora_model, mb)[0], rtol=0, atol=1e-5
        )
    assert not (out / "adapter_config.json").exists()


def test_load_lora_policy_fresh_and_resumed(
    tmp_path: Path, tiny_model_path: Path, lora_model: torch.nn.Module
) -> None:
    from grpo_train.learner.lora import load_lora_policy

    fresh, tokenizer = load_lora_policy(str(tiny_model_path), SETTINGS)
    assert tokenizer.padding_side == "left"
    assert all("lora_" in n for n, p in fresh.named_parameters() if p.requires_grad)
    mb = _batch()
    with torch.no_grad():  # fresh adapters start as a no-op (B = 0)
        torch.testing.assert_close(
            token_logprobs(fresh, mb)[0], reference_logprobs(fresh, mb), rtol=0, atol=1e-6
        )
    save_adapter(lora_model, tmp_path / "ckpt-model")
    resumed, _ = load_lora_policy(
        str(tiny_model_path), SETTINGS, adapter_dir=tmp_path / "ckpt-model"
    )
    with torch.no_grad():
        torch.testing.assert_close(
            token_logprobs(resumed, mb)[0], token_logprobs(lora_model, mb)[0], rtol=0, atol=1e-6
        )
    assert any(p.requires_grad for n, p in resumed.named_parameters() if "lora_" in n)


class Params4bit(torch.nn.Parameter):
    """Stand-in for bitsandbytes' 4-bit parameter, as far as the export reads one.

    peft recognises it by class name and dequantizes it with
    ``bitsandbytes.functional.dequantize_4bit(param.data, param.quant_state)``; here the stored
    data is the weight divided by a per-row scale (``quant_state``), so an export that skips
    dequantizing returns wrong values, and one that walks into the layer emits its name.
    """

    quant_state: torch.Tensor

    def __new__(cls, weight: torch.Tensor) -> Params4bit:
        scale = weight.abs().amax(dim=1, keepdim=True).clamp_min(1e-6)
        param = super().__new__(cls, weight.detach() / scale, requires_grad=False)
        param.quant_state = scale
        return param


def _fake_bitsandbytes(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    import types

    module = types.ModuleType("bitsandbytes")
    module.functional = types.SimpleNamespace(  # type: ignore[attr-defined]
        dequantize_4bit=lambda data, quant_state: data * quant_state
    )
    monkeypatch.setitem(sys.modules, "bitsandbytes", module)


def _quantize_linears(model: torch.nn.Module) -> None:
    """Give every base Linear (LoRA-wrapped or not) a 4-bit stand-in weight, as QLoRA loads it."""
    base: Any = unwrap_peft(model).get_base_model()
    for name, module in base.named_modules():
        if type(module) is torch.nn.Linear and ".lora_" not in name and name != "lm_head":
            module.weight = Params4bit(module.weight)
    base.is_loaded_in_4bit = True


@pytest.mark.parametrize("targets", ["all-linear", ("q_proj", "v_proj"), ("down_proj",)])
def test_quantized_export_has_exactly_the_base_model_names(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tiny_model_path: Path, targets: Any
) -> None:
    """A 4-bit base exports (engine sync and save_merged) under the base checkpoint's names
    only, dequantized and merged: no ``base_layer`` name, which vLLM's loader rejects."""
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    from grpo_train.learner.weight_export import is_quantized

    plain = _load(tiny_model_path)
    names = set(plain.state_dict()) - {"lm_head.weight"}  # tied: emitted once, as the embedding
    settings = LoraSettings(lora_r=4, lora_alpha=8, target_modules=targets)
    model = apply_lora(plain, settings)
    _randomize_adapter(model)
    expected = export_state_dict(model)
    _quantize_linears(model)
    _fake_bitsandbytes(monkeypatch)
    assert is_quantized(model)
    exported = export_state_dict(model)
    assert set(exported) == names == set(expected)
    for name, tensor in expected.items():
        torch.testing.assert_close(exported[name], tensor, rtol=1e-6, atol=1e-6)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    out = save_merged(model, tokenizer, tmp_path / "merged")
    saved = {k for f in out.glob("*.safetensors") for k in load_file(f)}
    assert saved == names


def test_export_stream_is_the_export_merged_one_layer_at_a_time(
    lora_model: torch.nn.Module,
) -> None:
    from unittest import mock

    from peft.tuners.lora import Linear as LoraLinear

    from grpo_train.learner.weight_export import _merge_lora_stream, export_stream

    with torch.no_grad():
        for name, p in lora_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    expected = export_state_dict(lora_model)
    real = LoraLinear.get_delta_weight
    with mock.patch.object(LoraLinear, "get_delta_weight", autospec=True, side_effect=real) as d:
        stream = export_stream(lora_model)
        first = next(stream)
        assert d.call_count <= 1  # no merged copy of the model before the first tensor
        got = dict([first, *stream])
    assert list(got) == list(expected)
    assert all(torch.equal(got[k], v) for k, v in expected.items())
    # The sharded path's stream merge equals the state-dict merge, whatever the order.
    state = lora_model.state_dict()
    streamed = dict(_merge_lora_stream(state.items(), 2.0))
    whole = merge_lora_state_dict(state, 2.0)
    assert set(streamed) == set(whole)
    assert all(torch.equal(streamed[k], v) for k, v in whole.items())
