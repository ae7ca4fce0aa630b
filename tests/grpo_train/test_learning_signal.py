"""The learning-signal guard: one line when nearly every group has equal rewards, for steps."""

from grpo_train.config import TrainConfig
from grpo_train.learning_signal import SignalGuard


def test_fires_once_after_three_steps_without_signal():
    guard = SignalGuard()
    fired = [guard.update(f) for f in (1.0, 1.0, 1.0, 1.0, 1.0)]
    assert fired == [False, False, True, False, False]


def test_the_default_runs_first_steps_do_not_fire_it():
    # The embedded default run starts with 3 of its 4 groups all wrong (frac_zero_std 0.75) and
    # learns within a few steps: that is signal enough, and its result must not change.
    guard = SignalGuard()
    assert not any(guard.update(f) for f in (0.75, 0.75, 0.75, 0.5, 0.25, 0.75))


def test_a_break_in_the_streak_starts_it_over():
    guard = SignalGuard()
    assert not any(guard.update(f) for f in (1.0, 1.0, 0.5, 1.0, 1.0))
    assert guard.update(1.0)


def test_rearmed_after_an_easier_stage_it_fires_again_on_a_new_stall():
    guard = SignalGuard()
    assert [guard.update(1.0) for _ in range(3)] == [False, False, True]
    guard.rearm()
    assert guard.eased and not guard.fired and guard.streak == 0
    assert [guard.update(f) for f in (1.0, 1.0, 0.5, 1.0, 1.0, 1.0)] == [False] * 5 + [True]
    assert guard.eased  # the curriculum answers a stall once; the next one is dynamic sampling's


def test_the_advice_names_what_to_try_with_the_runs_numbers():
    cfg = TrainConfig.from_flat({"temperature": 0.9, "num_generations": 4})
    line = SignalGuard().advice(7, cfg, dynamic_sampling_now_on=False)
    assert "\n" not in line and "step 7" in line
    for hint in ("dynamic_sampling", "temperature (now 0.9)", "num_generations, now 4"):
        assert hint in line
    assert "partial credit" in line and "curriculum" in line
    on = SignalGuard().advice(7, cfg, dynamic_sampling_now_on=True)
    assert "dynamic_sampling=auto is now on" in on
