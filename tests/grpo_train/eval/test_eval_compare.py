import math

import numpy as np
import pytest

from grpo_train.eval.compare import (
    CIMethod,
    compare_notes,
    compare_rates,
    compare_runs,
    mcnemar_exact_p,
    min_changed_problems,
    newcombe_ci,
    newcombe_paired_ci,
    paired_bootstrap_ci,
    rates_from_records,
    sign_flip_p,
    subset_mean_ci,
    two_sample_bootstrap_ci,
    two_sample_permutation_p,
)
from grpo_train.eval.records import SampleRecord, SampleStore
from grpo_train.eval_cli import main


def record(task, sid, g, success, env_id="toy/add-v0"):
    return SampleRecord(
        task=task, env_id=env_id, sample_id=sid, gen_index=g, prompt="p", completion="c",
        num_tokens=1, truncated=False, reward=float(success),
        outcome="correct" if success else "wrong", success=success, extracted=None,
    )  # fmt: skip


def synthetic_run(p_success, num=400, n=1, seed=0, task="gsm8k", prefix="q"):
    rng = np.random.default_rng(seed)
    return [
        record(task, f"{prefix}{i}", g, bool(rng.random() < p_success), env_id=f"toy/{task}-v0")
        for i in range(num)
        for g in range(n)
    ]


def test_paired_bootstrap_finds_a_real_improvement():
    a = synthetic_run(0.30, seed=1)
    # B fixes 20 % of A's failures on the same problems, breaks none: delta = 0.7 * 0.2 = 0.14
    rng = np.random.default_rng(2)
    b = [replace_success(r, r.success or rng.random() < 0.2) for r in a]
    (row,) = compare_rates(rates_from_records(a), rates_from_records(b), resamples=2000)
    assert row.method is CIMethod.MCNEMAR and row.num_samples == 400
    assert row.p_value is not None and row.p_value < 1e-6
    observed = row.accuracy_b - row.accuracy_a
    assert row.delta == pytest.approx(observed)
    assert row.ci_low < row.delta < row.ci_high
    assert row.ci_low > 0 and row.significant
    assert row.ci_low < 0.14 < row.ci_high
    # Paired intervals are tighter than treating the runs as independent.
    _, lo, hi = newcombe_ci(sum(r.success for r in a), 400, sum(r.success for r in b), 400)
    assert row.ci_high - row.ci_low < hi - lo


def replace_success(r, success):
    return SampleRecord(**{**r.__dict__, "success": bool(success)})


def test_identical_runs_have_zero_delta_and_no_significance():
    a = synthetic_run(0.5)
    (row,) = compare_rates(rates_from_records(a), rates_from_records(a), resamples=500)
    assert row.delta == 0.0 and row.p_value == 1.0 and not row.significant
    assert row.ci_low < 0 < row.ci_high  # no discordant problem is not proof of equality
    a2 = synthetic_run(0.5, n=3)
    (row,) = compare_rates(rates_from_records(a2), rates_from_records(a2), resamples=500)
    assert (row.delta, row.ci_low, row.ci_high, row.p_value) == (0.0, 0.0, 0.0, 1.0)


def test_bootstrap_is_seeded():
    rng = np.random.default_rng(0)
    a, b = rng.random(40).tolist(), rng.random(40).tolist()
    first = paired_bootstrap_ci(a, b, resamples=1000, seed=3)
    assert first == paired_bootstrap_ci(a, b, resamples=1000, seed=3)
    assert first != paired_bootstrap_ci(a, b, resamples=1000, seed=4)
    assert first[0] == pytest.approx(np.mean(np.array(b) - np.array(a)))


def test_bootstrap_coverage_on_simulated_pairs():
    # ~95 % of 95 % intervals must cover the true mean difference (0.1) in repeated experiments.
    rng = np.random.default_rng(0)
    covered = 0
    trials = 200
    for t in range(trials):
        a = rng.random(150) < 0.5
        b = np.where(rng.random(150) < 0.8, a, rng.random(150) < 0.75)  # E[b - a] = 0.2*0.25 = 0.05
        _, lo, hi = paired_bootstrap_ci(a.astype(float), b.astype(float), resamples=400, seed=t)
        covered += lo <= 0.05 <= hi
    assert 0.88 <= covered / trials <= 0.99


def test_newcombe_matches_the_published_example():
    # Newcombe (1998), Statistics in Medicine 17:873, example (a): 56/70 vs 48/80, method 10.
    d, lo, hi = newcombe_ci(48, 80, 56, 70)
    assert d == pytest.approx(0.2)
    assert lo == pytest.approx(0.0524, abs=5e-4)
    assert hi == pytest.approx(0.3339, abs=5e-4)


def test_unpaired_runs_use_the_binomial_interval():
    a = synthetic_run(0.2, num=300, seed=5, prefix="a")
    b = synthetic_run(0.6, num=300, seed=6, prefix="b")
    (row,) = compare_rates(rates_from_records(a), rates_from_records(b))
    assert row.method is CIMethod.BINOMIAL
    assert row.ci_low > 0.25 and row.ci_high < 0.55 and row.significant


def test_runs_without_a_shared_task_are_an_error():
    with pytest.raises(ValueError, match="share no task"):
        compare_rates(
            rates_from_records(synthetic_run(0.5, task="x")),
            rates_from_records(synthetic_run(0.5, task="y")),
        )


def test_compare_cli_prints_table_and_writes_png(tmp_path, capsys):
    for name, p, seed in (("a", 0.3, 0), ("b", 0.6, 0)):
        recs = synthetic_run(p, num=100, n=2, seed=seed) + synthetic_run(
            p, num=50, task="humaneval", seed=seed + 1
        )
        SampleStore(tmp_path / name / "samples.jsonl").append(recs)
    png = tmp_path / "delta.png"
    rc = main(
        [
            "compare",
            str(tmp_path / "a"),
            str(tmp_path / "b"),
            "--png",
            str(png),
            "--resamples",
            "500",
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert "| gsm8k |" in out and "| humaneval |" in out
    assert "paired-permutation+bootstrap" in out and "paired-mcnemar" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = compare_runs(tmp_path / "a", tmp_path / "b", resamples=500)
    assert [r.num_samples for r in rows] == [100, 50]


def test_compare_cli_rejects_a_folder_without_samples(tmp_path, capsys):
    assert main(["compare", str(tmp_path), str(tmp_path)]) == 2
    assert "not an eval run folder" in capsys.readouterr().err


# Hand computations of the paired statistics.


def test_mcnemar_exact_p_by_hand():
    # k = 10 discordant, 2 of them for A: 2 * (C(10,0) + C(10,1) + C(10,2)) / 2**10 = 112/1024
    assert mcnemar_exact_p(2, 8) == pytest.approx(112 / 1024)
    assert mcnemar_exact_p(8, 2) == mcnemar_exact_p(2, 8)
    assert mcnemar_exact_p(0, 6) == pytest.approx(2 / 64)
    assert mcnemar_exact_p(0, 0) == 1.0
    with pytest.raises(ValueError, match=">= 0"):
        mcnemar_exact_p(-1, 3)


def test_newcombe_paired_interval_by_hand():
    # 10 problems: both 2, only A 1, only B 4, neither 3 -> p_b = 0.6, p_a = 0.3, delta 0.3.
    # Wilson 95 % (z = 1.959964): 6/10 -> [0.312668, 0.831816], 3/10 -> [0.107789, 0.603222].
    # ad - bc = 2*3 - 4*1 = 2 lies in [0, n/2]: phi is corrected to 0.
    # low = 0.3 - sqrt(0.287332**2 + 0.303222**2), high = 0.3 + sqrt(0.231816**2 + 0.192211**2)
    d, lo, hi = newcombe_paired_ci(2, 1, 4, 3)
    assert d == pytest.approx(0.3)
    assert lo == pytest.approx(0.3 - 0.417737, abs=2e-5)
    assert hi == pytest.approx(0.3 + 0.301137, abs=2e-5)
    # both 0, only A 3, only B 6, neither 1: same margins, ad - bc = -18 -> phi = -18/sqrt(504)
    # = -0.801784 widens the interval: low = 0.3 - sqrt(0.082560 + 0.139712 + 0.091944)
    d, lo, hi = newcombe_paired_ci(0, 3, 6, 1)
    assert lo == pytest.approx(0.3 - 0.560550, abs=2e-5)
    assert hi == pytest.approx(0.3 + 0.402656, abs=2e-5)
    # bounded by [-1, 1] at the extremes
    d, lo, hi = newcombe_paired_ci(0, 0, 7, 0)
    assert d == 1.0 and 0 < lo < 1 and hi == 1.0
    with pytest.raises(ValueError, match="positive total"):
        newcombe_paired_ci(0, 0, 0, 0)


def test_sign_flip_p_by_hand():
    # differences 0.5, 0.5, -0.5, 1.0: |sum| = 1.5; of the 16 sign patterns, sums 2.5 (1),
    # 1.5 (3), -1.5 (3), -2.5 (1) reach it: p = 8/16. Zeros do not count.
    assert sign_flip_p([0.5, 0.5, -0.5, 1.0, 0.0, 0.0]) == pytest.approx(0.5)
    assert sign_flip_p([0.25] * 6) == pytest.approx(2 / 64)
    assert sign_flip_p([0.0, 0.0]) == 1.0
    # above the exact limit: seeded random patterns, never below the exact value's order
    many = [0.5] * 30
    p = sign_flip_p(many, resamples=2000, seed=1)
    assert p == sign_flip_p(many, resamples=2000, seed=1)
    assert p == pytest.approx(1 / 2001)


def test_subset_mean_interval_by_hand():
    # 7 differences: k = floor(0.05 * 2**6) = 3. Subset means, smallest: -0.5 ({-0.5}),
    # -0.25 ({-0.5, 0}), 0 ({0}, {-0.5, 0.5}, ...); largest: 1 ({1} three times).
    assert subset_mean_ci([-0.5, 0.0, 0.5, 0.5, 1.0, 1.0, 1.0]) == (0.0, 1.0)
    # 6 differences: k = floor(0.05 * 32) = 1, the smallest and largest single difference
    assert subset_mean_ci([0.1, 0.2, 0.3, 0.4, 0.5, -0.2]) == pytest.approx((-0.2, 0.5))
    # 5 or fewer: no interval short of the whole range
    assert subset_mean_ci([1.0] * 5) == (-1.0, 1.0)


def test_subset_mean_interval_coverage_on_symmetric_differences():
    # n = 8: k = floor(0.05 * 128) = 6, exact coverage 1 - 12/256 = 0.953 for symmetric data.
    rng = np.random.default_rng(0)
    trials = 400
    covered = 0
    for _ in range(trials):
        diffs = 0.1 + rng.uniform(-0.4, 0.4, size=8)
        lo, hi = subset_mean_ci(diffs.tolist())
        covered += lo <= 0.1 <= hi
    assert 0.91 <= covered / trials <= 0.99


def test_min_changed_problems_matches_the_smallest_p_value():
    for confidence in (0.8, 0.9, 0.95, 0.99):
        k = min_changed_problems(confidence)
        assert mcnemar_exact_p(0, k) <= 1 - confidence < mcnemar_exact_p(0, k - 1)


# The sample sizes where a difference cannot be resolved.


def multi_sample_runs(num_problems, successes_a, successes_b, n=2):
    """Two runs on the same problems with ``successes_x[i]`` of ``n`` completions correct."""
    a, b = [], []
    for i in range(num_problems):
        a += [record("t", f"q{i}", g, g < successes_a[i]) for g in range(n)]
        b += [record("t", f"q{i}", g, g < successes_b[i]) for g in range(n)]
    return rates_from_records(a), rates_from_records(b)


def test_five_problems_cannot_resolve_any_delta():
    # 5 problems x 2 completions; B gains one completion on one problem: +10 pp.
    a, b = multi_sample_runs(5, [1, 1, 0, 2, 0], [2, 1, 0, 2, 0])
    (row,) = compare_rates(a, b)
    assert row.method is CIMethod.PAIRED_PERMUTATION
    assert row.delta == pytest.approx(0.1)
    assert row.p_value == 1.0  # one non-zero difference: both of its signs reach |sum|
    assert (row.ci_low, row.ci_high) == (-1.0, 1.0)
    assert not row.resolvable and not row.significant and row.min_detectable is None
    # even the largest possible gain (every completion of every problem) is not resolvable
    a, b = multi_sample_runs(5, [0] * 5, [2] * 5)
    (row,) = compare_rates(a, b)
    assert row.delta == 1.0 and row.p_value == pytest.approx(2 / 32) and not row.significant
    notes = compare_notes([row])
    assert any("not resolvable with 5 problems" in n and "at least 6" in n for n in notes)


def test_binary_paired_rows_use_mcnemar_and_report_the_detectable_delta():
    # 20 problems, one completion each: B alone solves 7, A alone 1: k = 8 discordant,
    # p = 2 * (C(8,0) + C(8,1)) / 2**8 = 18/256.
    a = [record("t", f"q{i}", 0, i < 1 or 10 <= i < 15) for i in range(20)]
    b = [record("t", f"q{i}", 0, 1 <= i < 8 or 10 <= i < 15) for i in range(20)]
    (row,) = compare_rates(rates_from_records(a), rates_from_records(b))
    assert row.method is CIMethod.MCNEMAR and row.num_samples == 20
    assert row.delta == pytest.approx(6 / 20)
    assert row.p_value == pytest.approx(18 / 256)
    assert not row.significant and row.resolvable
    assert row.min_detectable == pytest.approx(6 / 20)
    (note,) = [n for n in compare_notes([row]) if n.startswith("t:")]
    assert "30.0 pp" in note and "20 problems" in note
    # 8 against 0: p = 2 / 256, significant, and the paired interval excludes 0 as well
    b = [record("t", f"q{i}", 0, i < 8 or 10 <= i < 15) for i in range(20)]
    a = [record("t", f"q{i}", 0, 10 <= i < 15) for i in range(20)]
    (row,) = compare_rates(rates_from_records(a), rates_from_records(b))
    assert row.p_value == pytest.approx(2 / 256) and row.significant and row.ci_low > 0


def test_six_problems_all_changed_one_way_is_the_smallest_resolvable_case():
    # min_changed_problems(0.95) = 6: at exactly 6 shared problems a paired row is resolvable,
    # and 6 of 6 changed one way reaches p = 2 / 64 <= 0.05.
    assert min_changed_problems() == 6
    a, b = multi_sample_runs(6, [0] * 6, [2] * 6)
    (row,) = compare_rates(a, b)
    assert row.num_samples == 6 and row.resolvable
    assert row.p_value == pytest.approx(2 / 64) and row.significant
    assert row.min_detectable == pytest.approx(6 / (2 * 6))


def test_sign_flips_are_exact_up_to_the_limit_then_sampled_within_resamples():
    # 16 equal differences: enumerated, only the two uniform patterns reach |sum| = 16.
    assert sign_flip_p([1.0] * 16) == 2 / 2**16
    # 17: sampled, (1 + hits) / (1 + resamples) never understates p (here >= 1 / 10_001).
    assert 1 / 10_001 <= sign_flip_p([1.0] * 17) < 0.01
    # Sampled in chunks (20 patterns each at 100_000 differences): every pattern of a zero sum
    # reaches it, so p is (1 + 50) / (1 + 50) = 1 only if exactly `resamples` were drawn.
    assert sign_flip_p([1.0, -1.0] * 50_000, resamples=50) == 1.0


@pytest.mark.parametrize("diffs", [[], [0.1] * 17])
def test_subset_means_refuse_no_differences_and_too_many(diffs):
    with pytest.raises(ValueError, match="subset means need 1 to 16 differences"):
        subset_mean_ci(diffs)


def test_interval_inputs_are_checked():
    for a, b in (([0.0], [0.0, 1.0]), ([], [])):
        with pytest.raises(ValueError, match="two equal, non-empty sequences"):
            paired_bootstrap_ci(a, b)
    with pytest.raises(ValueError, match="resamples must be >= 1"):
        paired_bootstrap_ci([0.0, 1.0], [1.0, 1.0], resamples=0)
    assert paired_bootstrap_ci([0.0, 1.0], [1.0, 1.0], resamples=1)[0] == 0.5  # one is enough
    for xs, ys in (([], [1.0]), ([1.0], [])):
        with pytest.raises(ValueError, match="items on both sides"):
            two_sample_permutation_p(xs, ys)
    for trials_a, trials_b in ((0, 4), (4, 0)):
        with pytest.raises(ValueError, match="at least one trial in each run"):
            newcombe_ci(0, trials_a, 0, trials_b)


def test_subset_interval_at_an_exact_integer_rank():
    # confidence 0.75, 3 differences: k = 0.25 * 2**2 = 1 exactly (no float shortfall to 0),
    # so the interval is the smallest and largest subset mean, not the whole range.
    assert subset_mean_ci([0.1, 0.2, 0.3], confidence=0.75) == pytest.approx((0.1, 0.3))


def test_sampled_two_sample_p_never_understates_and_stays_small():
    # C(20, 10) = 184_756 splits > 20_000: sampled; 2 of them are as extreme as the observed one.
    p = two_sample_permutation_p([0.0] * 10, [1.0] * 10)
    assert 1 / 10_001 <= p <= 5 / 10_001


def test_two_sample_bootstrap_draws_every_item_of_each_side():
    assert two_sample_bootstrap_ci([0.0], [1.0, 0.0]) == (0.5, 0.0, 1.0)
    assert two_sample_bootstrap_ci([1.0, 0.0], [0.0]) == (-0.5, -1.0, 0.0)


@pytest.mark.parametrize("confidence", [0.0, 1.0])
def test_confidence_must_lie_strictly_between_0_and_1(confidence):
    with pytest.raises(ValueError, match=r"confidence must be in \(0, 1\)"):
        min_changed_problems(confidence)


def test_sixteen_problems_are_enumerated_seventeen_bootstrapped():
    (row,) = compare_rates(*multi_sample_runs(16, [0] * 16, [1] * 16))
    assert row.method is CIMethod.PAIRED_PERMUTATION
    (row,) = compare_rates(*multi_sample_runs(17, [0] * 17, [1] * 17))
    assert row.method is CIMethod.PAIRED_BOOTSTRAP


def test_unpaired_binomial_rows_are_significant_either_way_when_the_interval_excludes_0():
    low = [record("t", f"a{i}", 0, i % 5 == 0) for i in range(200)]  # 20 %
    high = [record("t", f"b{i}", 0, i % 5 != 0) for i in range(200)]  # 80 %
    (up,) = compare_rates(rates_from_records(low), rates_from_records(high))
    (down,) = compare_rates(rates_from_records(high), rates_from_records(low))
    assert up.method is down.method is CIMethod.BINOMIAL and up.p_value is None
    assert up.ci_low > 0 and up.significant
    assert down.ci_high < 0 and down.significant


def test_paired_bootstrap_draws_every_item():
    assert paired_bootstrap_ci([0.0, 0.0], [1.0, 0.0]) == (0.5, 0.0, 1.0)


def test_paired_binary_rows_use_the_2x2_table_and_need_one_completion_on_both_sides():
    # 20 problems: both solve 5, A alone 1, B alone 7, neither 7 (the test above's runs).
    a = [record("t", f"q{i}", 0, i < 1 or 10 <= i < 15) for i in range(20)]
    b = [record("t", f"q{i}", 0, 1 <= i < 8 or 10 <= i < 15) for i in range(20)]
    (row,) = compare_rates(rates_from_records(a), rates_from_records(b))
    expected = newcombe_paired_ci(5, 1, 7, 7)
    assert (row.delta, row.ci_low, row.ci_high) == pytest.approx(expected)
    # Two completions per problem in B: rates, not a 2x2 table.
    b2 = b + [record("t", f"q{i}", 1, i < 3) for i in range(20)]
    (row,) = compare_rates(rates_from_records(a), rates_from_records(b2))
    assert row.method is not CIMethod.MCNEMAR


def test_unpaired_rows_too_small_to_resolve():
    a = rates_from_records([record("t", "a0", 0, False)])
    b = rates_from_records([record("t", "b0", 0, True)])
    (row,) = compare_rates(a, b)
    assert row.method is CIMethod.BINOMIAL and row.p_value is None
    assert not row.resolvable and not row.significant and row.ci_low < 0
    assert any("not resolvable" in n for n in compare_notes([row]))


def test_compare_cli_on_five_problems_claims_nothing(tmp_path, capsys):
    for name, successes in (("a", [1, 1, 0, 2, 0]), ("b", [2, 1, 0, 2, 0])):
        recs = [record("t", f"q{i}", g, g < successes[i]) for i in range(5) for g in range(2)]
        SampleStore(tmp_path / name / "samples.jsonl").append(recs)
    png = tmp_path / "d.png"
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--png", str(png)]) == 0
    out = capsys.readouterr().out
    assert "+10.0 |" in out and "+10.0 *" not in out
    assert "interval excludes 0" not in out.replace("unpaired rows: the interval excludes 0", "")
    assert "not resolvable with 5 problems" in out


def test_two_sample_permutation_p_by_hand():
    # Pooled [0, 0, 1, 1], B takes 2 of the 4: 6 splits, gaps |mean B - mean A| of 1, 0, 0,
    # 0, 0, 1: the observed gap (1) is reached by 2 of 6.
    assert two_sample_permutation_p([0.0, 0.0], [1.0, 1.0]) == pytest.approx(2 / 6)
    # [0.25] against [0.75, 0.5]: splits of B over {0.25, 0.75, 0.5}: gaps |0.625 - 0.25|,
    # |0.375 - 0.75|, |0.5 - 0.5| = 0.375, 0.375, 0: 2 of 3 reach 0.375.
    assert two_sample_permutation_p([0.25], [0.75, 0.5]) == pytest.approx(2 / 3)
    assert two_sample_permutation_p([0.5, 0.5], [0.5]) == 1.0


def test_unpaired_runs_with_several_completions_count_problems_not_completions():
    # Three problems a run, eight completions each, all wrong in A and all right in B: 24
    # completions a side would make +100 pp look certain, but three problems against three
    # cannot: of the C(6, 3) = 20 splits, 2 are as extreme (p = 0.1).
    a = [record("t", f"a{i}", g, False) for i in range(3) for g in range(8)]
    b = [record("t", f"b{i}", g, True) for i in range(3) for g in range(8)]
    (row,) = compare_rates(rates_from_records(a), rates_from_records(b))
    assert row.method is CIMethod.UNPAIRED_PROBLEMS and row.num_samples == 3
    assert row.delta == 1.0 and row.p_value == pytest.approx(0.1)
    assert not row.resolvable and not row.significant
    assert any("3 problems per run" in n for n in compare_notes([row]))
    # Newcombe over the 24 completions would have excluded 0 by far: the old claim.
    assert newcombe_ci(0, 24, 24, 24)[1] > 0.8
    # Ten problems a side, every one better in B: 2 of C(20, 10) = 184,756 splits are as
    # extreme; sampled (10,000 seeded splits), p = (1 + hits) / 10,001 with few hits.
    a = [record("t", f"a{i}", g, g < 2) for i in range(10) for g in range(4)]
    b = [record("t", f"b{i}", g, g < 3) for i in range(10) for g in range(4)]
    (row,) = compare_rates(rates_from_records(a), rates_from_records(b))
    assert row.delta == pytest.approx(0.25) and row.resolvable
    assert math.comb(20, 10) > 20_000 and row.p_value < 0.001 and row.significant
    assert row.ci_low == pytest.approx(0.25) and row.ci_high == pytest.approx(0.25)
