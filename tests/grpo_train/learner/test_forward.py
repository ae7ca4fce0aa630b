"""The policy's forward pass over micro-batches: log-probs, shared prompts and their bins."""

import random

import pytest
import torch
from test_logprobs import _qwen3

from grpo_train.learner.forward import completion_hidden_states, token_logprobs
from grpo_train.learner.micro_batches import MicroBatch, make_micro_batches


class _FixedLogits(torch.nn.Module):
    """A stand-in model whose logits are a given (B, L, V) tensor (``logits_to_keep`` honoured)."""

    def __init__(self, logits: torch.Tensor) -> None:
        super().__init__()
        self.logits = logits

    def forward(self, logits_to_keep: int, **_: object) -> object:
        return type("Out", (), {"logits": self.logits[:, -logits_to_keep:]})()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_token_logprobs_and_entropy_match_the_softmax_definitions(temperature):
    torch.manual_seed(2)
    logits = torch.randn(2, 4, 7, requires_grad=True)  # (B, P + C, V) with P = 1, C = 3
    ids = torch.randint(0, 7, (2, 4))
    mb = MicroBatch(
        (0, 1),
        ids,
        torch.ones_like(ids),
        torch.arange(4).expand(2, 4),
        ids[:, 1:],
        torch.ones(2, 3),
    )
    logprobs, entropy = token_logprobs(_FixedLogits(logits), mb, temperature, with_entropy=True)
    scaled = logits[:, :-1] / temperature  # position t predicts token t + 1
    probs = torch.softmax(scaled, dim=-1)
    expected = torch.log(probs.gather(-1, ids[:, 1:, None]).squeeze(-1))
    torch.testing.assert_close(logprobs, expected)
    assert entropy is not None
    torch.testing.assert_close(entropy, -(probs * probs.log()).sum(-1))
    (g,) = torch.autograd.grad(logprobs.sum(), logits)
    (g_ref,) = torch.autograd.grad(expected.sum(), logits)
    torch.testing.assert_close(g, g_ref)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_shared_prompt_forward_gives_the_plain_logprobs_and_gradients(tiny_model_path, temperature):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path).train()
    calls: list[int] = []
    model.register_forward_hook(lambda *_: calls.append(1))
    prompts = [[5, 6, 7, 8]] * 3 + [[9, 10]] * 2 + [[11, 12, 13]]
    completions = [[20, 21, 22], [23], [24, 25, 26, 27], [28, 29], [30], [31, 32]]
    (mb,) = make_micro_batches(prompts, completions, 10**6, pad_id=0, group_prompts=True)
    got = {}
    for share in (False, True):
        model.zero_grad()
        calls.clear()
        lp, entropy = token_logprobs(model, mb, temperature, True, share_prompts=share)
        (lp * mb.completion_mask).sum().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        got[share] = (lp.detach(), entropy, grads, len(calls))
    on = mb.completion_mask.bool()
    assert got[False][3] == 1 and got[True][3] == 2  # plain: one forward; shared: prompts + rest
    torch.testing.assert_close(got[True][0][on], got[False][0][on], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got[True][1][on], got[False][1][on], atol=1e-5, rtol=1e-5)
    for name, grad in got[False][2].items():
        torch.testing.assert_close(got[True][2][name], grad, atol=1e-5, rtol=1e-4)


def _groups(vocab: int, seed: int) -> MicroBatch:
    """Three GRPO groups: prompts of 3, 7 and 12 tokens (left padding), each with a truncated
    completion and shorter ones (which share bins), one empty completion."""
    rng = random.Random(seed)
    prompts, completions = [], []
    for p_len, lengths in ((3, [24, 5, 11, 24, 2]), (7, [9, 24, 0]), (12, [13, 6, 4, 1])):
        prompt = [rng.randrange(1, vocab) for _ in range(p_len)]
        for n in lengths:
            prompts.append(prompt)
            completions.append([rng.randrange(1, vocab) for _ in range(n)])
    (mb,) = make_micro_batches(prompts, completions, 10**6, pad_id=0, group_prompts=True)
    return mb


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("arch", ["llama", "qwen3-152k"])
def test_shared_prompt_bins_give_the_plain_logprobs_entropy_and_gradients(
    tiny_model_path, attention, arch
):
    """Short completions of one prompt share a row of the shared forward (bins): each attends to
    the cached prompt and to itself only, so values and gradients are the plain forward's."""
    from transformers import AutoModelForCausalLM

    if arch == "llama":
        model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    else:
        model = _qwen3(vocab=151_936)  # Qwen3's real vocabulary size
    model.set_attn_implementation(attention)
    model.train()
    mb = _groups(int(model.config.vocab_size), seed=4)
    rows_run: list[int] = []
    model.register_forward_pre_hook(
        lambda _, args, kwargs: rows_run.append(kwargs["input_ids"].shape[0]), with_kwargs=True
    )
    got = {}
    for share in (False, True):
        model.zero_grad()
        rows_run.clear()
        lp, entropy = token_logprobs(model, mb, 0.7, True, share_prompts=share)
        (lp * mb.completion_mask).sum().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        got[share] = (lp.detach(), entropy, grads, list(rows_run))
    # 12 rows: plain runs them all; shared runs 3 prompts, then 6 bins (24 | 24 | 11+5+2,
    # 24 | 9+0, 13+6+4+1): 6 x 24 completion positions instead of 12 x 24
    assert got[False][3] == [12] and got[True][3] == [3, 6]
    on = mb.completion_mask.bool()
    assert on.sum() == 123
    torch.testing.assert_close(got[True][0][on], got[False][0][on], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got[True][1][on], got[False][1][on], atol=1e-5, rtol=1e-5)
    past_end = ~on[:, 1:]  # after each completion's first token, which the prompt predicts
    assert got[True][0][:, 1:][past_end].abs().max() == 0
    assert got[True][2].keys() == got[False][2].keys()
    for name, grad in got[False][2].items():  # float32 sums in another order: ~1e-6 relative
        assert (got[True][2][name] - grad).norm() <= 1e-5 * grad.norm(), name
        torch.testing.assert_close(got[True][2][name], grad, atol=1e-4, rtol=1e-4)


def test_shared_prompt_bins_give_the_plain_hidden_states(tiny_model_path):
    """The fused head and Liger's loss read the states predicting each completion token."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path).train()
    mb = _groups(int(model.config.vocab_size), seed=5)
    plain = completion_hidden_states(model, mb, share_prompts=False)
    shared = completion_hidden_states(model, mb, share_prompts=True)
    assert plain is not None and shared is not None and shared.shape == plain.shape
    on = mb.completion_mask.bool()
    torch.testing.assert_close(shared[on], plain[on], atol=1e-5, rtol=1e-5)


class _Stop(Exception):
    """Raised by a hook once the completions' forward has been called (its rows recorded)."""


@pytest.mark.parametrize(("attention", "rows"), [("sdpa", 6), ("flash_attention_2", 12)])
def test_shared_prompt_bins_need_an_attention_that_takes_a_custom_mask(
    tiny_model_path, attention, rows
):
    """Flash-attention kernels take no custom mask: there the completions keep their rows."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path).train()
    mb = _groups(int(model.config.vocab_size), seed=6)
    seen: list[int] = []

    def record(_: object, args: object, kwargs: dict[str, torch.Tensor]) -> None:
        seen.append(kwargs["input_ids"].shape[0])
        if len(seen) == 2:
            raise _Stop

    def switch(*_: object) -> None:  # after the prompts' forward (sdpa), before the choice
        model.config._attn_implementation = attention

    model.register_forward_pre_hook(record, with_kwargs=True)
    model.register_forward_hook(switch)
    with pytest.raises(_Stop):
        token_logprobs(model, mb, share_prompts=True)
    assert seen == [3, rows]
