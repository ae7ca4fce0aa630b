"""async_generation: the staleness schedule, the producer's order, the drop rule, resume."""

import signal
import threading
from types import SimpleNamespace

import pytest
import torch
from test_trainer import _deterministic, _stop_after, make_config
from toy_env import DigitEnv

from grpo_train.collect.pipeline import (
    RolloutPipeline,
    Rollouts,
    generating_version,
    startable_through,
    sync_waits_for,
)
from grpo_train.config import ConfigError, TrainConfig
from grpo_train.rollout import make_engine
from grpo_train.rollout.base import EngineDied
from grpo_train.run.checkpoint import SamplerState, latest_checkpoint, read_rollouts
from grpo_train.run.run_log import read_metrics
from grpo_train.trainer import Trainer


def test_the_schedule_by_hand():
    # s = 1: batches 1 and 2 come from the initial weights, then batch k from version k - 2.
    assert [generating_version(k, 1) for k in range(1, 6)] == [0, 0, 1, 2, 3]
    # s = 2: three batches from version 0; staleness at step k is (k - 1) - version <= 2.
    assert [k - 1 - generating_version(k, 2) for k in range(1, 7)] == [0, 1, 2, 2, 2, 2]
    # Before step 3 (engine at version 2), s = 1 may start batch 4; the sync to version 3 waits
    # for batch 4, the last one version 2 generates.
    assert startable_through(3, 1) == 4 and sync_waits_for(3, 1) == 4
    assert generating_version(sync_waits_for(3, 1), 1) == 2
    assert generating_version(sync_waits_for(3, 1) + 1, 1) == 3
    # s = 0 is the synchronous loop: batch k from version k - 1, the sync waits for nothing new.
    assert [generating_version(k, 0) for k in (1, 2, 3)] == [0, 1, 2]
    assert sync_waits_for(3, 0) == 3


class FakeCollector:
    """sample_batch records the engine version it sampled with; draws move a data position."""

    def __init__(self, engine, fail_at=None):
        self.engine, self.fail_at, self.draws, self.calls = engine, fail_at, 0, []
        self.prompts = SimpleNamespace(state=lambda: SamplerState(draws=self.draws))

    def sample_batch(self, step, times, dynamic):
        self.calls.append((step, self.engine.version, threading.current_thread().name, dynamic))
        assert not self.engine.syncing, "generated during a weight sync"
        if step == self.fail_at:
            raise EngineDied("killed by SIGKILL", "generate")
        self.draws += 1
        times["generate"] = times.get("generate", 0.0) + 0.5
        batch = SimpleNamespace(prompt_ids=((1,), (2,)))
        return batch, [], {"reward/mean": float(step)}


def _drive(pipeline, engine, steps, times_out=None):
    """The trainer's side: take, (update), before_sync, sync; returns each step's metrics."""
    rows = []
    for step in range(1, steps + 1):
        times = {}
        _, _, m = pipeline.take(step, times, dynamic=step % 2 == 0)
        m.update(pipeline.before_sync(step, times))
        engine.syncing = True
        engine.version = step
        engine.syncing = False
        rows.append(m)
    return rows


@pytest.mark.parametrize("s", [1, 2])
def test_the_producer_generates_batch_k_with_version_k_minus_1_minus_s(s):
    engine = SimpleNamespace(version=0, syncing=False)
    collector = FakeCollector(engine)
    pipeline = RolloutPipeline(collector, s, last_step=6)
    try:
        rows = _drive(pipeline, engine, 6)
    finally:
        pipeline.close()
    assert [c[0] for c in collector.calls] == [1, 2, 3, 4, 5, 6]  # each batch once, in order
    assert [c[1] for c in collector.calls] == [generating_version(k, s) for k in range(1, 7)]
    assert {c[2] for c in collector.calls} == {"rollouts"}  # the producer thread
    assert [r["async/staleness"] for r in rows] == [min(k - 1, s) for k in range(1, 7)]
    assert [r["reward/mean"] for r in rows] == [1, 2, 3, 4, 5, 6]
    # dynamic sampling as the trainer decided when the batch was started (before step k - s)
    assert [c[3] for c in collector.calls] == [max(1, k - s) % 2 == 0 for k in range(1, 7)]
    assert all(r["time/engine_busy"] >= 0 for r in rows)


def test_synchronous_pipeline_samples_on_the_callers_thread():
    engine = SimpleNamespace(version=0, syncing=False)
    collector = FakeCollector(engine)
    pipeline = RolloutPipeline(collector, 0, last_step=3)
    rows = _drive(pipeline, engine, 3)
    assert [c[:2] for c in collector.calls] == [(1, 0), (2, 1), (3, 2)]
    assert {c[2] for c in collector.calls} == {threading.current_thread().name}
    assert all(not any(k.startswith("async/") for k in r) for r in rows)


def test_a_batch_above_the_bound_is_dropped_counted_and_generated_again():
    # A checkpoint of step 4 saved with s = 2 holds batches 5 (version 2) and 6 (version 3),
    # each 2 updates old when trained. Resumed with s = 2 both are trained; with s = 1 both are
    # dropped and generated again with the engine's current weights.
    def resume(s):
        engine = SimpleNamespace(version=4, syncing=False)
        collector = FakeCollector(engine)
        saved = [
            Rollouts(k, v, SimpleNamespace(prompt_ids=((1,), (2,), (3,))), [], {"reward/mean": -k})
            for k, v in ((5, 2), (6, 3))
        ]
        pipeline = RolloutPipeline(collector, s, last_step=7, pending=saved)
        try:
            rows = []
            for step in (5, 6, 7):
                _, _, m = pipeline.take(step, {}, dynamic=False)
                m.update(pipeline.before_sync(step, {}))
                engine.version = step
                rows.append(m)
        finally:
            pipeline.close()
        summary = [
            (r["async/dropped_groups"], r["async/staleness"], r["reward/mean"]) for r in rows
        ]
        return summary, [c[:2] for c in collector.calls]

    assert resume(2) == ([(0, 2, -5), (0, 2, -6), (0, 2, 7)], [(7, 4)])
    # s = 1: batch 5 again from version 4; before step 6, batch 7 starts (version 5), then
    # batch 6 again (version 5).
    assert resume(1) == ([(3, 0, 5), (3, 0, 6), (0, 1, 7)], [(5, 4), (7, 5), (6, 5)])


def test_an_engine_death_in_the_producer_reaches_the_trainer_with_the_data_position():
    engine = SimpleNamespace(version=0, syncing=False)
    collector = FakeCollector(engine, fail_at=3)
    pipeline = RolloutPipeline(collector, 1, last_step=6)
    try:
        pipeline.take(1, {}, dynamic=False)
        pipeline.before_sync(1, {})
        engine.version = 1
        pipeline.take(2, {}, dynamic=False)  # starts batch 3, which dies
        with pytest.raises(EngineDied):
            pipeline.before_sync(2, {})
    finally:
        pipeline.close()
    assert pipeline.position() == SamplerState(draws=2)  # batches 1 and 2 drew, 3 did not
    assert pipeline.pending() == []


def test_bad_settings_are_refused_with_the_fix(tiny_model_path, tmp_path):
    with pytest.raises(ConfigError, match="max_staleness: -1; must be >= 0"):
        TrainConfig.from_flat({"model": "m", "env": "e", "max_staleness": -1})
    with pytest.raises(ConfigError, match="vllm_sleep_mode"):
        TrainConfig.from_flat({"model": "m", "env": "e", "async_generation": True,
                               "vllm_sleep_mode": True})  # fmt: skip
    # The default hf engine shares the trainer's module: the update would change it mid-sample.
    config = make_config(tiny_model_path, tmp_path, async_generation=True)
    with pytest.raises(ConfigError, match="use --engine vllm"):
        Trainer(config, env=DigitEnv())


def _own_copy(model_path):
    """An hf engine with its own weights (what async needs), synced after every step."""
    return make_engine("hf", str(model_path), dtype="float32", device="cpu")


def _run(config, engine):
    trainer = Trainer(config, env=DigitEnv(), engine=engine)  # engine None: built from config
    try:
        return trainer, trainer.train()
    finally:
        trainer.close()


def test_async_trains_within_the_bound_and_resumes_exactly(tiny_model_path, tmp_path):
    full_dir, cut_dir = tmp_path / "full", tmp_path / "cut"
    options = {"async_generation": True, "max_staleness": 1, "max_steps": 4, "eval_size": 0}
    trainer, _ = _run(make_config(tiny_model_path, full_dir, **options), _own_copy(tiny_model_path))
    full_state = trainer.setup.model.state_dict()
    rows = [r for r in read_metrics(full_dir) if "async/staleness" in r]
    assert [r["async/staleness"] for r in rows] == [0, 1, 1, 1]
    assert [r["async/policy_version"] for r in rows] == [0, 0, 1, 2]
    assert all(r["sync/bytes"] > 0 and r["time/engine_idle"] >= 0 for r in rows)

    cut = Trainer(make_config(tiny_model_path, cut_dir, **options), DigitEnv(),
                  _own_copy(tiny_model_path))  # fmt: skip
    _stop_after(cut, 2)
    previous = signal.getsignal(signal.SIGTERM)
    result = cut.train()
    cut.close()
    assert result.interrupted and result.steps == 2
    assert signal.getsignal(signal.SIGTERM) is previous
    saved = read_rollouts(latest_checkpoint(cut_dir))
    assert [(r.step, r.version) for r in saved] == [(3, 1)]  # generated while step 2 trained

    resumed, result = _run(  # the engine starts from the checkpoint's weights, as vLLM's does
        make_config(tiny_model_path, cut_dir, **options, resume="latest"),
        _own_copy(latest_checkpoint(cut_dir) / "model"),
    )
    assert resumed.setup.start_step == 2 and result.steps == 4
    assert _deterministic(read_metrics(cut_dir)) == _deterministic(read_metrics(full_dir))
    assert all(torch.equal(resumed.setup.model.state_dict()[k], v) for k, v in full_state.items())


def test_max_staleness_0_is_the_synchronous_loop(tiny_model_path, tmp_path):
    off, zero = tmp_path / "off", tmp_path / "zero"
    a, _ = _run(make_config(tiny_model_path, off, eval_size=0), _own_copy(tiny_model_path))
    b, _ = _run(
        make_config(tiny_model_path, zero, eval_size=0, async_generation=True, max_staleness=0),
        _own_copy(tiny_model_path),
    )
    assert _deterministic(read_metrics(off)) == _deterministic(read_metrics(zero))
    assert not any(k.startswith("async/") for r in read_metrics(zero) for k in r)
    assert all(torch.equal(b.setup.model.state_dict()[k], v) for k, v in
               a.setup.model.state_dict().items())  # fmt: skip


@pytest.mark.slow
def test_vllm_async_run_trains_within_the_staleness_bound(tiny_model_path, tmp_path):
    pytest.importorskip("vllm")
    from transformers import AutoModelForCausalLM

    before = AutoModelForCausalLM.from_pretrained(tiny_model_path).state_dict()
    config = make_config(
        tiny_model_path, tmp_path, engine="vllm", max_steps=3, eval_size=4, async_generation=True,
        vllm_dtype="float32",  # the engine's logprobs as the trainer's: a ratio off 1 is the lag
    )  # fmt: skip
    trainer, result = _run(config, None)
    assert result.steps == 3 and result.accuracy_after is not None  # evaluated after the syncs
    changed = [
        k for k, v in trainer.setup.model.state_dict().items() if not torch.equal(v, before[k])
    ]
    assert changed  # it trained
    rows = [r for r in read_metrics(tmp_path) if r["step"] > 0]
    assert [r["async/staleness"] for r in rows] == [0, 1, 1]  # never above max_staleness=1
    assert [r["async/policy_version"] for r in rows] == [0, 0, 1]
    # colocated vLLM: every sync sends the full float32 weights
    n_bytes = sum(v.numel() * v.element_size() for v in before.values())
    assert all(0 < r["sync/bytes"] <= n_bytes for r in rows)
    assert all(r["time/engine_idle"] >= 0 and r["time/wait"] >= 0 for r in rows)
    # the update's importance-sampling correction sees the lag: ratios off 1 once stale
    # Float32 on both sides: in step (staleness 0) the ratios are 1 up to float rounding; once a
    # step stale they spread (the update's importance-sampling correction sees the lag).
    fresh, *stale = rows
    assert fresh["is_ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    assert 1 - 1e-3 < fresh["is_ratio_min"] <= fresh["is_ratio_max"] < 1 + 1e-3
    assert all(r["is_ratio_max"] - r["is_ratio_min"] > 0.1 for r in stale), stale


class DiesAt:
    """An hf engine with its own weights whose ``n``-th generate call dies as a killed one does."""

    def __init__(self, engine, n):
        self.inner, self.n, self.calls = engine, n, 0

    def generate(self, prompts, sampling, on_done=None):
        self.calls += 1
        if self.calls == self.n:
            raise EngineDied("engine core killed by SIGKILL", "generate")
        return self.inner.generate(prompts, sampling, on_done)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_an_engine_dying_in_the_producer_ends_the_run_with_the_last_step_saved(
    tiny_model_path, tmp_path
):
    # Batch 3 (generated while step 2 trains) dies: step 2 is complete and saved, with the data
    # position before batch 3's prompts; the run ends with the engine's error, nothing hangs.
    config = make_config(
        tiny_model_path, tmp_path, async_generation=True, max_steps=4, eval_size=0,
        dynamic_sampling="off",
    )  # fmt: skip
    trainer = Trainer(config, env=DigitEnv(), engine=DiesAt(_own_copy(tiny_model_path), 3))
    try:
        with pytest.raises(EngineDied, match="SIGKILL"):
            trainer.train()
    finally:
        trainer.close()
    assert not any(t.name == "rollouts" and t.is_alive() for t in threading.enumerate())
    ckpt = latest_checkpoint(tmp_path)
    assert ckpt.name == "step-000002" and read_rollouts(ckpt) == []
    state = torch.load(ckpt / "trainer_state.pt", weights_only=True)
    assert state["sampler"]["draws"] == 2 * config.rollout.prompts_per_step


@pytest.mark.parametrize(
    ("policy_dtype", "vllm_dtype", "cpu_bf16", "engine_dtype"),
    [("float32", "auto", True, "bfloat16"), ("float32", "auto", False, "float32"),
     ("float32", "float32", True, "float32"), ("float32", "bfloat16", False, "bfloat16"),
     ("bfloat16", "auto", True, "bfloat16"), ("bfloat16", "float32", True, "float32")],
)  # fmt: skip
def test_the_cpu_vllm_engine_takes_vllm_dtype_else_bf16_where_native_else_the_policys(
    monkeypatch, policy_dtype, vllm_dtype, cpu_bf16, engine_dtype
):
    import grpo_train.rollout as rollout
    from grpo_train.config import TrainConfig
    from grpo_train.setup.engines import build_engine

    built: dict = {}
    monkeypatch.setattr(rollout, "make_engine", lambda name, path, **kw: built.update(kw))
    monkeypatch.setattr(rollout, "cuda_available", lambda: False)
    monkeypatch.setattr(rollout, "cpu_has_native_bf16", lambda: cpu_bf16)
    config = TrainConfig.from_flat(
        {"engine": "vllm", "dtype": policy_dtype, "vllm_dtype": vllm_dtype}
    )
    build_engine(config, "model-path", None, None)  # type: ignore[arg-type]
    assert built["dtype"] == engine_dtype
