"""pass@k: the unbiased estimator of the Codex paper, as pure functions.

Chen et al. 2021, "Evaluating Large Language Models Trained on Code", section 2.1: with ``n``
samples per problem of which ``c`` are correct,

    pass@k = 1 - C(n - c, k) / C(n, k)

is unbiased, whereas ``1 - (1 - c/n)^k`` is not. Computing the binomials directly overflows for
large ``n``; the paper's numerically stable form is the product ``prod_{i=n-c+1}^{n} (1 - k / i)``,
which is what ``pass_at_k`` uses (written here from the formula, not copied).
"""

from __future__ import annotations

from collections.abc import Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem with ``n`` samples of which ``c`` are correct.

    Raises ``ValueError`` when ``k > n`` (the estimator needs at least ``k`` samples) or when the
    counts are impossible.

    >>> pass_at_k(n=2, c=1, k=1)
    0.5
    >>> pass_at_k(n=4, c=1, k=2)
    0.5
    >>> pass_at_k(n=5, c=0, k=3)
    0.0
    """
    if n < 1:
        raise ValueError(f"pass@k needs n >= 1 samples per problem, got n={n}")
    if not 0 <= c <= n:
        raise ValueError(f"the number of correct samples must be in [0, n={n}], got c={c}")
    if not 1 <= k <= n:
        raise ValueError(
            f"pass@{k} needs at least k samples per problem but n={n}; "
            f"lower k or raise --n to at least {k}"
        )
    if n - c < k:
        # Every subset of size k contains a correct sample.
        return 1.0
    # 1 - C(n-c, k)/C(n, k) = 1 - prod_{i=n-c+1}^{n} (1 - k/i)  (Chen et al. 2021, fig. 3)
    prob_all_wrong = 1.0
    for i in range(n - c + 1, n + 1):
        prob_all_wrong *= 1.0 - k / i
    return 1.0 - prob_all_wrong


def mean_pass_at_k(counts: Sequence[tuple[int, int]], k: int) -> float:
    """Mean pass@k over problems, each given as ``(n, c)``; NaN-free: empty input raises."""
    if not counts:
        raise ValueError("mean_pass_at_k needs at least one problem")
    return sum(pass_at_k(n, c, k) for n, c in counts) / len(counts)


def parse_ks(text: str) -> tuple[int, ...]:
    """Parse ``"1,4,8"`` into ``(1, 4, 8)`` (sorted, unique, each >= 1)."""
    try:
        ks = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError as err:
        raise ValueError(f"--k must be comma-separated integers like 1,4,8, got {text!r}") from err
    if not ks or ks[0] < 1:
        raise ValueError(f"--k needs positive integers like 1,4,8, got {text!r}")
    return tuple(ks)
