"""The environment interface: a dataset of prompts plus a deterministic scorer.

Owned by the registry/contract work (issue 3); the trainer and evaluation code only rely on the
methods declared on ``Environment``: ``dataset``, ``splits``, ``score``, ``score_batch`` (and the
adapters ``trl_reward_funcs`` / ``verl_compute_score``).

``SingleTurnEnv`` is the convenient base: a subclass lists its samples per split and declares a
``Rubric``; the base builds the ``datasets.Dataset``, normalises completions, and turns every
failure into a typed ``Score``. A new environment is about twenty lines (see
``grpo_envs/envs/arithmetic.py``).
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from multiprocessing.connection import Connection, wait
from typing import TYPE_CHECKING

import datasets

from grpo_envs.rubric import Rubric
from grpo_envs.types import Outcome, Sample, Score

if TYPE_CHECKING:
    from grpo_envs.adapters import TRLRewardFunc
    from grpo_envs.registration import EnvSpec

#: What ``score`` accepts as a completion: text, or chat messages (TRL's conversational format).
CompletionLike = str | Sequence[Mapping[str, object]] | Mapping[str, object] | None


def completion_text(completion: object) -> str | None:
    """Return the text of a completion given as a string, a message dict or a list of message dicts.

    For a list of messages the assistant contents are joined (TRL passes ``[{"role": "assistant",
    "content": ...}]``). Returns None for anything else (None, numbers, malformed messages).
    """
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Mapping):
        content = completion.get("content")
        return content if isinstance(content, str) else None
    if isinstance(completion, Sequence) and not isinstance(completion, bytes | bytearray):
        texts = []
        for message in completion:
            if not isinstance(message, Mapping) or not isinstance(message.get("content"), str):
                return None
            if message.get("role", "assistant") == "assistant":
                texts.append(str(message["content"]))
        return "".join(texts)
    return None


class Environment(ABC):
    """Base class for every environment.

    Subclasses set ``splits`` and implement ``dataset`` and ``score`` (or derive from
    ``SingleTurnEnv``, which implements both). ``env_id`` and ``spec`` are filled in by
    ``grpo_envs.make``.
    """

    env_id: str = ""
    spec: EnvSpec | None = None
    splits: tuple[str, ...] = ("train", "test")
    #: Per-item wall-clock bound in ``score_batch`` (seconds).
    score_timeout_s: float = 30.0
    #: Worker processes for ``score_batch``: None -> min(items, CPUs); 0 -> score in-process
    #: (no time bound beyond the scorer's own; for debugging or scorers that cannot fork).
    score_workers: int | None = None

    @abstractmethod
    def dataset(self, split: str = "train") -> datasets.Dataset:
        """Return the rows of ``split`` (id, prompt, answer, env_id, metadata; see ``Sample``)."""

    @abstractmethod
    def score(self, completion: str, sample: Sample | Mapping[str, object]) -> Score:
        """Score one completion (the model's text only, without the prompt) for ``sample``."""

    def reference_completion(self, sample: Sample) -> str | None:
        """Return a completion that must score as a success for ``sample``, or None.

        ``check_env`` scores it and expects a success; None when the environment has no such answer.
        """
        return None

    def score_batch(
        self,
        completions: Sequence[str],
        samples: Sequence[Sample | Mapping[str, object]],
        *,
        workers: int | None = None,
        timeout_s: float | None = None,
    ) -> list[Score]:
        """Score many completions; results in input order. Never raises for one bad item.

        Items are scored in forked worker processes, each with a wall-clock bound (``timeout_s``,
        default ``score_timeout_s``): a worker that runs past it is killed and the item scores
        ``Outcome.TIMEOUT``; a worker that dies scores ``Outcome.ERROR``. A scorer that hangs thus
        costs one item, not the training run (pain point: serial scoring freezes training).
        """
        if len(completions) != len(samples):
            raise ValueError(
                f"score_batch got {len(completions)} completions for {len(samples)} samples"
            )
        n = len(completions)
        if n == 0:
            return []
        limit = self.score_timeout_s if timeout_s is None else timeout_s
        wanted = self.score_workers if workers is None else workers
        if wanted == 0 or "fork" not in mp.get_all_start_methods():
            return [self._safe_score(c, s) for c, s in zip(completions, samples)]
        count = min(n, wanted if wanted is not None else _usable_cpus())
        return run_bounded(
            lambda i: self._safe_score(completions[i], samples[i]), n, max(1, count), limit
        )

    def _safe_score(self, completion: object, sample: Sample | Mapping[str, object]) -> Score:
        try:
            return self.score(completion, sample)  # type: ignore[arg-type]
        except Exception as exc:
            return Score.failure(Outcome.ERROR, f"score raised {type(exc).__name__}: {exc}")

    # --- adapters (see grpo_envs.adapters) -----------------------------------------------------

    def trl_reward_funcs(self, *, per_component: bool = False) -> list[TRLRewardFunc]:
        """Reward functions with TRL's ``reward_func(completions, **kwargs) -> list[float]``."""
        from grpo_envs.adapters import trl_reward_funcs

        return trl_reward_funcs(self, per_component=per_component)

    def verl_compute_score(
        self,
        data_source: str,
        solution_str: str,
        ground_truth: str,
        extra_info: Mapping[str, object] | None = None,
    ) -> dict[str, float]:
        """Verl's ``compute_score`` signature, scored by this environment."""
        from grpo_envs.adapters import verl_score

        return verl_score(self, solution_str, ground_truth, extra_info)


# --- bounded process pool ---------------------------------------------------------------------


def _usable_cpus() -> int:
    """CPUs this process may run on (the affinity mask, which containers and taskset narrow)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def _worker_loop(conn: Connection, fn: Callable[[int], Score]) -> None:
    while True:
        try:
            index = conn.recv()
        except EOFError:
            return
        if index is None:
            return
        try:
            result = fn(index)
        except Exception as exc:
            result = Score.failure(Outcome.ERROR, f"{type(exc).__name__}: {exc}")
        try:
            conn.send((index, result))
        except Exception as exc:  # an unpicklable detail must not lose the item
            conn.send((index, Score.failure(Outcome.ERROR, f"result not sendable: {exc}")))


class _Worker:
    def __init__(self, fn: Callable[[int], Score]) -> None:
        ctx = mp.get_context("fork")
        self.conn, child = ctx.Pipe()
        # fork: the closure ``fn`` (and the environment it holds) is inherited, not pickled.
        # Not a daemon: daemonic processes may not start children, and a scorer may need to
        # (e.g. a verifier that enforces its own timeout in a subprocess). ``run_bounded``'s
        # ``finally`` reaps every worker instead.
        self.process = ctx.Process(target=_worker_loop, args=(child, fn), daemon=False)
        self.process.start()
        child.close()
        self.index: int | None = None
        self.deadline = float("inf")

    def assign(self, index: int, timeout_s: float) -> None:
        self.index, self.deadline = index, time.monotonic() + timeout_s
        self.conn.send(index)

    def kill(self) -> None:
        self.process.kill()
        self.process.join(timeout=5)
        self.conn.close()


def run_bounded(fn: Callable[[int], Score], n: int, workers: int, timeout_s: float) -> list[Score]:
    """Return ``[fn(0), ..., fn(n-1)]`` from ``workers`` forked processes, each call time-bounded.

    Why not ``concurrent.futures.ProcessPoolExecutor``: it cannot stop one running task, so a hung
    item would hold its worker forever; here the worker is killed and replaced.
    """
    results: list[Score | None] = [None] * n
    pending: deque[int] = deque(range(n))
    pool: list[_Worker] = []

    def start_next(worker: _Worker) -> bool:
        if not pending:
            worker.index = None
            return False
        worker.assign(pending.popleft(), timeout_s)
        return True

    try:
        for _ in range(min(workers, n)):
            worker = _Worker(fn)
            pool.append(worker)
            start_next(worker)
        while any(w.index is not None for w in pool):
            busy = [w for w in pool if w.index is not None]
            now = time.monotonic()
            wait_s = max(0.0, min(w.deadline for w in busy) - now)
            ready = wait([w.conn for w in busy], timeout=wait_s)
            for worker in busy:
                if worker.conn in ready:
                    try:
                        index, score = worker.conn.recv()
                    except (EOFError, OSError):
                        worker.process.join(timeout=1)  # reap it, so that the exit code is known
                        code = worker.process.exitcode
                        results[worker.index] = Score.failure(  # type: ignore[index]
                            Outcome.ERROR, f"scoring process died (exit code {code})"
                        )
                        _replace(pool, worker, fn, bool(pending))
                        continue
                    results[index] = score
                    start_next(worker)
                elif time.monotonic() >= worker.deadline:
                    results[worker.index] = Score.failure(  # type: ignore[index]
                        Outcome.TIMEOUT, f"scoring took longer than {timeout_s:g} s"
                    )
                    _replace(pool, worker, fn, bool(pending))
            for worker in pool:
                if worker.index is None:
                    start_next(worker)
    finally:
        for worker in pool:
            with contextlib.suppress(BrokenPipeError, OSError):
                worker.conn.send(None)
        for worker in pool:
            worker.process.join(timeout=1)
            if worker.process.is_alive():
                worker.kill()
    return [
        r if r is not None else Score.failure(Outcome.ERROR, "item was never scored")
        for r in results
    ]


def _replace(pool: list[_Worker], dead: _Worker, fn: Callable[[int], Score], needed: bool) -> None:
    dead.kill()
    pool.remove(dead)
    if needed:  # no fresh fork when nothing is left to score
        pool.append(_Worker(fn))


# --- the single-turn base ---------------------------------------------------------------------


class SingleTurnEnv(Environment):
    r"""A prompt in, one completion out, scored by a ``Rubric``.

    Subclasses implement ``load_split(split) -> Iterable[Sample]`` (ids unique within the split,
    deterministic for the constructor arguments) and set ``self.rubric`` in ``__init__``. The base
    caches each split as a ``datasets.Dataset`` stamped with ``env_id``. A complete environment::

        class DoubleEnv(SingleTurnEnv):  # "What is 2 * n?"
            def __init__(self, size: int = 100) -> None:
                super().__init__()
                self.size = size
                self.rubric = Rubric(
                    [RewardComponent("correct", 1.0, integer_correctness), boxed_component(0.0)]
                )

            def load_split(self, split: str) -> Iterator[Sample]:
                offset = 0 if split == "train" else 10_000  # disjoint held-out numbers
                for i in range(self.size):
                    n = offset + i
                    prompt = (Message("user", f"What is 2 * {n}? Answer in \\boxed{{}}."),)
                    yield Sample(f"{split}-{i}", prompt, str(2 * n))

        register("demo/double-v0", DoubleEnv)

    (``integer_correctness`` is in ``grpo_envs.envs._common``, ``boxed_component`` in
    ``grpo_envs.format``; ``tests/grpo_envs/test_base.py`` runs this example through
    ``check_env``.)
    """

    rubric: Rubric
    #: Prepended as a system message to every prompt when set.
    system_prompt: str | None = None
    #: ``"processes"``: ``score_batch`` uses the bounded forked workers of ``Environment``.
    #: ``"inline"``: it calls ``rubric.score_many`` in this process, for rubrics whose judges
    #: parallelise and bound their own time (``grpo_envs.math``'s verifier pool): forking would
    #: start a fresh sympy worker pool in every child.
    batch_mode: str = "processes"

    def __init__(self) -> None:
        """Start with no cached splits."""
        self._cache: dict[str, datasets.Dataset] = {}

    @abstractmethod
    def load_split(self, split: str) -> Iterable[Sample]:
        """Return the samples of ``split`` (ids unique within the split, chat-message prompts)."""

    def dataset(self, split: str = "train") -> datasets.Dataset:
        """Return the rows of ``split`` as a ``datasets.Dataset`` (built once, then cached)."""
        if split not in self.splits:
            raise ValueError(
                f"{self.env_id or type(self).__name__} has no split {split!r}; "
                f"splits: {list(self.splits)}"
            )
        if not hasattr(self, "_cache"):  # a subclass that forgot super().__init__()
            self._cache = {}
        if split not in self._cache:
            rows = [self._stamp(s).to_row() for s in self.load_split(split)]
            if not rows:
                raise ValueError(f"{self.env_id or type(self).__name__}: split {split!r} is empty")
            self._cache[split] = datasets.Dataset.from_list(rows)
        return self._cache[split]

    def _stamp(self, sample: Sample) -> Sample:
        from grpo_envs.types import Message

        prompt = sample.prompt
        if self.system_prompt and not (prompt and prompt[0].role == "system"):
            prompt = (Message("system", self.system_prompt), *prompt)
        return Sample(sample.id, prompt, sample.answer, self.env_id, sample.metadata)

    def score_batch(
        self,
        completions: Sequence[str],
        samples: Sequence[Sample | Mapping[str, object]],
        *,
        workers: int | None = None,
        timeout_s: float | None = None,
    ) -> list[Score]:
        """Score many completions; results in input order; never raises for one bad item.

        See ``batch_mode`` for how (``Environment.score_batch`` describes the process mode).
        """
        if self.batch_mode != "inline":
            return super().score_batch(completions, samples, workers=workers, timeout_s=timeout_s)
        if len(completions) != len(samples):
            raise ValueError(
                f"score_batch got {len(completions)} completions for {len(samples)} samples"
            )
        results: list[Score | None] = [None] * len(completions)
        live: list[tuple[int, str, Sample]] = []
        for i, (completion, sample) in enumerate(zip(completions, samples)):
            prepared = self._prepare(completion, sample)
            if isinstance(prepared, Score):
                results[i] = prepared
            else:
                live.append((i, *prepared))
        try:
            scored = self.rubric.score_many([t for _, t, _ in live], [s for _, _, s in live])
        except Exception as exc:
            failure = Score.failure(Outcome.ERROR, f"rubric raised {type(exc).__name__}: {exc}")
            scored = [failure] * len(live)
        for (i, _, _), score in zip(live, scored):
            results[i] = score
        return [r if r is not None else Score.failure(Outcome.ERROR, "not scored") for r in results]

    @staticmethod
    def _prepare(
        completion: object, sample: Sample | Mapping[str, object]
    ) -> tuple[str, Sample] | Score:
        text = completion_text(completion)
        if text is None:
            return Score.failure(
                Outcome.UNPARSABLE, f"completion is not text (got {type(completion).__name__})"
            )
        try:
            return text, Sample.from_row(sample)
        except (ValueError, TypeError, KeyError) as exc:
            return Score.failure(Outcome.ERROR, f"bad sample: {exc}")

    def score(self, completion: CompletionLike, sample: Sample | Mapping[str, object]) -> Score:  # type: ignore[override]
        """Score a completion (text or chat messages) with ``self.rubric``; never raises."""
        prepared = self._prepare(completion, sample)
        if isinstance(prepared, Score):
            return prepared
        try:
            return self.rubric.score(*prepared)
        except Exception as exc:
            return Score.failure(Outcome.ERROR, f"rubric raised {type(exc).__name__}: {exc}")
