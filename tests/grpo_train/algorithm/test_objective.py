"""The clipped GRPO objective against hand computations (``grpo_train.algorithm.objective``)."""

import math

import pytest
import torch

from grpo_train.algorithm.objective import (
    grpo_loss,
    loss_share,
    rows_with_gradient,
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
    assert m["is_ratio_min"] == pytest.approx(2.0)  # the masked ratio 1.0 is ignored
    assert m["is_ratio_mean"] == pytest.approx(6.0)
    assert m["is_capped_frac"] == pytest.approx(0.5)


def test_shape_errors_name_the_problem():
    with pytest.raises(ValueError, match="same"):
        grpo_loss(torch.zeros(2, 3), torch.zeros(2, 2), torch.zeros(2), torch.ones(2, 3))
    with pytest.raises(ValueError, match=r"advantages must have shape \(B,\) = \(2,\)"):
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


def test_zero_and_positive_advantages_are_never_clipped_low():
    # Ratios 0.5 and 2.0 on each row, epsilon_low 0.2, epsilon_high 0.28.
    # Row 0, A = 0: the clip changes nothing (-min(0, 0) = 0), so neither token counts.
    # Row 1, A = 0.5: r=0.5 is below 0.8 but A > 0 takes min(r A, clip A) = r A: not clipped,
    # loss -0.25; r=2.0 above 1.28 with A > 0: clipped high, loss -min(1.0, 0.64) = -0.64.
    ratios = torch.tensor([[0.5, 2.0], [0.5, 2.0]])
    adv = torch.tensor([0.0, 0.5])
    loss, m = grpo_loss(ratios.log(), torch.zeros(2, 2), adv, torch.ones(2, 2), loss_type="dapo")
    assert loss.item() == pytest.approx((-0.25 - 0.64) / 4)
    assert m["clip_frac_low"] == 0.0
    assert m["clip_frac_high"] == pytest.approx(1 / 4)
    assert m["clip_frac"] == pytest.approx(1 / 4)


def test_a_ratio_on_the_clip_bound_or_the_cap_is_not_counted_as_clipped():
    # On policy the ratio is exactly exp(0) = 1; with both epsilons 0 it sits on both clip
    # bounds, where clipping leaves it unchanged, and on a cap of 1, which leaves the weight 1.
    lp = torch.zeros(2, 2)
    _, m = grpo_loss(
        lp, lp, torch.tensor([1.0, -1.0]), torch.ones(2, 2), epsilon_low=0.0, epsilon_high=0.0
    )
    assert (m["clip_frac_low"], m["clip_frac_high"], m["clip_frac"]) == (0.0, 0.0, 0.0)
    w, is_m = truncated_is_weights(lp, lp, torch.ones(2, 2), cap=1.0)
    assert w.tolist() == [[1.0, 1.0], [1.0, 1.0]]
    assert is_m["is_capped_frac"] == 0.0


def test_a_row_without_trained_tokens_and_a_single_trained_token():
    # Row 0: one trained token, ratio 1.5 with A = +1: clipped to 1.28, loss -1.28 (its masked
    # ratio 3.0 is ignored). Row 1: no trained token (a padding row): loss 0, not 0 / 0.
    ratios = torch.tensor([[1.5, 3.0], [2.0, 2.0]])
    mask = torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    old, adv = torch.zeros(2, 2), torch.tensor([1.0, 1.0])
    grpo, m = grpo_loss(ratios.log(), old, adv, mask, loss_type="grpo")
    assert grpo.item() == pytest.approx((-1.28 / 1 + 0.0) / 2)  # mean over the two rows
    dapo, _ = grpo_loss(ratios.log(), old, adv, mask, loss_type="dapo")
    assert dapo.item() == pytest.approx(-1.28)  # one token
    # Means over one token are that token's value.
    assert m["ratio_mean"] == pytest.approx(1.5)
    assert (m["ratio_min"], m["ratio_max"]) == (pytest.approx(1.5), pytest.approx(1.5))
    assert m["clip_frac_high"] == 1.0


def test_a_reference_with_beta_zero_adds_no_kl():
    # beta 0 turns the KL term off: neither the loss nor the logged kl uses the reference.
    lp = torch.zeros(1, 2)
    ref = torch.tensor([[math.log(2.0), 0.0]])
    with_ref, m = grpo_loss(lp, lp, torch.tensor([1.0]), torch.ones(1, 2), ref_logprobs=ref)
    without, _ = grpo_loss(lp, lp, torch.tensor([1.0]), torch.ones(1, 2))
    assert with_ref.item() == without.item() == pytest.approx(-1.0)  # -A at ratio 1
    assert m["kl"] == 0.0


def test_loss_share_of_a_batch_without_tokens_or_rows_is_zero():
    # Shares are this micro-batch's tokens (dapo) or rows over the batch's; a batch with no
    # trained token, or no row, gives every micro-batch share 0 rather than 0 / 0.
    assert loss_share("dapo", torch.zeros(2, 3), total_tokens=0, total_seqs=2) == 0.0
    assert loss_share("grpo", torch.zeros(0, 3), total_tokens=0, total_seqs=0) == 0.0
    assert loss_share("dapo", torch.ones(1, 3), total_tokens=12, total_seqs=4) == 3 / 12
    assert loss_share("dr_grpo", torch.ones(1, 3), total_tokens=12, total_seqs=4) == 1 / 4
