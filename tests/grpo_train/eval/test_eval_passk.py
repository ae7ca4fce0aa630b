import itertools
import math

import pytest

from grpo_train.eval.passk import mean_pass_at_k, parse_ks, pass_at_k


def naive_pass_at_k(n: int, c: int, k: int) -> float:
    """The definition: the fraction of size-k subsets of the n samples holding a correct one."""
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (1, 1, 1, 1.0),
        (1, 0, 1, 0.0),
        (2, 1, 1, 0.5),
        (4, 1, 2, 0.5),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
        (5, 2, 2, 0.7),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
        (10, 3, 1, 0.3),  # pass@1 is c/n
        (10, 1, 5, 0.5),  # 1 - C(9,5)/C(10,5) = 1 - 126/252
        (8, 2, 4, 1 - 15 / 70),  # 1 - C(6,4)/C(8,4)
        (3, 2, 2, 1.0),  # n - c < k: every pair holds a correct sample
    ],
)
def test_pass_at_k_hand_computed(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_pass_at_k_matches_naive_definition(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(naive_pass_at_k(n, c, k), abs=1e-12)


def test_pass_at_k_large_n_is_stable_and_matches_binomials():
    # The product form must agree with exact big-integer binomials where floats would overflow.
    n, c, k = 1000, 7, 100
    exact = 1 - math.comb(n - c, k) / math.comb(n, k)
    assert pass_at_k(n, c, k) == pytest.approx(exact, rel=1e-9)


def test_pass_at_k_is_not_the_biased_estimator():
    # 1 - (1 - c/n)^k differs from the unbiased value; guard against the common mistake.
    assert pass_at_k(4, 1, 2) != pytest.approx(1 - (1 - 1 / 4) ** 2)


@pytest.mark.parametrize(("n", "c", "k"), [(4, 1, 5), (0, 0, 1), (3, 4, 1), (3, -1, 1), (3, 1, 0)])
def test_pass_at_k_rejects_bad_counts(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_k_greater_than_n_error_says_how_to_fix():
    with pytest.raises(ValueError, match="raise --n"):
        pass_at_k(4, 1, 8)


def test_mean_pass_at_k():
    assert mean_pass_at_k([(4, 1), (4, 0), (4, 4)], 2) == pytest.approx((0.5 + 0 + 1) / 3)
    with pytest.raises(ValueError):
        mean_pass_at_k([], 1)


def test_parse_ks():
    assert parse_ks("8,1,4,4") == (1, 4, 8)
    for bad in ("", "a,b", "0,1"):
        with pytest.raises(ValueError):
            parse_ks(bad)


def test_no_samples_error_names_n():
    # n = 0 would also fail the k check; the message must name the real problem.
    with pytest.raises(ValueError, match="needs n >= 1 samples"):
        pass_at_k(0, 0, 1)
