import numpy as np
import pytest

from grpo_train.eval.cli import main
from grpo_train.eval.compare import (
    CIMethod,
    compare_rates,
    compare_runs,
    newcombe_ci,
    paired_bootstrap_ci,
    rates_from_records,
)
from grpo_train.eval.records import SampleRecord, SampleStore


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
    assert row.method is CIMethod.PAIRED_BOOTSTRAP and row.num_samples == 400
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


def test_identical_runs_have_zero_delta_and_a_degenerate_interval():
    a = synthetic_run(0.5)
    (row,) = compare_rates(rates_from_records(a), rates_from_records(a), resamples=500)
    assert (row.delta, row.ci_low, row.ci_high) == (0.0, 0.0, 0.0)
    assert not row.significant


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
    assert "| gsm8k |" in out and "| humaneval |" in out and "paired-bootstrap" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = compare_runs(tmp_path / "a", tmp_path / "b", resamples=500)
    assert [r.num_samples for r in rows] == [100, 50]


def test_compare_cli_rejects_a_folder_without_samples(tmp_path, capsys):
    assert main(["compare", str(tmp_path), str(tmp_path)]) == 2
    assert "not an eval run folder" in capsys.readouterr().err
