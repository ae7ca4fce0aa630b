import math
import random

import pytest
import torch
from test_logprobs import _qwen3

from grpo_train.learner.loss import (
    ForwardCost,
    MicroBatch,
    completion_bins,
    completion_hidden_states,
    grpo_loss,
    loss_share,
    make_micro_batches,
    packing_pays,
    rows_with_gradient,
    token_logprobs,
    truncated_is_weights,
)

RATIOS = torch.tensor([[1.0, 1.5, 0.5], [1.1, 0.7, 2.0]])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
ADV = torch.tensor([1.0, -1.0])
# Hand computation, epsilon_low 0.2, epsilon_high 0.28 (per-token -min(r A, clip(r) A)):
# row 0 (A=+1): r=1 -> -1; r=1.5 -> clip 1.28 -> -1.28; third token masked
# row 1 (A=-1): r=1.1 -> 1.1; r=0.7 -> min(-0.7, -0.8) -> 0.8; r=2.0 -> min(-2, -1.28) -> 2.0
ROW0, ROW1 = [-1.0, -1.28], [1.1, 0.8, 2.0]


def _loss(loss_type, **kw):
    old = torch.zeros_like(RATIOS)
    return grpo_loss(
        RATIOS.log(), old, ADV, MASK, epsilon_low=0.2, epsilon_high=0.28, loss_type=loss_type, **kw
    )


def test_dapo_is_the_token_mean_over_the_batch():
    loss, _ = _loss("dapo")
    assert loss.item() == pytest.approx(sum(ROW0 + ROW1) / 5)


def test_grpo_is_sequence_mean_then_batch_mean():
    loss, _ = _loss("grpo")
    assert loss.item() == pytest.approx((sum(ROW0) / 2 + sum(ROW1) / 3) / 2)


def test_dr_grpo_divides_the_token_sum_by_max_length():
    loss, _ = _loss("dr_grpo", max_completion_length=4)
    assert loss.item() == pytest.approx(sum(ROW0 + ROW1) / (2 * 4))
    with pytest.raises(ValueError, match="max_completion_length"):
        _loss("dr_grpo")


def test_clip_and_ratio_metrics():
    _, m = _loss("dapo")
    assert m["clip_frac_low"] == pytest.approx(1 / 5)  # row 1, r=0.7 with A<0
    assert m["clip_frac_high"] == pytest.approx(1 / 5)  # row 0, r=1.5 with A>0 (r=2.0 has A<0)
    assert m["clip_frac"] == pytest.approx(2 / 5)
    assert m["ratio_mean"] == pytest.approx((1 + 1.5 + 1.1 + 0.7 + 2.0) / 5)
    assert m["ratio_min"] == pytest.approx(0.7)
    assert m["ratio_max"] == pytest.approx(2.0)  # the masked 0.5 is ignored
    assert m["kl"] == 0.0


def test_on_policy_gradient_is_minus_advantage_per_token():
    # mu = 1, beta = 0: ratio is 1, the loss value is the token-weighted -mean(A), and the gradient
    # wrt each token's logprob is -A / tokens (the "loss is 0 but it learns" case of the README).
    lp = torch.zeros(2, 3, requires_grad=True)
    adv = torch.tensor([1.0, -1.0])
    mask = torch.ones(2, 3)
    loss, _ = grpo_loss(lp, lp.detach(), adv, mask, loss_type="dapo")
    assert loss.item() == pytest.approx(0.0)
    loss.backward()
    assert lp.grad.tolist() == [[pytest.approx(-1 / 6)] * 3, [pytest.approx(1 / 6)] * 3]


def test_k3_kl_term():
    lp = torch.zeros(1, 2)
    ref = torch.tensor([[math.log(2.0), 0.0]])
    loss, m = grpo_loss(lp, lp, torch.zeros(1), torch.ones(1, 2), ref_logprobs=ref, beta=0.5)
    k3 = 2.0 - math.log(2.0) - 1.0  # exp(d) - d - 1 with d = log 2
    assert m["kl"] == pytest.approx(k3 / 2)
    assert loss.item() == pytest.approx(0.5 * k3 / 2)
    with pytest.raises(ValueError, match="ref_logprobs"):
        grpo_loss(lp, lp, torch.zeros(1), torch.ones(1, 2), beta=0.1)


def test_importance_weights_scale_each_token():
    lp = torch.zeros(1, 2)
    w = torch.tensor([[2.0, 0.5]])
    loss, _ = grpo_loss(lp, lp, torch.tensor([1.0]), torch.ones(1, 2), importance_weights=w)
    assert loss.item() == pytest.approx(-(2.0 + 0.5) / 2)


def test_truncated_is_weights_cap_and_metrics():
    old = torch.zeros(1, 3)
    sampled = torch.log(torch.tensor([[0.5, 0.1, 1.0]]))
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    w, m = truncated_is_weights(old, sampled, mask, cap=3.0)
    assert w[0, :2].tolist() == [pytest.approx(2.0), pytest.approx(3.0)]
    assert m["is_ratio_max"] == pytest.approx(10.0)
    assert m["is_ratio_mean"] == pytest.approx(6.0)
    assert m["is_capped_frac"] == pytest.approx(0.5)


def test_shape_errors_name_the_problem():
    with pytest.raises(ValueError, match="same"):
        grpo_loss(torch.zeros(2, 3), torch.zeros(2, 2), torch.zeros(2), torch.ones(2, 3))
    with pytest.raises(ValueError, match=r"advantages must have shape"):
        grpo_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(3), torch.ones(2, 3))


@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "dr_grpo"])
def test_micro_batch_shares_reproduce_the_full_batch_loss(loss_type):
    torch.manual_seed(0)
    lp, old = torch.randn(4, 5) * 0.1, torch.randn(4, 5) * 0.1
    adv = torch.randn(4)
    mask = torch.tensor(
        [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [1, 1, 1, 1, 0]]
    ).float()
    kw = {"loss_type": loss_type, "max_completion_length": 5}
    full, _ = grpo_loss(lp, old, adv, mask, **kw)
    parts = 0.0
    for rows in ([0, 2], [1, 3]):
        part, _ = grpo_loss(lp[rows], old[rows], adv[rows], mask[rows], **kw)
        parts += part.item() * loss_share(loss_type, mask[rows], int(mask.sum()), 4)
    assert parts == pytest.approx(full.item(), rel=1e-5)


def test_micro_batches_pad_prompts_left_and_completions_right():
    prompts = [[5, 6, 7], [8], [9, 10]]
    completions = [[1, 2], [3, 4, 4, 4], [2]]
    batches = make_micro_batches(prompts, completions, token_budget=10, pad_id=0)
    assert sorted(r for b in batches for r in b.rows) == [0, 1, 2]
    for b in batches:
        assert b.input_ids.numel() <= 10 or len(b.rows) == 1
        for k, row in enumerate(b.rows):
            c = completions[row]
            assert b.completion_ids[k, : len(c)].tolist() == c
            assert b.completion_mask[k].sum().item() == len(c)
            p_len = b.input_ids.shape[1] - b.completion_ids.shape[1]
            assert b.input_ids[k, p_len - len(prompts[row]) : p_len].tolist() == prompts[row]
            first = p_len - len(prompts[row])
            assert b.position_ids[k, first].item() == 0  # positions count from the first real token


def test_rows_with_gradient_skips_zero_advantages_only_without_kl():
    adv = torch.tensor([0.5, 0.0, -0.5, 0.2, 0.0])
    weights = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0])  # row 3: masked (e.g. truncated)
    assert rows_with_gradient(adv, weights, beta=0.0) == [0, 2]
    assert rows_with_gradient(adv, weights, beta=0.1) == [0, 1, 2, 4]  # the KL term has a gradient
    # Nothing to learn: one row still runs (a zero gradient for every parameter, DDP in step).
    assert rows_with_gradient(torch.zeros(3), torch.ones(3), beta=0.0) == [0]
    assert rows_with_gradient(torch.zeros(0), torch.ones(0), beta=0.0) == []


def test_zero_advantage_rows_add_nothing_to_the_loss_or_its_gradient():
    # The premise of rows_with_gradient, on the loss itself: with beta = 0, dropping the rows with
    # A = 0 and weighting by the full batch's counts gives the same loss and gradient, whatever
    # their ratios (mu > 1) and importance weights.
    torch.manual_seed(1)
    lp = (torch.randn(4, 3) * 0.3).requires_grad_(True)
    old, iw = torch.randn(4, 3) * 0.3, torch.rand(4, 3) + 0.5
    adv = torch.tensor([1.0, 0.0, -2.0, 0.0])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 1]]).float()
    for loss_type in ("dapo", "grpo", "dr_grpo"):
        kw = {"loss_type": loss_type, "max_completion_length": 3}
        full, _ = grpo_loss(lp, old, adv, mask, importance_weights=iw, **kw)
        (g_full,) = torch.autograd.grad(full, lp)
        rows = rows_with_gradient(adv, torch.ones(4), beta=0.0)
        part, _ = grpo_loss(
            lp[rows], old[rows], adv[rows], mask[rows], importance_weights=iw[rows], **kw
        )
        part = part * loss_share(loss_type, mask[rows], int(mask.sum()), 4)
        (g_part,) = torch.autograd.grad(part, lp)
        assert part.item() == pytest.approx(full.item(), rel=1e-6)
        torch.testing.assert_close(g_part, g_full)


def test_make_micro_batches_select_keeps_full_batch_row_indices():
    prompts, completions = [[5], [6, 7], [8], [9]], [[1], [2, 3], [4], [5, 6]]
    batches = make_micro_batches(prompts, completions, 100, pad_id=0, select=[1, 3])
    assert [b.rows for b in batches] == [(3, 1)]  # shortest first
    assert batches[0].completion_ids.tolist() == [[5, 6], [2, 3]]


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


@pytest.mark.parametrize(
    ("lengths", "owners", "capacity", "expected"),
    [
        ([64, 20, 30, 64, 10, 50], [0, 0, 0, 1, 1, 1], 64, [[0], [2, 1], [3], [5, 4]]),
        ([3, 3, 3], [0, 0, 0], 3, [[0], [1], [2]]),  # all full: one bin per row
        ([1, 1, 1, 1], [0, 0, 0, 0], 4, [[0, 1, 2, 3]]),
        ([2, 2, 2], [0, 1, 0], 4, [[0, 2], [1]]),  # rows of another prompt never join
        ([0, 4, 0], [0, 0, 0], 4, [[1, 0, 2]]),  # empty completions take no room
    ],
)
def test_completion_bins_hand_cases(lengths, owners, capacity, expected):
    assert completion_bins(lengths, owners, capacity) == expected


def test_completion_bins_hold_each_row_once_within_capacity_and_one_prompt():
    rng = random.Random(3)
    for _ in range(200):
        n = rng.randint(1, 40)
        lengths = [rng.randint(0, 50) for _ in range(n)]
        owners = [rng.randint(0, 4) for _ in range(n)]
        capacity = max(lengths) or 1
        bins = completion_bins(lengths, owners, capacity)
        assert sorted(r for b in bins for r in b) == list(range(n))
        assert all(sum(lengths[r] for r in b) <= capacity for b in bins)
        assert all(len({owners[r] for r in b}) == 1 for b in bins)
        # never more token positions than the padded rows: one bin per row at worst
        assert len(bins) <= n


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


@pytest.mark.parametrize(
    ("attention", "varlen", "bins"),
    [("sdpa", False, True), ("eager", False, True), ("flash_attention_2", True, False)],
)
def test_forward_cost_knows_where_completions_share_bins(attention, varlen, bins):
    from types import SimpleNamespace

    config = SimpleNamespace(
        hidden_size=64, num_hidden_layers=2, vocab_size=1000, _attn_implementation=attention
    )
    cost = ForwardCost.of(config)
    assert (cost.varlen, cost.bins) == (varlen, bins)


def test_packing_pays_counts_the_shared_forwards_bins():
    """One truncated completion of 64 and seven of 8 under a 30-token prompt: padded rows cost
    30 + 8 x 64 = 542 positions, more than the pack's 8 x 30 + 64 + 56 = 360; in bins (64 |
    7 x 8) the shared forward costs 30 + 2 x 64 = 158."""
    prompts = [[1] * 30] * 8
    completions = [[2] * 64] + [[3] * 8] * 7
    assert packing_pays(prompts, completions, 10**6, cost=ForwardCost(bins=False))
    assert not packing_pays(prompts, completions, 10**6, cost=ForwardCost(bins=True))


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


def test_group_prompts_keeps_each_prompts_completions_together():
    prompts = [[1, 2], [3], [1, 2], [3], [1, 2]]
    completions = [[5, 5, 5], [6], [7], [8, 8, 8, 8], [9, 9]]
    batches = make_micro_batches(prompts, completions, 1000, pad_id=0, group_prompts=True)
    assert [b.rows for b in batches] == [(1, 3, 2, 4, 0)]  # prompt [3], then [1, 2]
    split = make_micro_batches(prompts, completions, 10, pad_id=0, group_prompts=True)
    assert all(b.input_ids.numel() <= 10 or len(b.rows) == 1 for b in split)
    assert sorted(r for b in split for r in b.rows) == [0, 1, 2, 3, 4]


def test_micro_batch_to_moves_every_tensor_and_keeps_rows():
    (mb,) = make_micro_batches([[1, 2], [3]], [[4], [5, 6]], token_budget=100, pad_id=0)
    assert mb.to("cpu") is mb  # built on the CPU: nothing to copy
    moved = mb.to("meta")
    tensors = ("input_ids", "attention_mask", "position_ids", "completion_ids", "completion_mask")
    assert all(getattr(moved, name).device.type == "meta" for name in tensors)
    assert moved.rows == mb.rows and moved.input_ids.shape == mb.input_ids.shape


def _packing(lengths: list[int], budget: int) -> list[list[int]]:
    """The trainer's micro-batches of rows with these total lengths (prompt of 1 + completion)."""
    prompts = [[1] for _ in lengths]
    completions = [[2] * (n - 1) for n in lengths]
    return [list(mb.rows) for mb in make_micro_batches(prompts, completions, budget, pad_id=0)]


@pytest.mark.parametrize(
    ("lengths", "budget", "expected"),
    [
        ([3, 1, 2], 4, [[1, 2], [0]]),
        ([4, 4, 4, 4], 8, [[0, 1], [2, 3]]),
        ([4, 4, 4, 4], 16, [[0, 1, 2, 3]]),
        ([10, 2, 2], 5, [[1, 2], [0]]),  # the long row gets its own micro-batch
        ([5, 5, 1], 4, [[2], [0], [1]]),  # every row is over budget except the short one
        ([2, 3, 3, 7, 1], 9, [[4, 0, 1], [2], [3]]),
    ],
)
def test_micro_batches_hand_cases(
    lengths: list[int], budget: int, expected: list[list[int]]
) -> None:
    """Shortest first, packed greedily while rows x longest row fits the token budget."""
    assert _packing(lengths, budget) == expected


def test_micro_batches_fit_the_budget() -> None:
    rng = random.Random(0)
    for _ in range(50):
        lengths = [rng.randint(1, 60) for _ in range(rng.randint(1, 30))]
        budget = rng.randint(16, 200)
        groups = _packing(lengths, budget)
        assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
        for g in groups:
            assert len(g) == 1 or len(g) * max(lengths[i] for i in g) <= budget
