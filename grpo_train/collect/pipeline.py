"""Asynchronous rollouts with a staleness bound: generate step k+1 while step k trains.

With ``async_generation`` and ``max_staleness: s`` (s >= 1) a producer thread generates and
scores future steps' batches while the trainer updates, one batch at a time, in a fixed order,
so that a run is reproducible and its resume exact. Versions count updates: version v is the
policy after v updates, version 0 the initial one. The schedule (pure functions below):

- batch k (trained at step k) is generated with version ``generating_version(k, s)`` =
  max(0, k - 1 - s);
- before step t trains, the engine holds version t - 1 and the producer may start every batch
  through ``startable_through(t, s)`` = t + s;
- before the engine loads version v, the trainer waits for batch ``sync_waits_for(v, s)`` = v + s,
  the last one version v - 1 generates (the engine holds one version at a time);
- a batch's ``staleness`` at step t is (t - 1) - its version: the updates between the weights
  that sampled it and the weights the update starts from. The schedule keeps it at min(t-1, s);
  a batch above the bound (resumed with a smaller ``max_staleness``) is dropped, counted in
  ``async/dropped_groups``, and generated again with the current weights.

So with s = 1: gen(t+1) overlaps train(t), then sync(t). The update's importance-sampling
correction already uses each completion's behaviour logprobs (the engine's, recorded at
sampling), which is what off-policy samples need (as in asynchronous RLHF, arXiv:2410.18252).

Between steps nothing is in flight (the sync waited for the producer), so evaluation, the weight
sync and checkpoints use the engine alone, and a checkpoint saves the finished future batches
(``pending``) with the data position after them: a resumed run trains exactly what the
uninterrupted one would. Collectives stay on the main thread: async refuses a launched
(multi-process) run, whose ``sample_batch`` sums and gathers over ranks.

With s = 0 (or async off) ``take`` calls ``Collector.sample_batch`` on the trainer's thread, the
synchronous loop unchanged.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from grpo_train.collect.batch import RolloutBatch
from grpo_train.collect.collector import Collector
from grpo_train.collect.groups import Group
from grpo_train.rollout.base import in_callers_torch_context
from grpo_train.run.checkpoint import SamplerState
from grpo_train.run.run_log import logger

#: How long closing waits for a batch still generating (a dead engine raises well before).
JOIN_TIMEOUT_S = 120.0


def generating_version(batch: int, max_staleness: int) -> int:
    """Return the policy version that generates batch ``batch`` (its step): max(0, k - 1 - s).

    >>> [generating_version(k, 1) for k in range(1, 6)]
    [0, 0, 1, 2, 3]
    >>> [generating_version(k, 0) for k in range(1, 4)], generating_version(3, 2)
    ([0, 1, 2], 0)
    """
    return max(0, batch - 1 - max_staleness)


def startable_through(step: int, max_staleness: int) -> int:
    """Return the last batch the producer may start while the engine holds version ``step - 1``.

    Before step t trains, every batch k with ``generating_version(k, s) <= t - 1``: k <= t + s.

    >>> startable_through(1, 1), startable_through(4, 2), startable_through(3, 0)
    (2, 6, 3)
    """
    return step + max_staleness


def sync_waits_for(version: int, max_staleness: int) -> int:
    """Return the batch the trainer waits for before the engine loads ``version``: v + s.

    It is the last batch that version v - 1 generates (``generating_version(v + s, s) = v - 1``).

    >>> sync_waits_for(1, 1), sync_waits_for(3, 2), sync_waits_for(5, 0)
    (2, 5, 5)
    """
    return version + max_staleness


def staleness(step: int, version: int) -> int:
    """Count the updates between a batch's weights (``version``) and step ``step``'s start.

    >>> staleness(5, 3), staleness(1, 0)
    (1, 0)
    >>> [staleness(k, generating_version(k, 2)) for k in (1, 2, 3, 4, 9)]
    [0, 1, 2, 2, 2]
    """
    return step - 1 - version


def too_stale(step: int, version: int, max_staleness: int) -> bool:
    """Whether a batch of ``version`` is above the bound at ``step`` (it is then dropped).

    >>> too_stale(5, 3, 1), too_stale(5, 2, 1), too_stale(5, 4, 0), too_stale(5, 3, 0)
    (False, True, False, True)
    """
    return staleness(step, version) > max_staleness


def engine_idle(metrics: Mapping[str, float]) -> dict[str, float]:
    """``time/engine_idle``: the step's wall time (``time/step``) the producer did not work.

    Nothing is in flight between steps, so the producer's busy seconds of the step
    (``time/engine_busy``) all fall inside it. None without a producer.

    >>> engine_idle({"time/step": 5.0, "time/engine_busy": 3.5}), engine_idle({"time/step": 1.0})
    ({'time/engine_idle': 1.5}, {})
    """
    if "time/engine_busy" not in metrics:
        return {}
    return {"time/engine_idle": max(0.0, metrics["time/step"] - metrics["time/engine_busy"])}


@dataclass(frozen=True)
class Rollouts:
    """One step's generated, scored batch (``Collector.sample_batch``'s result) and its origin."""

    step: int
    """The step it was drawn for."""
    version: int
    """The policy version (updates applied) of the weights that generated every sample in it."""
    batch: RolloutBatch
    sampled: list[Group]
    metrics: dict[str, float]
    times: dict[str, float] = field(default_factory=dict)
    """Seconds the producer spent generating and scoring it, by phase."""


@dataclass
class _Job:
    """A batch the producer was asked for; ``done`` is set once it finished or failed."""

    step: int
    version: int
    dynamic: bool
    done: threading.Event = field(default_factory=threading.Event)
    result: Rollouts | None = None
    error: BaseException | None = None
    before: SamplerState | None = None
    """The data position before the producer drew its prompts (set when it started)."""
    busy_s: float = 0.0


class RolloutPipeline:
    """Serves each step's rollouts: at once (s = 0) or from a producer thread up to s ahead.

    ``pending``: finished batches a checkpoint saved (``Rollouts`` of the steps after it).
    ``last_step``: the run's last step; no batch beyond it is generated.
    """

    def __init__(
        self,
        collector: Collector,
        max_staleness: int,
        last_step: int,
        pending: Sequence[Rollouts] = (),
    ) -> None:
        self.collector, self.max_staleness, self.last_step = collector, max_staleness, last_step
        self._jobs: dict[int, _Job] = {}
        for rollouts in pending:
            job = _Job(rollouts.step, rollouts.version, False, result=rollouts)
            job.done.set()
            self._jobs[rollouts.step] = job
        self._next = max(self._jobs, default=0) + 1  # the next batch to submit, once started
        self._queue: queue.Queue[_Job | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._failed: _Job | None = None
        self._busy = 0.0
        self._busy_lock = threading.Lock()
        self._closing = False

    @property
    def is_async(self) -> bool:
        """Whether batches come from the producer thread."""
        return self.max_staleness > 0

    def take(
        self, step: int, times: dict[str, float], dynamic: bool
    ) -> tuple[RolloutBatch, list[Group], dict[str, float]]:
        """Return step ``step``'s batch, every group sampled, and its metrics.

        Async: first let the producer start every batch the engine's version may generate
        (through ``startable_through``), then wait for this step's (``times["wait"]``). A batch
        above the staleness bound is dropped and generated again with the current weights.
        ``dynamic``: whether the batches started now use dynamic sampling.
        """
        if step not in self._jobs and not self.is_async:
            return self.collector.sample_batch(step, times, dynamic)
        version = step - 1  # what the engine holds now: every batch started now is sampled by it
        if self.is_async:
            self._next = max(self._next, step)
            last = min(startable_through(step, self.max_staleness), self.last_step)
            for k in range(self._next, last + 1):
                self._submit(k, version, dynamic)
        rollouts = self._wait(step, times)
        dropped = 0
        while too_stale(step, rollouts.version, self.max_staleness):
            dropped += len(rollouts.batch.prompt_ids)
            logger.warning(
                "step %d: its rollouts are %d updates old, above max_staleness=%d: dropped, "
                "generating them again with the current weights",
                step,
                staleness(step, rollouts.version),
                self.max_staleness,
            )
            self._jobs.pop(step, None)
            if self.is_async:
                self._submit(step, version, dynamic, force=True)
                rollouts = self._wait(step, times)
            else:
                batch, sampled, m = self.collector.sample_batch(step, times, dynamic)
                rollouts = Rollouts(step, version, batch, sampled, m)
        self._jobs.pop(step, None)
        m = rollouts.metrics
        if self.is_async or dropped:
            m["async/staleness"] = float(staleness(step, rollouts.version))
            m["async/policy_version"] = float(rollouts.version)
            m["async/dropped_groups"] = float(dropped)
            m.update({f"time/producer_{k}": v for k, v in rollouts.times.items()})
        return rollouts.batch, rollouts.sampled, m

    def before_sync(self, version: int, times: dict[str, float]) -> dict[str, float]:
        """Wait for the last batch the engine's weights generate, before it loads ``version``.

        Returns the step's producer metrics: ``time/engine_busy``, the producer's generation
        and scoring seconds during the step (nothing is in flight once this returns).
        """
        if not self.is_async:
            return {}
        last = min(sync_waits_for(version, self.max_staleness), self.last_step)
        for k in sorted(k for k in self._jobs if k <= last):
            self._wait(k, times)
        with self._busy_lock:
            busy, self._busy = self._busy, 0.0
        return {"time/engine_busy": busy}

    def pending(self) -> list[Rollouts]:
        """Return the finished batches not trained yet, in step order (what a checkpoint saves)."""
        return [
            j.result
            for k, j in sorted(self._jobs.items())
            if j.done.is_set() and j.result is not None
        ]

    def position(self) -> SamplerState | None:
        """Return the data position to save after a batch failed: before it drew its prompts."""
        return self._failed.before if self._failed is not None else None

    def close(self) -> None:
        """Stop the producer: queued batches are skipped, the running one is waited for."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._closing = True  # what is still queued is skipped
        self._queue.put(None)
        thread.join(JOIN_TIMEOUT_S)
        if thread.is_alive():  # a daemon: it cannot keep the process alive
            logger.warning("the rollout producer did not finish within %gs", JOIN_TIMEOUT_S)

    # ------------------------------------------------------------------------------ producer

    def _submit(self, step: int, version: int, dynamic: bool, force: bool = False) -> None:
        """Queue batch ``step`` for the producer (started on first use)."""
        if step in self._jobs and not force:
            return
        job = _Job(step, version, dynamic)
        self._jobs[step] = job
        self._next = max(self._next, step + 1)
        if self._thread is None:
            # The producer generates on this rank's GPU, not on the new thread's device 0.
            produce = in_callers_torch_context(self._produce)
            self._thread = threading.Thread(target=produce, name="rollouts", daemon=True)
            self._thread.start()
        self._queue.put(job)

    def _wait(self, step: int, times: dict[str, float]) -> Rollouts:
        """Block until batch ``step`` is done; its result, or its error raised here."""
        job = self._jobs[step]
        t = time.perf_counter()
        job.done.wait()
        times["wait"] = times.get("wait", 0.0) + time.perf_counter() - t
        if job.error is not None:
            raise job.error
        assert job.result is not None
        return job.result

    def _produce(self) -> None:
        """Generate and score the queued batches, one at a time, in order (the producer thread)."""
        while (job := self._queue.get()) is not None:
            if self._failed is not None or self._closing:  # after a failure nothing is drawn
                failed = self._failed
                job.error = failed.error if failed else RuntimeError("rollout producer closed")
                job.done.set()
                continue
            t = time.perf_counter()
            try:
                job.before = self.collector.prompts.state()
                times = defaultdict[str, float](float)
                batch, sampled, m = self.collector.sample_batch(job.step, times, job.dynamic)
                job.result = Rollouts(job.step, job.version, batch, sampled, m, dict(times))
            except BaseException as err:  # handed to the trainer's thread, raised there
                job.error = err
                self._failed = job
            job.busy_s = time.perf_counter() - t
            with self._busy_lock:
                self._busy += job.busy_s
            job.done.set()
