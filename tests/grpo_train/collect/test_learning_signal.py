"""The learning-signal guard: one line when nearly every group has equal rewards, for steps."""

from grpo_train.collect.learning_signal import AutoSettings, SignalGuard
from grpo_train.run.checkpoint import SamplerState


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
    cfg = AutoSettings(temperature=0.9, num_generations=4)
    line = SignalGuard().advice(7, cfg, dynamic_sampling_now_on=False)
    assert "\n" not in line and "step 7" in line
    for hint in ("dynamic_sampling", "temperature (now 0.9)", "num_generations, now 4"):
        assert hint in line
    assert "partial credit" in line and "curriculum" in line
    on = SignalGuard().advice(7, cfg, dynamic_sampling_now_on=True)
    assert "dynamic_sampling=auto is now on" in on


class _Prompts:
    """A task with an easier version: ``ease`` sends it to stage 1 of 2, as TrainingPrompts."""

    def __init__(self, stage: int = 2) -> None:
        self.stage = stage

    def stage_metrics(self) -> dict[str, float]:
        return {"curriculum/stage/task": float(self.stage)}

    def describe_stage(self, name: str) -> str:
        return f"{name} stage {self.stage}/2"

    def ease(self) -> list[str]:
        if self.stage == 1:
            return []
        self.stage = 1
        return ["task stage 1/2"]


def _stalled(stage: float) -> dict[str, float]:
    return {"group/frac_zero_std": 1.0, "curriculum/stage/task": stage}


def test_auto_heuristics_ease_first_then_dynamic_sampling_and_record_each_switch():
    from grpo_train.collect.learning_signal import AutoHeuristics

    prompts = _Prompts()
    auto = AutoHeuristics(AutoSettings(), prompts, None, 0)  # curriculum, dynamic sampling: auto
    assert not auto.dynamic_sampling
    assert [auto.watch(s, _stalled(2.0)) for s in (1, 2)] == [None, None]
    advice = auto.watch(3, _stalled(2.0))  # the stall: the task drops to its easy version
    assert advice is not None and "curriculum=auto: task stage 1/2" in advice
    assert not auto.dynamic_sampling and auto.guard.eased
    # The easy version is passed (stage 2 again at step 5), then the signal stalls once more:
    # now dynamic sampling turns on instead of easing a second time.
    for step, stage in ((4, 1.0), (5, 2.0), (6, 2.0)):
        prompts.stage = int(stage)
        auto.watch(step, _stalled(stage))
    assert auto.dynamic_sampling
    assert [s.describe() for s in auto.switches] == [
        "after step 3: curriculum=auto sent task stage 1/2",
        "after step 5: curriculum moved task stage 2/2",
        "after step 6: dynamic_sampling=auto on for the rest of the run",
    ]
    saved = auto.saved_into(SamplerState(4, (4,)))
    assert (saved.signal_streak, saved.signal_fired, saved.signal_eased) == (3, True, True)
    # A resumed launch continues from that state and says what was already on.
    resumed = AutoHeuristics(AutoSettings(), _Prompts(), saved, 6)
    assert resumed.dynamic_sampling and resumed.guard.streak == 3
    assert [s.describe() for s in resumed.switches] == [
        "after step 6: curriculum=auto had eased (resumed)",
        "after step 6: dynamic_sampling=auto was on (resumed)",
    ]


def test_auto_heuristics_leave_a_configured_algorithm_alone():
    from grpo_train.collect.learning_signal import AutoHeuristics

    config = AutoSettings(dynamic_sampling="off", curriculum="off")
    auto = AutoHeuristics(config, _Prompts(), None, 0)
    advice = [auto.watch(s, _stalled(2.0)) for s in (1, 2, 3)]
    assert advice[:2] == [None, None] and advice[2] is not None  # the advice line, still
    assert not auto.dynamic_sampling and auto.switches == []
