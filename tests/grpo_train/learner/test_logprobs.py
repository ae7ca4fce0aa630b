"""Per-token log-probs without (tokens x vocabulary) float32 tensors: chunked and fused heads."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from memory_probe import peak_kib

from grpo_train.learner.forward import token_logprobs
from grpo_train.learner.logprobs import HeadChoice, chunked_logprobs, fused_logprobs, plain_logprobs
from grpo_train.learner.micro_batches import MicroBatch, make_micro_batches


def _qwen3(vocab: int = 1000, tied: bool = False, seed: int = 0, layers: int = 2) -> Any:
    """A tiny random Qwen3-architecture causal LM (float32, eval-free: dropout is 0)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        tie_word_embeddings=tied,
        max_position_embeddings=4096,
    )
    return Qwen3ForCausalLM(config).train()


def _batch(vocab: int, seed: int = 1) -> MicroBatch:
    """Rows of different prompt and completion lengths: left and right padding, one masked row."""
    gen = torch.Generator().manual_seed(seed)

    def ids(n: int) -> list[int]:
        return torch.randint(3, vocab, (n,), generator=gen).tolist()

    prompts = [ids(5), ids(3), ids(5), ids(7)]
    completions = [ids(11), ids(4), ids(9), ids(1)]
    (mb,) = make_micro_batches(prompts, completions, 10**6, pad_id=0)
    return mb


def _loss(logprobs: torch.Tensor, mb: MicroBatch) -> torch.Tensor:
    """A loss that weighs every token differently, zero on padding (and on one masked row)."""
    weights = torch.linspace(-1.0, 2.0, logprobs.numel()).view_as(logprobs)
    mask = mb.completion_mask.float()
    mask[1] = 0.0  # a row whose tokens are all masked out
    return (logprobs * weights * mask).sum()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk", [1, 3, 7, 64])  # 3, 7 divide no length; 64 >= every length
def test_chunked_logprobs_are_bitwise_the_plain_formula(dtype, temperature, chunk) -> None:
    torch.manual_seed(0)
    logits = (torch.randn(3, 13, 257) * 4).to(dtype).requires_grad_(True)  # (B, L, V)
    ids = torch.randint(0, 257, (3, 12))
    upstream = torch.randn(3, 12)
    plain, plain_entropy = plain_logprobs(logits[:, :-1], ids, temperature, True)
    (plain_grad,) = torch.autograd.grad((plain * upstream).sum(), logits)
    chunked, entropy = chunked_logprobs(logits, ids, temperature, True, chunk=chunk)
    (chunked_grad,) = torch.autograd.grad((chunked * upstream).sum(), logits)
    assert chunked.dtype == torch.float32 and chunked_grad.dtype == dtype
    assert torch.equal(chunked, plain)
    assert entropy is not None and plain_entropy is not None
    assert torch.equal(entropy, plain_entropy)
    assert torch.equal(chunked_grad, plain_grad)
    assert not chunked_grad[:, -1].any()  # the last column predicts nothing


def test_chunked_logprobs_offset_and_no_grad() -> None:
    logits = torch.randn(2, 6, 11)
    ids = torch.randint(0, 11, (2, 3))
    with torch.no_grad():
        got, entropy = chunked_logprobs(logits, ids, 1.0, False, start=2, chunk=2)
    assert entropy is None and not got.requires_grad
    assert torch.equal(got, plain_logprobs(logits[:, 2:5], ids, 1.0, False)[0])
    empty, _ = chunked_logprobs(logits, ids[:, :0], 1.0, True)
    assert empty.shape == (2, 0)


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    out = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return out


def _plain(model: Any, mb: MicroBatch, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The update's previous formula: the full logits, their float32 log-softmax kept."""
    c_len = mb.completion_ids.shape[1]
    out = model(
        input_ids=mb.input_ids,
        attention_mask=mb.attention_mask,
        position_ids=mb.position_ids,
        logits_to_keep=c_len + 1,
        use_cache=False,
    )
    lp, ent = plain_logprobs(out.logits[:, :-1], mb.completion_ids, temperature, True)
    assert ent is not None
    return lp, ent


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_model_chunked_head_is_bitwise_the_previous_update(dtype, temperature) -> None:
    model = _qwen3().to(dtype)
    mb = _batch(1000)
    lp_ref, ent_ref = _plain(model, mb, temperature)
    _loss(lp_ref, mb).backward()
    reference = _grads(model)
    lp, ent = token_logprobs(model, mb, temperature, True, head=HeadChoice("chunked"))
    _loss(lp, mb).backward()
    got = _grads(model)
    assert torch.equal(lp, lp_ref) and ent is not None and torch.equal(ent, ent_ref)
    assert set(got) == set(reference)
    for name, grad in reference.items():
        assert torch.equal(got[name], grad), name


#: The fused head's stated tolerances against the plain formula: float32 differs only by the
#: chunked matmul's and the chunk-summed weight gradient's rounding; bfloat16 by its own.
FUSED_TOL = {
    torch.float32: {"rtol": 1e-5, "atol": 1e-5},
    torch.bfloat16: {"rtol": 2e-2, "atol": 2e-2},
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_fused_head_matches_within_tolerance(dtype, tied, temperature) -> None:
    model = _qwen3(tied=tied).to(dtype)
    mb = _batch(1000)
    lp_ref, ent_ref = _plain(model, mb, temperature)
    _loss(lp_ref, mb).backward()
    reference = _grads(model)
    calls: list[Any] = []
    model.lm_head.register_forward_hook(lambda _m, _i, out: calls.append(out.shape))
    lp, ent = token_logprobs(model, mb, temperature, True, head=HeadChoice("fused"))
    # the model's own forward kept one position; the rest are chunks of the fused head
    assert calls[0][1] == 1
    _loss(lp, mb).backward()
    got = _grads(model)
    on = mb.completion_mask.bool()
    tol = FUSED_TOL[dtype]
    torch.testing.assert_close(lp[on], lp_ref[on], **tol)
    assert ent is not None
    torch.testing.assert_close(ent[on], ent_ref[on], **tol)
    assert set(got) == set(reference)
    if tied:
        assert "lm_head.weight" not in got and "model.embed_tokens.weight" in got
    for name, grad in reference.items():
        scale = float(grad.abs().max()) + 1e-12
        err = float((got[name].float() - grad.float()).abs().max())
        assert err <= tol["rtol"] * scale * 10 + tol["atol"] * 0.1, (name, err, scale)


def test_fused_head_chunks_and_shared_prompts_agree() -> None:
    model = _qwen3()
    prompts = [[5, 6, 7, 8]] * 3 + [[9, 10]] * 2
    completions = [[20, 21, 22], [23], [24, 25, 26, 27], [28, 29], [30]]
    (mb,) = make_micro_batches(prompts, completions, 10**6, pad_id=0, group_prompts=True)
    results = []
    for share in (False, True):
        lp, ent = token_logprobs(model, mb, 0.8, True, share, HeadChoice("fused"))
        lp_c, _ = token_logprobs(model, mb, 0.8, False, share, HeadChoice("chunked"))
        results.append((lp.detach(), ent, lp_c.detach()))
    on = mb.completion_mask.bool()
    for lp, ent, lp_c in results:
        torch.testing.assert_close(lp[on], results[0][2][on], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(lp_c[on], results[0][2][on], rtol=1e-5, atol=1e-5)
        assert ent is not None and bool((ent[on] > 0).all())
    head = model.lm_head
    hidden = torch.randn(2, 9, 64)
    ids = torch.randint(0, 1000, (2, 8))
    whole, _ = fused_logprobs(head, hidden, ids, 1.0, False, vocab=1000, chunk=100)
    for chunk in (1, 3, 5):
        part, _ = fused_logprobs(head, hidden, ids, 1.0, False, vocab=1000, chunk=chunk)
        torch.testing.assert_close(part, whole, rtol=1e-6, atol=1e-6)
    plain, _ = plain_logprobs(head(hidden[:, :-1]), ids, 1.0, False)
    torch.testing.assert_close(whole, plain, rtol=1e-6, atol=1e-6)


def test_fused_head_with_lora_on_the_lm_head_and_the_kl_reference() -> None:
    from grpo_train.learner.lora import LoraSettings, apply_lora, reference_logprobs

    model = _qwen3()
    targets = ("q_proj", "lm_head")
    lora = apply_lora(model, LoraSettings(lora_r=4, lora_alpha=8, target_modules=targets))
    for name, param in lora.named_parameters():  # B starts at 0: give the adapter an effect
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.05)
    mb = _batch(1000)
    lp_ref, _ = _plain(lora, mb, 1.0)
    _loss(lp_ref, mb).backward()
    reference = _grads(lora)
    lp, _ = token_logprobs(lora, mb, 1.0, False, head=HeadChoice("fused"))
    _loss(lp, mb).backward()
    got = _grads(lora)
    assert any("lm_head" in n for n in got) and set(got) == set(reference)
    for name, grad in reference.items():
        torch.testing.assert_close(got[name], grad, rtol=1e-4, atol=1e-6, msg=name)
    on = mb.completion_mask.bool()
    fused_ref = reference_logprobs(lora, mb, 1.0, HeadChoice("fused"))
    chunked_ref = reference_logprobs(lora, mb, 1.0, HeadChoice("chunked"))
    torch.testing.assert_close(fused_ref[on], chunked_ref[on], rtol=1e-5, atol=1e-5)
    assert float((fused_ref - lp.detach())[on].abs().max()) > 1e-4  # adapter off: another policy


@pytest.mark.parametrize("frozen", [True, False])
def test_fused_head_backward_allocates_no_weight_gradient_for_a_frozen_head(frozen) -> None:
    """LoRA leaves the lm_head frozen, and the fused head's backward still made a (V, H)
    float32 gradient buffer for it (2.2 GB for a 7B model's head, on the GPU beside the
    activations, at every micro-batch). The tensors the backward allocates are recorded by a
    dispatch mode (the CPU has no GPU memory counter); the gradients stay the same."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Allocations(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.shapes: list[tuple[int, ...]] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func.overloadpacket in (torch.ops.aten.zeros, torch.ops.aten.empty):
                self.shapes.append(tuple(out.shape))
            return out

    head = torch.nn.Linear(64, 1000)
    head.requires_grad_(not frozen)
    hidden = torch.randn(2, 9, 64, requires_grad=True)
    ids = torch.randint(0, 1000, (2, 8))
    logprobs, _ = fused_logprobs(head, hidden, ids, 1.0, False, vocab=1000, chunk=3)
    allocations = Allocations()
    with allocations:
        logprobs.sum().backward()
    weight_sized = [s for s in allocations.shapes if s in ((1000, 64), (1000,))]
    assert weight_sized == ([] if frozen else [(1000, 64), (1000,)])
    plain, _ = plain_logprobs(head(hidden[:, :-1]), ids, 1.0, False)
    expected = torch.autograd.grad(plain.sum(), hidden)[0]
    assert hidden.grad is not None
    torch.testing.assert_close(hidden.grad, expected, rtol=1e-5, atol=1e-6)
    assert (head.weight.grad is None) == frozen


def test_a_model_whose_logits_are_not_its_head_output_uses_the_chunked_path() -> None:
    model = _qwen3()
    real_forward = model.forward

    def capped(*args: Any, **kwargs: Any) -> Any:  # a soft-capped head (as Gemma 2 has)
        out = real_forward(*args, **kwargs)
        out.logits = torch.tanh(out.logits / 0.5) * 0.5
        return out

    model.forward = capped
    mb = _batch(1000)
    lp, _ = token_logprobs(model, mb, 1.0, False, head=HeadChoice("fused"))
    expected, _ = token_logprobs(model, mb, 1.0, False, head=HeadChoice("chunked"))
    assert torch.equal(lp, expected)


def test_head_choice_validates_and_reads_the_config() -> None:
    from grpo_train.config import TrainConfig
    from grpo_train.setup.settings import head_choice

    with pytest.raises(ValueError, match="auto, chunked, fused or liger"):
        HeadChoice("triton")  # type: ignore[arg-type]
    cfg = TrainConfig.from_flat({"logprob_head": "fused", "fused_head_above_mib": 1})
    assert head_choice(cfg) == HeadChoice("fused", 1)
    assert head_choice(TrainConfig()) == HeadChoice()  # the defaults are the configuration's
    # auto: 256 MiB of float32 logits: 441 tokens of Qwen's vocabulary
    assert not HeadChoice().fuses(441, 151_936) and HeadChoice().fuses(442, 151_936)


_PEAK_SCRIPT = r"""
from grpo_train.learner.logprobs import HeadChoice
from grpo_train.learner.forward import token_logprobs
from grpo_train.learner.micro_batches import make_micro_batches

length, path = int(sys.argv[1]), sys.argv[2]
model = Qwen3ForCausalLM(tiny_qwen3(length + 64)).train()
ids = torch.randint(3, 151936, (length + 16,)).tolist()
(mb,) = make_micro_batches([ids[:16]], [ids[16:]], 10**9, pad_id=0)
before = start_peak()
lp, _ = token_logprobs(model, mb, 1.0, True, head=HeadChoice(path))
(lp * mb.completion_mask).sum().backward()
print(json.dumps({"kib": high_water_kib() - before}))
"""


@pytest.mark.slow
def test_peak_memory_per_completion_token_is_bounded() -> None:
    """Peak resident set of one forward + backward on Qwen's 151,936-row vocabulary, per process.

    The previous formula cost about four float32 vocabulary rows (4 x 594 KiB) per completion
    token, the chunked head two (the logits and their gradient); the default (``auto``: the
    fused head at these lengths) must stay within an eighth of one row.
    """
    short, long = 512, 1024
    assert HeadChoice().fuses(short, 151_936)
    growth = (peak_kib(_PEAK_SCRIPT, long, "auto") - peak_kib(_PEAK_SCRIPT, short, "auto")) / (
        long - short
    )
    assert growth <= 74, f"{growth:.1f} KiB per completion token"


def _skewed(vocab: int, seed: int = 3) -> tuple[list[list[int]], list[list[int]]]:
    gen = torch.Generator().manual_seed(seed)

    def ids(n: int) -> list[int]:
        return torch.randint(3, vocab, (n,), generator=gen).tolist()

    prompts = [ids(n) for n in (6, 6, 4, 9, 3)]
    completions = [ids(n) for n in (40, 1, 7, 25, 12)]
    return prompts, completions


def test_packed_micro_batches_hold_real_tokens_within_the_budget() -> None:
    prompts, completions = _skewed(1000)
    batches = make_micro_batches(prompts, completions, 48, pad_id=0, packed=True)
    seen = sorted(r for mb in batches for r in mb.rows)
    assert seen == list(range(5))
    for mb in batches:
        assert mb.targets is not None and mb.input_ids.shape[0] == 1
        sizes = [len(prompts[r]) + len(completions[r]) for r in mb.rows]
        assert mb.input_ids.shape[1] == sum(sizes) and (sum(sizes) <= 48 or len(sizes) == 1)
        assert int(mb.completion_mask.sum()) == mb.targets.numel()
        # each target column's next token is the completion token it predicts
        on = mb.completion_mask.bool()
        assert torch.equal(mb.input_ids[0, mb.targets + 1], mb.completion_ids[on])
        starts = (mb.position_ids[0] == 0).nonzero().flatten().tolist()
        assert starts == [sum(sizes[:k]) for k in range(len(sizes))]
    with pytest.raises(ValueError, match="non-empty prompt"):
        make_micro_batches([[]], [[1]], 48, pad_id=0, packed=True)


def _packed_vs_padded(model: Any, use_cache: bool, head: str = "chunked") -> dict[str, Any]:
    from grpo_train.learner.forward import _packed_logprobs, output_layer

    prompts, completions = _skewed(1000)
    (padded,) = make_micro_batches(prompts, completions, 10**6, pad_id=0)
    (packed,) = make_micro_batches(prompts, completions, 10**6, pad_id=0, packed=True)
    assert packed.rows != padded.rows  # another row order: compared in the batch's order
    on = torch.zeros(len(prompts), max(map(len, completions)), dtype=torch.bool)
    for r, c in enumerate(completions):
        on[r, : len(c)] = True
    weights = torch.linspace(-1.0, 2.0, on.numel()).view(on.shape) * on
    results = {}
    for name, mb in (("padded", padded), ("packed", packed)):
        rows = list(mb.rows)
        if name == "packed":
            lp, ent = _packed_logprobs(
                model, mb, 0.9, True, HeadChoice(head), output_layer(model), 1000, use_cache
            )
        else:
            lp, ent = token_logprobs(model, mb, 0.9, True, head=HeadChoice(head))
        order = torch.tensor(rows).argsort()  # back to the full batch's row order
        lp, ent = lp[order], ent[order] if ent is not None else None
        (lp * weights).sum().backward()
        results[name] = (lp.detach()[on], ent[on] if ent is not None else None, _grads(model))
    return results


@pytest.mark.parametrize("head", ["chunked", "fused"])
def test_packed_equals_padded_within_tolerance(head: str) -> None:
    results = _packed_vs_padded(_qwen3(), use_cache=False, head=head)
    (lp, ent, grads), (lp_ref, ent_ref, grads_ref) = results["packed"], results["padded"]
    torch.testing.assert_close(lp, lp_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent, ent_ref, rtol=1e-5, atol=1e-5)
    assert set(grads) == set(grads_ref)
    for name, grad in grads_ref.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-5, msg=name)


def test_a_packed_forward_with_the_cache_on_lets_rows_attend_to_each_other() -> None:
    """transformers derives the packed mask only without a cache: with one, it is wrong."""
    results = _packed_vs_padded(_qwen3(), use_cache=True)
    with pytest.raises(AssertionError):
        torch.testing.assert_close(results["packed"][0], results["padded"][0], rtol=1e-5, atol=1e-5)
