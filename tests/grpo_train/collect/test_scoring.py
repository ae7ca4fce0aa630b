"""``collect.scoring.ScoringStage``: groups scored as they finish, by index, failures raised.

And the collector with it (``overlap_scoring``): a step whose prompts finish over time and whose
scorer is slow costs about max(generation, scoring), with the same groups as scoring afterwards.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from toy_env import DigitEnv

from grpo_envs.types import Outcome, Sample, Score
from grpo_train.collect.collector import Collector, CollectorSettings
from grpo_train.collect.pipeline import RolloutPipeline
from grpo_train.collect.scoring import ScoringStage
from grpo_train.collect.training_prompts import PromptSettings, TrainingPrompts
from grpo_train.episodes.prompts import PromptFormat
from grpo_train.parallel.distributed import RankInfo
from grpo_train.rollout.base import Completion, SamplingConfig


class SlowDigitEnv(DigitEnv):
    """``DigitEnv`` whose ``score_batch`` sleeps ``per_completion_s`` per completion."""

    def __init__(self, per_completion_s: float = 0.0, raises: BaseException | None = None):
        super().__init__()
        self.per_completion_s, self.raises = per_completion_s, raises
        self.calls: list[int] = []  # completions per call
        self.spans: list[tuple[float, float, str]] = []  # each call's start, end and thread

    def score_batch(self, completions, samples, **options) -> list[Score]:
        self.calls.append(len(completions))
        start = time.perf_counter()
        time.sleep(self.per_completion_s * len(completions))
        name = threading.current_thread().name
        self.spans.append((start, time.perf_counter(), name))
        if self.raises is not None:
            raise self.raises
        return super().score_batch(completions, samples, **options)


class Interrupted(BaseException):
    """Not an ``Exception``: ``guarded_scores`` lets it through, as it does KeyboardInterrupt."""


def completion(index: int, text: str) -> Completion:
    return Completion(index, text, (1, 2), (-0.5, -0.5), "stop")


def groups_of(n_prompts: int, n: int = 3) -> list[list[Completion]]:
    """Prompt k's group: completions that start with a digit for some (k, j), not others."""
    return [
        [completion(k, f"{k}{j}" if (k + j) % 2 else f"no {k}{j}") for j in range(n)]
        for k in range(n_prompts)
    ]


def drawn_of(n_prompts: int, n_envs: int = 2) -> list[tuple[Sample, int]]:
    return [
        (Sample(id=f"s{k}", prompt=(), answer="7", env_id="test"), k % n_envs)
        for k in range(n_prompts)
    ]


def test_scores_are_placed_by_prompt_index_whatever_order_groups_finish_in() -> None:
    envs = [SlowDigitEnv(0.002), SlowDigitEnv(0.002)]
    groups, drawn = groups_of(8), drawn_of(8)
    with ScoringStage(envs, drawn, background=False) as after:
        expected = after.finish(groups)
    assert [len(s) for s in expected] == [3] * 8
    assert {s.outcome for g in expected for s in g} == {Outcome.CORRECT, Outcome.WRONG}
    for order in ([7, 6, 5, 4, 3, 2, 1, 0], [3, 0, 6, 1, 7, 2, 5, 4]):
        calls_before = [len(env.calls) for env in envs]
        with ScoringStage(envs, drawn, background=True) as stage:
            for k in order:
                stage.submit(k, groups[k])
                time.sleep(0.01)  # the thread scores the first groups while others arrive
            assert stage.finish(groups) == expected
        # Scored as they came: more than one call per environment, every completion once.
        assert sum(len(env.calls) - before for env, before in zip(envs, calls_before)) > 2
        assert all(sum(env.calls[before:]) == 12 for env, before in zip(envs, calls_before))
        assert stage.overlapped_s > 0  # scoring ran before finish was called


def test_groups_the_engine_did_not_report_are_scored_at_finish() -> None:
    # An engine that cannot stream reports nothing early (or only some groups): finish scores
    # the rest, with the same result.
    groups, drawn = groups_of(4), drawn_of(4)
    envs = [DigitEnv(), DigitEnv()]
    expected = ScoringStage(envs, drawn, background=False).finish(groups)
    with ScoringStage(envs, drawn) as stage:
        stage.submit(2, groups[2])
        assert stage.finish(groups) == expected
    with ScoringStage(envs, drawn) as nothing_early:
        assert nothing_early.finish(groups) == expected
    with ScoringStage(envs, []) as empty:
        assert empty.finish([]) == []


def test_each_prompt_is_reported_once_and_only_prompts_of_the_call() -> None:
    groups, drawn = groups_of(3), drawn_of(3)
    with ScoringStage([DigitEnv(), DigitEnv()], drawn) as stage:
        stage.submit(1, groups[1])
        with pytest.raises(ValueError, match="reported twice"):
            stage.submit(1, groups[1])
        with pytest.raises(IndexError, match="prompt 3 reported; this call has 3"):
            stage.submit(3, groups[0])
        with pytest.raises(ValueError, match="2 groups generated for 3 prompts"):
            stage.finish(groups[:2])


@pytest.mark.parametrize("background", [True, False])
def test_what_a_scorer_raises_beyond_the_guard_surfaces_in_the_collecting_thread(
    background: bool,
) -> None:
    groups, drawn = groups_of(4), drawn_of(4, n_envs=1)
    stage = ScoringStage([SlowDigitEnv(raises=Interrupted("stop now"))], drawn, background)
    with stage, pytest.raises(Interrupted, match="stop now"):
        for k, group in enumerate(groups):
            stage.submit(k, group)
        stage.finish(groups)
    assert stage._thread is None or not stage._thread.is_alive()
    # An Exception is the guard's: error scores, as without the stage.
    stage = ScoringStage([SlowDigitEnv(raises=RuntimeError("scorer bug"))], drawn, background)
    with stage:
        for k, group in enumerate(groups):
            stage.submit(k, group)
        scores = stage.finish(groups)
    assert [s.reward for g in scores for s in g] == [
        1.0 if c.text[0].isdigit() else 0.0 for g in groups for c in g
    ]  # scored one by one after the batch raised


def test_a_stage_left_early_stops_its_thread_without_waiting_for_it() -> None:
    # Generation failed (an engine died, a stop): leaving the stage does not wait for the call
    # in progress, and the thread ends after it; it is a daemon either way.
    groups, drawn = groups_of(3), drawn_of(3, n_envs=1)
    env = SlowDigitEnv(0.5)
    with pytest.raises(RuntimeError, match="engine died"), ScoringStage([env], drawn) as stage:
        stage.submit(0, groups[0])
        while not env.calls:  # the thread is in its 1.5 s call
            time.sleep(0.005)
        t = time.perf_counter()
        raise RuntimeError("engine died")
    assert time.perf_counter() - t < 1.0  # leaving did not wait for the call
    thread = stage._thread
    assert thread is not None and thread.daemon
    thread.join(10)
    assert not thread.is_alive() and env.calls == [3]


# --- the collector with a slow scorer -------------------------------------------------------


class TimedEngine:
    """A fake engine whose prompts finish one at a time, ``per_prompt_s`` apart, last first."""

    name = "timed"
    last_sync_seconds = 0.0

    def __init__(self, per_prompt_s: float) -> None:
        self.per_prompt_s = per_prompt_s

    def generate(
        self,
        prompt_token_ids: Sequence[Sequence[int]],
        sampling: SamplingConfig,
        on_done: Callable[[int, list[Completion]], None] | None = None,
    ) -> list[list[Completion]]:
        results: list[list[Completion]] = [[] for _ in prompt_token_ids]
        for i in reversed(range(len(prompt_token_ids))):
            time.sleep(self.per_prompt_s)
            seed = (sum(prompt_token_ids[i]) + (sampling.seed or 0)) % 7
            results[i] = [
                completion(i, f"{seed + j}" if (seed + j) % 3 else "none")
                for j in range(sampling.n)
            ]
            if on_done is not None:
                on_done(i, results[i])
        return results


def _collector(
    tiny_model_path: Path, tmp_path: Path, env: SlowDigitEnv, engine: TimedEngine, overlap: bool
) -> Collector:
    from transformers import AutoTokenizer

    settings = CollectorSettings(
        prompts_per_step=6, num_generations=4, max_prompt_length=64, max_completion_length=8,
        max_turn_tokens=0, temperature=1.0, top_p=1.0, seed=3, seed_per_prompt=False,
        tensor_parallel=1, history_policy="keep", fatal_template_breaks=False,
        dynamic_sampling_rounds=0, curriculum_threshold=0.6, max_reward_errors=0.5,
        overlap_scoring=overlap,
    )  # fmt: skip
    prompts = TrainingPrompts([[env]], [0], ["slow"], [1.0], PromptSettings(), seed=0)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    rank = RankInfo(rank=0, world_size=1, local_rank=0)
    return Collector(settings, prompts, engine, tokenizer, PromptFormat(), rank, tmp_path)


def test_overlapped_scoring_costs_about_the_longer_phase_and_changes_no_group(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    # 6 prompts finishing 0.15 s apart (0.9 s of generation); scoring a group takes 0.15 s
    # (0.9 s in all). After generation: about 1.8 s; overlapped: about 0.9 s + the last group.
    env = SlowDigitEnv(per_completion_s=0.15 / 4)
    runs = {}
    for overlap in (False, True):
        collector = _collector(tiny_model_path, tmp_path, env, TimedEngine(0.15), overlap)
        times: defaultdict[str, float] = defaultdict(float)
        t = time.perf_counter()
        groups = collector.collect(6, 1, 0, times)
        runs[overlap] = (groups, time.perf_counter() - t, dict(times), collector)
    (after, after_s, after_times, _), (overlapped, overlapped_s, times, collector) = (
        runs[False],
        runs[True],
    )
    assert overlapped == after  # same samples, completions and scores, in the same order
    assert {s.outcome for g in after for s in g.scores} == {Outcome.CORRECT, Outcome.WRONG}
    assert after_s > 1.6 and after_times["score"] > 0.8
    assert overlapped_s < 0.75 * after_s, (overlapped_s, after_s)
    # "score" is the wait after generation; the hidden part is reported on its own.
    assert times["score"] < 0.5 * after_times["score"]
    assert collector.score_overlapped_s > 0.4
    assert not any(t.name == "scoring" and t.is_alive() for t in threading.enumerate())


@pytest.mark.parametrize("overlap", [True, False])
def test_with_async_generation_the_next_batch_is_scored_while_the_update_runs(
    tiny_model_path: Path, tmp_path: Path, overlap: bool
) -> None:
    # The producer thread (collect.pipeline) runs the whole sample_batch, scoring included,
    # while the trainer's thread updates: with or without overlap_scoring, batch 2 is generated
    # and scored during step 1's update (here 2 s of sleep; the batch takes about 1.2 s).
    env = SlowDigitEnv(per_completion_s=0.1 / 4)
    collector = _collector(tiny_model_path, tmp_path, env, TimedEngine(0.1), overlap)
    pipeline = RolloutPipeline(collector, max_staleness=1, last_step=2)
    try:
        times: dict[str, float] = {}
        pipeline.take(1, times, dynamic=False)  # waits for batch 1; batch 2 starts
        first_batch_calls = len(env.spans)
        update_start = time.perf_counter()
        time.sleep(2.0)  # the update
        update_end = time.perf_counter()
        pipeline.before_sync(1, times)  # waits for batch 2 before the weights change
        waited = time.perf_counter() - update_end
    finally:
        pipeline.close()
    second = env.spans[first_batch_calls:]
    assert second and all(update_start < start and end < update_end for start, end, _ in second)
    assert waited < 0.5, waited
    # Who scored: the scoring thread that the producer started, or the producer itself.
    assert {name for _, _, name in second} == {"scoring" if overlap else "rollouts"}
