"""The accuracy-driven curriculum and the online pass-rate filter, against hand-worked sequences."""

import json

import pytest

from grpo_train.collect.curriculum import AccuracyCurriculum, CurriculumState, PassRateFilter


def test_moves_up_when_the_window_mean_reaches_the_threshold_and_restarts_its_history():
    c = AccuracyCurriculum([3], threshold=0.6, window=3)
    # window means: -, -, (0.5+0.6+0.6)/3=0.567, (0.6+0.6+0.7)/3=0.633 -> up
    assert [c.record([a]) for a in (0.5, 0.6, 0.6, 0.7)] == [[], [], [], [0]]
    assert c.stage(0) == 1 and c.state().recent == ((),)
    # The old stage's accuracies do not count at the new stage: three fresh steps are needed.
    # window means: -, -, (0.9+0.3+0.3)/3=0.5, (0.3+0.3+0.9)/3=0.5, (0.3+0.9+0.9)/3=0.7 -> up
    assert [c.record([a]) for a in (0.9, 0.3, 0.3, 0.9, 0.9)] == [[], [], [], [], [0]]
    assert c.stage(0) == 2 and c.is_final(0)
    # The last stage is final: no more moves, no history kept.
    assert c.record([1.0]) == [] and c.state().recent == ((),)


def test_environments_are_independent_and_a_step_without_prompts_does_not_count():
    c = AccuracyCurriculum([2, 2, 1], threshold=0.5, window=2)
    assert c.record([0.9, None, 1.0]) == []
    assert c.record([None, 0.9, 1.0]) == []  # env 0 has one value, env 1 one value
    assert c.record([0.1, 0.0, 1.0]) == [0]  # env 0: (0.9 + 0.1) / 2 = 0.5; env 1: 0.45
    assert (c.stage(0), c.stage(1), c.stage(2)) == (1, 0, 0)
    assert c.state().recent == ((), (0.9, 0.0), ())


def test_state_round_trips_through_json_and_resumes_the_same_decisions():
    a = AccuracyCurriculum([3, 2], threshold=0.5, window=2)
    a.record([0.7, 0.2])
    saved = json.loads(json.dumps(a.state().to_json()))
    b = AccuracyCurriculum([3, 2], 0.5, 2, CurriculumState.from_json(saved))
    assert [a.record([0.4, 0.9]), a.record([0.8, 0.1])] == [
        b.record([0.4, 0.9]),
        b.record([0.8, 0.1]),
    ]
    assert a.state() == b.state()


def test_start_at_the_final_stage_and_restart_from_the_easiest():
    c = AccuracyCurriculum([3, 1], 0.5, 1, CurriculumState((2, 0), ((), ())))
    assert c.is_final(0) and c.record([0.0, 0.0]) == []
    c.restart(0)
    assert c.stage(0) == 0 and not c.is_final(0)
    c.restart(1)  # nothing easier: stays
    assert c.stage(1) == 0 and c.is_final(1)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (([2], 0.0, 2), "threshold"),
        (([2], 1.5, 2), "threshold"),
        (([2], 0.5, 0), "window"),
        (([0], 0.5, 2), "at least one stage"),
    ],
)
def test_bad_settings_name_the_field(args, message):
    with pytest.raises(ValueError, match=message):
        AccuracyCurriculum(*args)


def test_a_saved_state_that_does_not_fit_the_run_is_refused():
    with pytest.raises(ValueError, match="2 environment"):
        AccuracyCurriculum([3], 0.5, 2, CurriculumState((0, 0), ((), ())))
    with pytest.raises(ValueError, match="saved stage 3"):
        AccuracyCurriculum([3], 0.5, 2, CurriculumState((3,), ((),)))
    with pytest.raises(ValueError, match="lists"):
        CurriculumState.from_json({"stages": 1})


def test_filter_skips_solved_and_unsolved_prompts_and_retries_them():
    f = PassRateFilter(retry_after=1)
    never, always, mixed, unseen = [(0, 0, f"train-{i}") for i in range(4)]
    f.record(never, 0.0)
    f.record(always, 1.0)
    f.record(mixed, 0.25)
    assert [f.skip(k) for k in (never, always, mixed, unseen)] == [True, True, False, False]
    # retry_after=1: skipped once, then drawn again; a new visit's pass rate decides from then on.
    assert f.skip(never) is False
    f.record(never, 0.5)
    assert f.skip(never) is False and f.skip(never) is False
    # Another stage of the same row is another prompt.
    assert f.skip((0, 1, "train-1")) is False


def test_filter_memory_round_trips_through_json():
    f = PassRateFilter(retry_after=3)
    f.record((1, 0, "train-5"), 1.0)
    f.skip((1, 0, "train-5"))
    g = PassRateFilter(retry_after=3)
    g.load_json(json.loads(json.dumps(f.to_json())))
    assert [g.skip((1, 0, "train-5")) for _ in range(3)] == [
        f.skip((1, 0, "train-5")) for _ in range(3)
    ]
    with pytest.raises(ValueError, match="expected"):
        g.load_json([[1, 2]])
    with pytest.raises(ValueError, match="retry_after"):
        PassRateFilter(retry_after=0)


# --- in the trainer: short CPU runs on the tiny model -----------------------------------------

from toy_env import DigitEnv  # noqa: E402

from grpo_envs.types import Component, Outcome, Score  # noqa: E402
from grpo_train.collect.training_prompts import TrainingPrompts  # noqa: E402
from grpo_train.run.run_log import read_metrics  # noqa: E402
from grpo_train.trainer import Trainer  # noqa: E402

STAGE = "curriculum/stage/test/digit-v0"


class ConstantEnv(DigitEnv):
    """Every completion gets the same reward: 1 (an easy stage) or 0 (a task out of reach)."""

    def __init__(self, reward: float, easier: tuple[DigitEnv, ...] = (), size: int = 64) -> None:
        super().__init__(size=size)
        self.reward, self.easier = reward, easier

    def easier_versions(self):
        return list(self.easier)

    def score(self, completion, sample):
        ok = self.reward == 1.0
        return Score(
            self.reward,
            Outcome.CORRECT if ok else Outcome.WRONG,
            (Component("digit", self.reward),),
        )


class LadderDigitEnv(DigitEnv):
    """The digit task, with an easier version where every answer is right."""

    def easier_versions(self):
        return [ConstantEnv(1.0, size=self.size)]


def test_training_prompts_draw_the_current_stage_under_their_own_ids():
    from grpo_train.collect.groups import Group
    from grpo_train.collect.training_prompts import PromptSettings

    easy, task = ConstantEnv(1.0, size=3), DigitEnv(size=5)
    data = PromptSettings(curriculum_threshold=0.5, curriculum_window=1)
    prompts = TrainingPrompts([[easy, task]], [0], ["digits"], [1.0], data, seed=0)
    drawn = prompts.draw(4)
    assert [env for _, env in drawn] == [0] * 4
    assert all(s.id.startswith("stage-1/train-") for s, _ in drawn)
    right = Score(1.0, Outcome.CORRECT)
    groups = [Group(s, 0, [1], [], [right, right]) for s, _ in drawn]
    metrics, moved = prompts.record(groups)
    assert moved == ["digits stage 2/2"] and metrics == {"curriculum/stage/digits": 2.0}
    # The task itself: its own rows (5 of them, a fresh order) under their own ids.
    ids = [s.id for s, _ in prompts.draw(5)]
    assert sorted(ids) == [f"train-{i}" for i in range(5)]
    assert prompts.state().curriculum == {"stages": [1], "recent": [[]]}


def _config(model_path, out, **overrides):
    from test_trainer import make_config

    values = {"max_steps": 4, "eval_size": 0, "curriculum_window": 2, "log_every_samples": 0}
    return make_config(model_path, out, **{**values, **overrides})


def _run(config, env):
    trainer = Trainer(config, env=env)
    try:
        return trainer, trainer.train()
    finally:
        trainer.close()


def test_curriculum_on_trains_the_easy_stage_first_then_moves_up(tiny_model_path, tmp_path):
    _run(_config(tiny_model_path, tmp_path, curriculum="on"), LadderDigitEnv())
    rows = read_metrics(tmp_path)
    # Steps 1-2 draw the easy stage (every answer right: reward 1); after two steps at accuracy
    # 1.0 >= 0.6 it moves to the task itself, where the random policy is right ~5% of the time.
    assert [r["reward/mean"] for r in rows[:2]] == [1.0, 1.0]
    assert [r[STAGE] for r in rows] == [1.0, 2.0, 2.0, 2.0]
    assert max(r["reward/mean"] for r in rows[2:]) < 0.5


def test_curriculum_auto_eases_a_task_without_signal_and_climbs_back(
    tiny_model_path, tmp_path, capsys
):
    hard = ConstantEnv(0.0, easier=(ConstantEnv(1.0),))
    config = _config(
        tiny_model_path, tmp_path, curriculum="auto", max_steps=7, dynamic_sampling_rounds=1
    )
    _, result = _run(config, hard)
    rows = read_metrics(tmp_path)
    # Steps 1-3: no signal at all; the guard fires after step 3 and the task drops to its easy
    # version (steps 4-5: reward 1), which it passes within the window: back to the task.
    assert [r[STAGE] for r in rows] == [2.0, 2.0, 2.0, 1.0, 2.0, 2.0, 2.0]
    assert [r["reward/mean"] for r in rows] == [0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0]
    out = capsys.readouterr().out
    assert "curriculum=auto: test/digit-v0 stage 1/2" in out
    # The curriculum answered the first stall: no extra draws (dynamic sampling stays off).
    assert not any("dynamic/rounds" in r for r in rows[:6])
    # Steps 4-6 had equal rewards again (all right, then all wrong): the re-armed guard fires
    # a second time, and now dynamic_sampling=auto draws more instead of easing again.
    assert out.count("learning signal:") == 2 and "dynamic_sampling=auto is now on" in out
    assert rows[6]["dynamic/rounds"] == 1.0 and rows[6][STAGE] == 2.0
    # The run's result (and summary) says what switched, and after which step.
    assert [s.describe() for s in result.switches] == [
        "after step 3: curriculum=auto sent test/digit-v0 stage 1/2",
        "after step 5: curriculum moved test/digit-v0 stage 2/2",
        "after step 6: dynamic_sampling=auto on for the rest of the run",
    ]


def test_a_resumed_run_reports_the_switches_of_its_earlier_launches(tiny_model_path, tmp_path):
    import json

    from test_trainer import _stop_after

    from grpo_train.run.checkpoint import latest_checkpoint

    hard = ConstantEnv(0.0, easier=(ConstantEnv(1.0),))
    settings = {"curriculum": "auto", "max_steps": 7, "dynamic_sampling_rounds": 1}
    cut = Trainer(_config(tiny_model_path, tmp_path, **settings), env=hard)
    _stop_after(cut, 4)  # after the first launch's switch (after step 3)
    try:
        assert cut.train().interrupted
    finally:
        cut.close()
    saved = latest_checkpoint(tmp_path)
    assert saved is not None and saved.name == "step-000004"
    manifest = json.loads((saved / "manifest.json").read_text())
    assert "switches.json" in manifest["files"]  # verified on resume like every other file
    _, result = _run(_config(tiny_model_path, tmp_path, resume="latest", **settings), hard)
    # The same list as the uninterrupted run's: the first launch's switch, then this one's.
    assert [s.describe() for s in result.switches] == [
        "after step 3: curriculum=auto sent test/digit-v0 stage 1/2",
        "after step 5: curriculum moved test/digit-v0 stage 2/2",
        "after step 6: dynamic_sampling=auto on for the rest of the run",
    ]


def test_curriculum_off_never_changes_the_task(tiny_model_path, tmp_path, capsys):
    hard = ConstantEnv(0.0, easier=(ConstantEnv(1.0),))
    _, result = _run(_config(tiny_model_path, tmp_path, curriculum="off", max_steps=4), hard)
    rows = read_metrics(tmp_path)
    assert [r["reward/mean"] for r in rows] == [0.0] * 4 and STAGE not in rows[0]
    assert "curriculum=auto" not in capsys.readouterr().out
    # dynamic_sampling=auto (the default) turned on after step 3, when the guard fired.
    assert [s.describe() for s in result.switches] == [
        "after step 3: dynamic_sampling=auto on for the rest of the run"
    ]


def test_online_filtering_skips_decided_prompts_and_resumes_exactly(tiny_model_path, tmp_path):
    import torch
    from test_trainer import _deterministic, _stop_after

    # 6 training rows, 4 prompts a step: rows repeat from step 2 on, and the solved ones (the
    # easy stage answers everything) are skipped.
    def env():
        return LadderDigitEnv(size=6)

    settings = {"curriculum": "on", "online_filtering": True, "curriculum_window": 3}
    full, _ = _run(_config(tiny_model_path, tmp_path / "full", **settings), env())
    rows = read_metrics(tmp_path / "full")
    assert rows[0]["curriculum/filtered_share"] == 0.0
    assert rows[1]["curriculum/filtered_share"] > 0.0
    cut = Trainer(_config(tiny_model_path, tmp_path / "cut", **settings), env=env())
    _stop_after(cut, 2)
    assert cut.train().interrupted
    cut.close()
    resumed, _ = _run(
        _config(tiny_model_path, tmp_path / "cut", resume="latest", **settings), env()
    )
    a, b = _deterministic(read_metrics(tmp_path / "cut")), _deterministic(rows)
    assert a == b
    state = full.setup.model.state_dict()
    assert all(torch.equal(resumed.setup.model.state_dict()[k], v) for k, v in state.items())
