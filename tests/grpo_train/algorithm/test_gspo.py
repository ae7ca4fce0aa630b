"""GSPO's sequence-level importance ratio (arXiv:2507.18071) in ``grpo_loss``: values, gradients.

The reference below is written from the paper's sequence-level objective (its eq. 5 and 7),
``J = mean_i min(s_i A_i, clip(s_i, 1 - e_low, 1 + e_high) A_i)`` with
``s_i = (prod_t pi(y_t) / pi_old(y_t)) ** (1 / |y_i|)`` over the completion's trained tokens,
not from the token form the implementation uses; autograd of each gives the gradients compared.
"""

import math

import pytest
import torch

from grpo_train.algorithm.objective import grpo_loss, importance_log_ratio, loss_share

E_LOW, E_HIGH = 0.2, 0.28
#   row 0: log ratios 0.2, -0.1 (third token masked out): s = exp(0.05), A = +1, not clipped
#   row 1: 0.4, 0.3, 0.5: s = exp(0.4) = 1.49 > 1.28, A = +1: clipped (no gradient)
#   row 2: -0.1, -0.1, 0.05 (last masked out): s = exp(-0.1) = 0.905, A = -1, not clipped
#   row 3: -0.6, -0.3, -0.3: s = exp(-0.4) = 0.670 < 0.8, A = -1: clipped (no gradient)
LOG_RATIO = torch.tensor(
    [[0.2, -0.1, 0.5], [0.4, 0.3, 0.5], [-0.1, -0.1, 0.05], [-0.6, -0.3, -0.3]],
    dtype=torch.float64,
)
MASK = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 1, 0], [1, 1, 1]], dtype=torch.float64)
ADV = torch.tensor([1.0, 1.0, -1.0, -1.0], dtype=torch.float64)
OLD = torch.tensor(
    [[-1.0, -2.0, -0.5], [-0.3, -1.2, -2.2], [-0.7, -0.9, -1.1], [-1.5, -0.4, -0.8]],
    dtype=torch.float64,
)
# Per-sequence loss -min(s A, clip(s) A), by hand:
SEQ_LOSS = [-math.exp(0.05), -1.28, math.exp(-0.1), 0.8]
LENGTHS = [2, 3, 2, 3]


def paper_sequence_loss(logprobs, old, mask, adv, loss_type, max_len=None):
    """GSPO's sequence objective, written from the paper: one clipped term per sequence."""
    losses, lengths = [], []
    for i in range(logprobs.shape[0]):
        on = mask[i] > 0
        n = int(on.sum())
        # (pi / pi_old) ** (1 / |y|): the product of the token ratios, then the root
        seq_ratio = torch.prod(torch.exp(logprobs[i][on] - old[i][on])) ** (1.0 / n)
        clipped = torch.clamp(seq_ratio, 1 - E_LOW, 1 + E_HIGH)
        losses.append(-torch.min(seq_ratio * adv[i], clipped * adv[i]))
        lengths.append(n)
    stacked = torch.stack(losses)
    n_tok = torch.tensor(lengths, dtype=stacked.dtype)
    if loss_type == "grpo":  # the paper's 1/G sum over sequences
        return stacked.mean()
    if loss_type == "dapo":  # every trained token carries its sequence's term
        return (stacked * n_tok).sum() / n_tok.sum()
    return (stacked * n_tok).sum() / (len(lengths) * max_len)  # dr_grpo


def _ours(logprobs, loss_type, **kw):
    return grpo_loss(
        logprobs,
        OLD,
        ADV,
        MASK,
        epsilon_low=E_LOW,
        epsilon_high=E_HIGH,
        loss_type=loss_type,
        max_completion_length=4,
        importance_sampling_level="sequence",
        **kw,
    )


def test_sequence_ratio_is_the_masked_mean_log_ratio_on_every_token():
    lp = OLD + LOG_RATIO
    log_s = importance_log_ratio(lp, OLD, MASK, "sequence")
    want = [0.05, 0.4, -0.1, -0.4]
    for i, value in enumerate(want):
        assert log_s[i].tolist() == pytest.approx([value] * 3)
    torch.testing.assert_close(importance_log_ratio(lp, OLD, MASK, "token"), LOG_RATIO)


def test_grpo_aggregation_value_matches_the_hand_computation():
    loss, m = _ours(OLD + LOG_RATIO, "grpo")
    assert loss.item() == pytest.approx(sum(SEQ_LOSS) / 4)
    # Clip metrics count trained tokens of clipped sequences: row 1 (3 tokens, high), row 3 (low).
    assert m["clip_frac_high"] == pytest.approx(3 / 10)
    assert m["clip_frac_low"] == pytest.approx(3 / 10)
    assert m["ratio_max"] == pytest.approx(math.exp(0.4))
    assert m["ratio_min"] == pytest.approx(math.exp(-0.4))


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo"])
def test_values_and_gradients_match_the_paper_objective(loss_type):
    torch.manual_seed(0)
    base = OLD + LOG_RATIO
    lp_ours = base.clone().requires_grad_(True)
    lp_ref = base.clone().requires_grad_(True)
    ours, _ = _ours(lp_ours, loss_type)
    ref = paper_sequence_loss(lp_ref, OLD, MASK, ADV, loss_type, max_len=4)
    assert ours.item() == pytest.approx(ref.item(), rel=1e-9)
    ours.backward()
    ref.backward()
    torch.testing.assert_close(lp_ours.grad, lp_ref.grad, rtol=1e-9, atol=1e-12)
    # Clipped sequences (rows 1 and 3) and masked-out tokens get no gradient at all.
    assert lp_ours.grad[1].abs().sum() == 0 and lp_ours.grad[3].abs().sum() == 0
    assert lp_ours.grad[0, 2] == 0 and lp_ours.grad[2, 2] == 0
    # Unclipped: d/d logp_t of -s A / |y| (grpo) is -A s / |y| on each trained token.
    if loss_type == "grpo":
        assert lp_ours.grad[0, 0].item() == pytest.approx(-math.exp(0.05) / 2 / 4)
        assert lp_ours.grad[2, 1].item() == pytest.approx(math.exp(-0.1) / 2 / 4)


def test_random_batches_match_the_paper_objective():
    torch.manual_seed(1)
    for _ in range(5):
        old = torch.randn(5, 7, dtype=torch.float64) - 2
        lp = (old + 0.3 * torch.randn(5, 7, dtype=torch.float64)).requires_grad_(True)
        lp_ref = lp.detach().clone().requires_grad_(True)
        mask = (torch.rand(5, 7) > 0.3).double()
        mask[:, 0] = 1
        adv = torch.randn(5, dtype=torch.float64)
        ours, _ = grpo_loss(
            lp, old, adv, mask, epsilon_low=E_LOW, epsilon_high=E_HIGH, loss_type="grpo",
            importance_sampling_level="sequence",
        )  # fmt: skip
        ref = paper_sequence_loss(lp_ref, old, mask, adv, "grpo")
        ours.backward()
        ref.backward()
        assert ours.item() == pytest.approx(ref.item(), rel=1e-9)
        torch.testing.assert_close(lp.grad, lp_ref.grad, rtol=1e-8, atol=1e-12)


def test_masked_tokens_change_nothing():
    lp = OLD + LOG_RATIO
    other = lp.clone()
    other[MASK == 0] = 7.0  # e.g. a tool's output inside the completion: not trained
    a, _ = _ours(lp, "dapo")
    b, _ = _ours(other, "dapo")
    assert a.item() == pytest.approx(b.item())


def test_one_wild_token_is_clipped_with_token_ratios_but_not_with_the_sequence_ratio():
    # Five tokens, one ratio exp(1) = 2.7: token level clips that token; the sequence mean
    # log ratio is 0.2 (s = 1.22 < 1.28), so GSPO keeps the whole sequence's gradient.
    old = torch.zeros(1, 5, dtype=torch.float64)
    lp = torch.tensor([[1.0, 0.0, 0.0, 0.0, 0.0]], dtype=torch.float64, requires_grad=True)
    mask, adv = torch.ones(1, 5, dtype=torch.float64), torch.ones(1, dtype=torch.float64)
    _, tok = grpo_loss(lp, old, adv, mask, epsilon_high=E_HIGH, importance_sampling_level="token")
    loss, seq = grpo_loss(
        lp, old, adv, mask, epsilon_high=E_HIGH, importance_sampling_level="sequence"
    )
    assert tok["clip_frac_high"] == pytest.approx(1 / 5)
    assert seq["clip_frac_high"] == 0.0
    loss.backward()
    assert lp.grad[0].tolist() == pytest.approx([-math.exp(0.2) / 5] * 5)


def test_on_policy_sequence_and_token_levels_agree():
    # mu = 1: every ratio is 1, and both forms give -A * grad logp_t per token.
    lp_t = (OLD + 0).requires_grad_(True)
    lp_s = (OLD + 0).requires_grad_(True)
    for lp, level in ((lp_t, "token"), (lp_s, "sequence")):
        loss, _ = grpo_loss(lp, lp.detach(), ADV, MASK, importance_sampling_level=level)
        loss.backward()
    torch.testing.assert_close(lp_t.grad, lp_s.grad)


def test_kl_stays_per_token_on_top_of_the_sequence_term():
    beta = 0.1
    lp = (OLD + LOG_RATIO).requires_grad_(True)
    lp_ref = (OLD + LOG_RATIO).requires_grad_(True)
    ref_lp = OLD - 0.2
    ours, m = _ours(lp, "dapo", ref_logprobs=ref_lp, beta=beta)
    delta = ref_lp - lp_ref
    kl = torch.exp(delta) - delta - 1
    want = (
        paper_sequence_loss(lp_ref, OLD, MASK, ADV, "dapo") + beta * (kl * MASK).sum() / MASK.sum()
    )
    assert ours.item() == pytest.approx(want.item(), rel=1e-9)
    ours.backward()
    want.backward()
    torch.testing.assert_close(lp.grad, lp_ref.grad, rtol=1e-9, atol=1e-12)
    assert m["kl"] == pytest.approx(float((kl.detach() * MASK).sum() / MASK.sum()))


@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "dr_grpo"])
def test_micro_batch_shares_reproduce_the_full_batch_loss(loss_type):
    lp = OLD + LOG_RATIO
    full, _ = _ours(lp, loss_type)
    parts = 0.0
    for rows in ([0, 3], [1, 2]):
        part, _ = grpo_loss(
            lp[rows], OLD[rows], ADV[rows], MASK[rows], epsilon_low=E_LOW, epsilon_high=E_HIGH,
            loss_type=loss_type, max_completion_length=4, importance_sampling_level="sequence",
        )  # fmt: skip
        parts += part.item() * loss_share(loss_type, MASK[rows], int(MASK.sum()), 4)
    assert parts == pytest.approx(full.item(), rel=1e-9)


def test_an_all_masked_row_has_ratio_one_and_no_loss():
    lp = torch.tensor([[0.5, 0.5]], requires_grad=True)
    loss, m = grpo_loss(
        lp,
        torch.zeros(1, 2),
        torch.ones(1),
        torch.zeros(1, 2),
        importance_sampling_level="sequence",
    )
    assert importance_log_ratio(lp, torch.zeros(1, 2), torch.zeros(1, 2), "sequence").tolist() == [
        [0.0, 0.0]
    ]
    assert loss.item() == 0.0 and m["clip_frac"] == 0.0


def test_unknown_level_is_refused():
    with pytest.raises(ValueError, match="'tok'"):
        importance_log_ratio(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), "tok")
