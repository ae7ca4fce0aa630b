"""The learning-curve race's arithmetic and options (no training: the runs are hand-made)."""

from __future__ import annotations

import doctest

import pytest
from bench_scripts import load

lc = load("learning_curve")


def run(trainer: str, lr: float, steps: list[float], accs: list[float | None]):
    r = lc.RunResult(lc.RunSpec(f"{trainer}@{lr:g}", trainer, len(steps), lr), step_s=steps)
    r.points = [lc.Point(i + 1, sum(steps[: i + 1]), "", a) for i, a in enumerate(accs)]
    return r


def test_docstring_examples():
    assert doctest.testmod(lc).failed == 0


def test_time_to_target_is_the_first_evaluated_step_at_or_above_it():
    r = run("ours", 2e-5, [10.0, 30.0, 20.0], [0.39, 0.40, 0.70])
    race = lc.race_of(r, 0.40)
    assert (race.step, race.seconds) == (2, 40.0)
    assert race.mean_step_s == 20.0  # 40 s over 2 steps
    assert race.median_step_s == 20.0  # of 10, 30, 20
    assert race.best_accuracy == 0.70


def test_unevaluated_points_do_not_count():
    race = lc.race_of(run("trl", 1e-5, [5.0, 5.0], [None, 0.5]), 0.4)
    assert race.step == 2 and race.seconds == 10.0


def test_report_decomposes_time_into_steps_and_seconds_per_step():
    runs = [
        run("ours", 1e-5, [10, 10], [0.2, 0.5]),
        run("trl", 1e-5, [20, 20], [0.1, 0.2]),
        run("ours", 2e-5, [10, 12], [0.5, 0.6]),
        run("trl", 2e-5, [20, 20], [0.3, 0.5]),
    ]
    lines = lc.race_report(runs, 0.4).splitlines()
    assert lines[0] == "target: held-out accuracy >= 40.0%"
    assert "| trl@1e-05 | 1e-05 | 20.0% | not reached in 2 | - | 20.0 |" in lines
    assert "| ours@2e-05 | 2e-05 | 60.0% | 1 | 10 s | 11.0 |" in lines
    same = [line for line in lines if line.startswith("same lr")]
    assert same[0].startswith("same lr 1e-05: TRL did not reach the target")
    # 10 s vs 40 s = (1 vs 2 steps) * (10 vs 20 s per step)
    assert same[1].startswith(
        "same lr 2e-05: time 0.25x TRL = steps 0.50x (1 vs 2) * s/step 0.50x (10.0 vs 20.0 s)"
    )
    assert "ours 1.8x faster per step (median 11.0 vs 20.0 s)" in same[1]
    # ours' fastest is 2e-5 (10 s), TRL's only hit is 2e-5 (40 s)
    assert lines[-1].startswith("best of sweep (ours 2e-05, TRL 2e-05): time 0.25x TRL")


def test_report_says_when_a_trainer_never_reaches_the_target():
    runs = [run("ours", 1e-5, [10], [0.5]), run("trl", 1e-5, [20], [0.1])]
    assert lc.race_report(runs, 0.4).splitlines()[-1] == (
        "best of sweep: TRL reached the target at no learning rate"
    )


def test_sweep_interleaves_both_trainers_and_alternates_the_first():
    args = lc.parse_args(["--runs", "ours", "trl", "--lrs", "5e-6", "1e-5", "2e-5"])
    names = [r.name for r in lc.build_runs(args)]
    assert names == [
        "ours@5e-06",
        "trl@5e-06",
        "trl@1e-05",
        "ours@1e-05",
        "ours@2e-05",
        "trl@2e-05",
    ]
    assert {r.learning_rate for r in lc.build_runs(args) if r.trainer == "trl"} == {
        5e-6,
        1e-5,
        2e-5,
    }


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["--lrs", "0"], "--lrs"), (["--target-gain", "1.5"], "--target-gain")],
)
def test_bad_options_are_named(argv, message, capsys):
    with pytest.raises(SystemExit):
        lc.parse_args(argv)
    assert message in capsys.readouterr().err


def test_saved_results_read_back_into_the_same_report(tmp_path):
    runs = [run("ours", 2e-5, [10.0, 12.0], [0.5, 0.6]), run("trl", 2e-5, [20.0, 20.0], [0.3, 0.5])]
    runs[0].load = (3.0, 4.5)
    args = lc.parse_args(["--runs", "ours", "trl", "--lrs", "2e-5"])
    lc.save(tmp_path / "lc.json", 0.1, args, runs)
    base, saved, back = lc.load(tmp_path / "lc.json")
    assert base == 0.1 and saved["lrs"] == [2e-5]
    assert back[0].load == (3.0, 4.5) and back[1].step_s == [20.0, 20.0]
    assert lc.race_report(back, 0.4) == lc.race_report(runs, 0.4)


def test_report_merges_one_file_per_learning_rate(tmp_path, capsys):
    args = lc.parse_args(["--runs", "ours", "trl"])
    lc.save(tmp_path / "a.json", 0.1, args, [run("ours", 1e-5, [10.0], [0.5])])
    lc.save(tmp_path / "b.json", 0.1, args, [run("trl", 1e-5, [30.0], [0.45])])
    assert lc.main(["--report", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 0
    out = capsys.readouterr().out
    assert "target: held-out accuracy >= 38.0%" in out  # 10% + the default 28 points
    assert "same lr 1e-05: time 0.33x TRL = steps 1.00x (1 vs 1)" in out
    lc.save(tmp_path / "c.json", 0.2, args, [])
    with pytest.raises(SystemExit, match="base accuracy"):
        lc.main(["--report", str(tmp_path / "a.json"), str(tmp_path / "c.json")])


def test_a_child_that_leaves_an_orphan_behind_neither_hangs_the_race_nor_survives(tmp_path):
    # A trainer OOM-killed mid-run leaves its vLLM engine core behind, holding the trainer's
    # stdout: the race must read the child's exit, not wait for that output to close.
    import os
    import sys
    import time
    from pathlib import Path

    pid_file = tmp_path / "orphan.pid"
    script = (
        "import os, subprocess, sys\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
        "print('trained 3 steps', flush=True)\n"
        "os._exit(137)\n"
    )
    t0 = time.monotonic()
    code, tail = lc.run_child([sys.executable, "-c", script], dict(os.environ), tmp_path / "x.log")
    assert time.monotonic() - t0 < 60
    assert code == 137 and "trained 3 steps" in tail
    orphan = int(pid_file.read_text())
    for _ in range(100):  # killed, then reaped by init (a zombie until then)
        try:
            state = Path(f"/proc/{orphan}/stat").read_text().split(") ")[1][0]
        except (FileNotFoundError, ProcessLookupError):
            break
        if state == "Z":
            break
        time.sleep(0.05)
    else:
        raise AssertionError("the orphan survived the run")


def test_seeds_run_both_trainers_at_every_seed_interleaved():
    args = lc.parse_args(["--runs", "ours", "trl", "--seeds", "0", "1", "2", "--lrs", "2e-5"])
    runs = lc.build_runs(args)
    assert [r.name for r in runs] == [
        "ours@2e-05#s0",
        "trl@2e-05#s0",
        "trl@2e-05#s1",
        "ours@2e-05#s1",
        "ours@2e-05#s2",
        "trl@2e-05#s2",
    ]
    assert [r.seed for r in runs] == [0, 0, 1, 1, 2, 2]


def test_trl_gets_the_prompts_ours_draws_for_the_same_seed():
    from grpo_envs import make
    from grpo_train.collect.training_prompts import PromptSettings, TrainingPrompts

    env = make("math/arithmetic-v0", task="add2", answer="loose")
    for seed in (0, 3):
        ours = TrainingPrompts([[env]], [0], ["add"], [1.0], PromptSettings(), seed)
        drawn = [sample.id for sample, _ in ours.draw(12)]
        rows = env.dataset("train")
        order = lc.prompt_order(len(rows), seed, 12)
        assert [str(rows[i]["id"]) for i in order] == drawn
    assert lc.prompt_order(len(rows), 0, 12) != lc.prompt_order(len(rows), 1, 12)


def test_the_prompts_a_trl_run_must_score_are_ours_step_by_step():
    from grpo_envs import make
    from grpo_train.collect.training_prompts import PromptSettings, TrainingPrompts

    task = lc.Task("math/arithmetic-v0", {"task": "add2", "answer": "loose"})
    shared = lc.Shared("m", task, prompts=4, group=8, completion_length=64, temperature=1.0,
                       eval_every=2, seed=0)  # fmt: skip
    env = make("math/arithmetic-v0", task="add2", answer="loose")
    per_seed = {}
    for seed in (0, 1):
        want = lc.expected_prompt_ids(lc.RunSpec("t", "trl", 3, 2e-5, seed=seed), shared)
        ours = TrainingPrompts([[env]], [0], ["add"], [1.0], PromptSettings(), seed)
        assert want == [[s.id for s, _ in ours.draw(4)] for _ in range(3)]
        assert lc.check_prompts(want, want) == ""
        per_seed[seed] = want
    # A TRL run that scored another seed's prompts (or the same prompts again) is caught.
    assert per_seed[0] != per_seed[1]
    assert lc.check_prompts(per_seed[1], per_seed[0]).startswith("step 1 scored")
    assert "expected 3" in lc.check_prompts(per_seed[0][:2], per_seed[0])


def test_seed_report_states_noise_and_censoring():
    def seeded(trainer, seed, accs, step_s):
        r = lc.RunResult(lc.RunSpec(f"{trainer}#s{seed}", trainer, 2, 2e-5, seed=seed))
        r.step_s = step_s
        r.points = [lc.Point(i + 1, sum(step_s[: i + 1]), "", a) for i, a in enumerate(accs)]
        return r

    runs = [
        seeded("ours", 0, [0.2, 0.5], [10.0, 10.0]),
        seeded("trl", 0, [0.3, 0.6], [30.0, 30.0]),
        seeded("ours", 1, [0.1, 0.2], [10.0, 12.0]),
        seeded("trl", 1, [0.2, 0.5], [30.0, 30.0]),
    ]
    text = lc.seed_report(runs, 0.1, 0.4)
    # step 2: ours 0.5 and 0.2 -> 35.0 ± 15.0; TRL 0.6 and 0.5 -> 55.0 ± 5.0
    assert "35.0 ± 15.0 (2)" in text and "55.0 ± 5.0 (2)" in text
    # paired differences at step 2: -0.1 and -0.3 -> -20.0 ± 10.0, exactly two SE: not noise
    assert "lr 2e-05, step 2: ours - TRL = -20.0 ± 10.0 points over 2 seeds: TRL ahead" in text
    assert "ours@2e-05: target reached by 1/2 seeds; time 20 s" in text
    assert "censored: s1 > 22 s (2 steps)" in text
    assert "trl@2e-05: target reached by 2/2 seeds; time 60 ± 0 s" in text
    assert "ours 2.9x faster per step" in text  # 30 / mean(10, 11) = 2.86
    assert "so no ratio of means" in text
    # ours: 20 s and censored -> the median of two needs both; TRL: 60 and 60
    assert "median time-to-target not defined for ours" in text


def test_a_hashed_sampling_seed_is_an_arm_of_its_own_paired_with_ours():
    args = lc.parse_args(
        ["--runs", "ours", "trl", "--seeds", "0", "1", "--trl-sampling-seed", "hashed"]
    )
    specs = lc.build_runs(args)
    trl = [s for s in specs if s.trainer == "trl"]
    assert [s.seed for s in trl] == [0, 1]  # the race seed: the same prompts as ours
    assert {s.arm_name() for s in trl} == {"trl[sampling_seed=hashed]"}
    assert all(not s.overrides for s in specs if s.trainer == "ours")
    shared = lc.shared_settings(args)
    # TRL samples with the hash, never with the small seed itself.
    assert [lc.trl_sampling_seed(s, shared) for s in trl] == [lc.hashed_seed(0), lc.hashed_seed(1)]
    assert len({lc.hashed_seed(s) for s in range(1000)}) == 1000
    with pytest.raises(ValueError, match="sampling_seed='lucky'"):
        lc.trl_sampling_seed(lc.RunSpec("t", "trl", 2, 2e-5, {"sampling_seed": "lucky"}), shared)

    def seeded(spec, accs, step_s):
        r = lc.RunResult(spec, step_s=step_s)
        r.points = [lc.Point(i + 1, sum(step_s[: i + 1]), "", a) for i, a in enumerate(accs)]
        return r

    hashed = {"sampling_seed": "hashed"}
    runs = [
        seeded(lc.RunSpec("o0", "ours", 2, 2e-5, seed=0), [0.2, 0.5], [10.0, 10.0]),
        seeded(lc.RunSpec("t0", "trl", 2, 2e-5, seed=0), [0.4, 0.7], [30.0, 30.0]),
        seeded(lc.RunSpec("h0", "trl", 2, 2e-5, hashed, seed=0), [0.1, 0.4], [30.0, 30.0]),
        seeded(lc.RunSpec("o1", "ours", 2, 2e-5, seed=1), [0.1, 0.3], [10.0, 10.0]),
        seeded(lc.RunSpec("t1", "trl", 2, 2e-5, seed=1), [0.3, 0.6], [30.0, 30.0]),
        seeded(lc.RunSpec("h1", "trl", 2, 2e-5, hashed, seed=1), [0.1, 0.2], [30.0, 30.0]),
    ]
    text = lc.seed_report(runs, 0.1, 0.4)
    # Each TRL arm is paired with ours on its own: step 2, ours - TRL = -0.2 and -0.3;
    # ours - hashed = +0.1 and +0.1.
    assert "step 2: ours - TRL = -25.0 ± 5.0 points over 2 seeds: TRL ahead" in text
    assert "step 2: ours - TRL[sampling_seed=hashed] = 10.0 ± 0.0 points over 2 seeds" in text
    assert "ours 3.0x faster per step than TRL[sampling_seed=hashed]" in text
    # ours reaches 0.4 at s0 only (20 s); hashed at s0 only (60 s): medians are undefined...
    assert "median time-to-target not defined for ours and TRL[sampling_seed=hashed]" in text
    # ...while TRL at the race seeds gets there at both (30 s and 60 s)
    assert "median time-to-target not defined for ours (half" in text


def test_mean_se_matches_a_hand_computation():
    m = lc.mean_se([0.1, 0.3, 0.8])
    # mean 0.4; deviations -0.3, -0.1, 0.4; sum of squares 0.26; s = sqrt(0.13); se = s / sqrt(3)
    assert m.mean == pytest.approx(0.4)
    assert m.se == pytest.approx((0.13**0.5) / 3**0.5)
    with pytest.raises(ValueError):
        lc.mean_se([])
