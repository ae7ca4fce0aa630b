"""What ``make()`` puts around every environment (as Gymnasium's ``make`` adds its wrappers).

- ``TimeLimit``: scores each item in a killable worker process of ``grpo_envs.executor`` with a
  wall-clock bound (``score_timeout_s``), for environments whose reward functions cannot bound
  their own time. Environments that can (sandboxed code, the math verifier's pool, regexes over
  capped text: ``Environment.scoring_is_bounded``) are not wrapped and score in-process.
- ``ScoreGuard``: the single guard of grpo-kit. Whatever the environment does (raise, return
  None, NaN, the wrong number of scores), a caller gets one finite, typed ``Score`` per
  completion; failures are ``Outcome.ERROR`` scores with the reason in ``details["reason"]``.
  (Not Gymnasium's ``PassiveEnvChecker``, which only warns about API misuse: this one replaces
  what a broken scorer returns.) ``guarded_scores`` / ``guarded_score`` are the same guard as
  functions: the trainer, the evaluation and the adapters call them on any environment, and an
  environment ``make`` built is asked directly (it carries the guard), so the guard runs once.

This module imports nothing from the registry (``registration`` imports it): the worker process
rebuilds an environment from its pickled ``EnvSpec`` alone.
"""

from __future__ import annotations

import atexit
import logging
import math
import pickle
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from grpo_envs import executor
from grpo_envs.base import Environment, SampleLike, _check_aligned
from grpo_envs.types import Outcome, Sample, Score

if TYPE_CHECKING:
    import datasets

log = logging.getLogger(__name__)

#: Characters of an exception message kept in a failure's reason.
REASON_CHARS = 300


# --- the guard --------------------------------------------------------------------------------


def _valid(score: object) -> Score:
    """Return ``score`` if it is a finite, typed ``Score``, else an ``error`` score."""
    if (
        isinstance(score, Score)
        and isinstance(score.outcome, Outcome)
        and isinstance(score.reward, int | float)
        and not isinstance(score.reward, bool)
        and math.isfinite(score.reward)
    ):
        return score
    return Score.failure(Outcome.ERROR, f"malformed score {score!r}"[:REASON_CHARS])


def guarded_score(env: Environment, completion: object, sample: SampleLike) -> Score:
    """``env.score(completion, sample)`` as a finite, typed ``Score``; never raises."""
    if isinstance(env, ScoreGuard):  # make()'s environment: the guard is its own score
        return env.score(completion, sample)  # type: ignore[arg-type]
    try:
        return _valid(env.score(completion, sample))  # type: ignore[arg-type]
    except Exception as exc:
        return Score.failure(
            Outcome.ERROR, f"score raised {type(exc).__name__}: {exc}"[:REASON_CHARS]
        )


def guarded_scores(
    env: Environment,
    completions: Sequence[object],
    samples: Sequence[SampleLike],
    **options: float | int | None,
) -> list[Score]:
    """``env.score_batch`` as one finite, typed ``Score`` per completion; never raises.

    A batch that raises or returns the wrong number of scores is scored again one by one, so that
    one bad item costs that item only. ``options`` (``workers``, ``timeout_s``) pass through.

    Raises:
        ValueError: ``completions`` and ``samples`` differ in length (a caller bug).
    """
    _check_aligned(completions, samples)
    if not completions:
        return []
    if isinstance(env, ScoreGuard):  # make()'s environment: the guard is its own score_batch
        return env.score_batch(list(completions), list(samples), **options)  # type: ignore[arg-type]
    try:
        batch = env.score_batch(list(completions), list(samples), **options)  # type: ignore[arg-type]
        scores = list(batch)
        if len(scores) != len(completions):
            raise RuntimeError(
                f"score_batch returned {len(scores)} scores for {len(completions)} completions"
            )
    except Exception as exc:
        log.warning(
            "%s: score_batch failed (%s: %s); scoring one by one",
            env.env_id or type(env).__name__,
            type(exc).__name__,
            exc,
        )
        return [guarded_score(env, c, s) for c, s in zip(completions, samples)]
    return [_valid(s) for s in scores]


# --- wrappers ---------------------------------------------------------------------------------


class Wrapper(Environment):
    """An environment around another one; attributes it does not define are the inner one's.

    Setting an attribute sets it on the innermost environment, so ``env.score_timeout_s = 5``
    after ``make`` reaches the environment that reads it.
    """

    env: Environment

    def __init__(self, env: Environment) -> None:
        """Wrap ``env``."""
        object.__setattr__(self, "env", env)

    def __getattr__(self, name: str) -> object:
        if name.startswith("__") or name == "env":
            raise AttributeError(name)
        return getattr(self.env, name)

    def __setattr__(self, name: str, value: object) -> None:
        setattr(self.env, name, value)

    # Class attributes of ``Environment`` are found on the wrapper's class before __getattr__
    # runs, so each is forwarded explicitly.
    @property
    def env_id(self) -> str:  # type: ignore[override]
        """The inner environment's id."""
        return self.env.env_id

    @property
    def spec(self) -> object:  # type: ignore[override]
        """The inner environment's spec."""
        return self.env.spec

    @property
    def splits(self) -> tuple[str, ...]:  # type: ignore[override]
        """The inner environment's splits."""
        return self.env.splits

    @property
    def score_timeout_s(self) -> float:  # type: ignore[override]
        """The inner environment's per-item time bound."""
        return self.env.score_timeout_s

    @property
    def score_workers(self) -> int | None:  # type: ignore[override]
        """The inner environment's worker count."""
        return self.env.score_workers

    @property
    def unwrapped(self) -> Environment:
        """The innermost environment."""
        return self.env.unwrapped

    def dataset(self, split: str = "train") -> datasets.Dataset:
        """Return the inner environment's rows."""
        return self.env.dataset(split)

    def score(self, completion: str, sample: Sample | Mapping[str, object]) -> Score:
        """Return the inner environment's score."""
        return self.env.score(completion, sample)

    def score_batch(
        self,
        completions: Sequence[str],
        samples: Sequence[SampleLike],
        *,
        workers: int | None = None,
        timeout_s: float | None = None,
    ) -> list[Score]:
        """Return the inner environment's scores."""
        return self.env.score_batch(completions, samples, workers=workers, timeout_s=timeout_s)

    def reference_completion(self, sample: Sample) -> str | None:
        """Return the inner environment's reference completion."""
        return self.env.reference_completion(sample)

    def scoring_is_bounded(self) -> bool:
        """Whether the inner environment bounds its own scoring time."""
        return self.env.scoring_is_bounded()

    def __repr__(self) -> str:
        return f"<{type(self).__name__}{self.env!r}>"


class ScoreGuard(Wrapper):
    """Guarantees one finite, typed ``Score`` per completion and never raises (see the module)."""

    def score(self, completion: str, sample: Sample | Mapping[str, object]) -> Score:
        """``guarded_score`` of the inner environment."""
        return guarded_score(self.env, completion, sample)

    def score_batch(
        self,
        completions: Sequence[str],
        samples: Sequence[SampleLike],
        *,
        workers: int | None = None,
        timeout_s: float | None = None,
    ) -> list[Score]:
        """``guarded_scores`` of the inner environment."""
        return guarded_scores(self.env, completions, samples, workers=workers, timeout_s=timeout_s)


_POOL: executor.WorkerPool | None = None
_POOL_LOCK = threading.Lock()


def _scoring_pool() -> executor.WorkerPool:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None or _POOL.pid != executor.os.getpid():
            _POOL = executor.WorkerPool("grpo_envs.wrappers:serve_scoring", executor.usable_cpus())
        return _POOL


def shutdown_scoring_pool() -> None:
    """Kill the ``TimeLimit`` workers of this process (also run at interpreter exit)."""
    global _POOL
    with _POOL_LOCK:
        pool, _POOL = _POOL, None
    if pool is not None and pool.pid == executor.os.getpid():
        pool.close()


atexit.register(shutdown_scoring_pool)


class TimeLimit(Wrapper):
    """Scores each item in a killable worker process, within ``score_timeout_s`` seconds.

    A worker that runs past the bound is killed and replaced, and the item scores
    ``Outcome.TIMEOUT``; one that dies scores ``Outcome.ERROR``. A hung scorer thus costs one item,
    not the training run. The worker rebuilds the environment from its pickled ``EnvSpec`` (once,
    then cached); when that is impossible (an environment defined in ``__main__`` or in a
    function), scoring falls back to this process, without a time bound, and says so once.
    """

    def __init__(self, env: Environment) -> None:
        """Wrap ``env`` (built by ``make``: it has a ``spec``)."""
        super().__init__(env)
        object.__setattr__(self, "_spec_bytes", _spec_bytes(env))

    def score(self, completion: str, sample: Sample | Mapping[str, object]) -> Score:
        """Score one completion (see ``score_batch``)."""
        return self.score_batch([completion], [sample])[0]

    def score_batch(
        self,
        completions: Sequence[str],
        samples: Sequence[SampleLike],
        *,
        workers: int | None = None,
        timeout_s: float | None = None,
    ) -> list[Score]:
        """Score many completions, each in a worker within ``timeout_s`` seconds.

        ``timeout_s`` defaults to ``score_timeout_s``; ``workers`` (default ``score_workers``) 0
        scores in-process.
        """
        _check_aligned(completions, samples)
        spec_bytes: bytes | None = self.__dict__["_spec_bytes"]
        wanted = self.env.score_workers if workers is None else workers
        if spec_bytes is None or wanted == 0 or not completions:
            return self.env.score_batch(completions, samples)
        limit = self.env.score_timeout_s if timeout_s is None else timeout_s
        pool = _scoring_pool()
        if wanted is not None:
            pool.grow(wanted)
        rows = [s if isinstance(s, Sample) else dict(s) for s in samples]
        replies = pool.map([(spec_bytes, c, r) for c, r in zip(completions, rows)], limit)
        scores: list[Score] = []
        for reply in replies:
            if reply.status is executor.ReplyStatus.TIMEOUT:
                scores.append(
                    Score.failure(Outcome.TIMEOUT, f"scoring took longer than {limit:g} s")
                )
            elif reply.status is executor.ReplyStatus.ERROR:
                scores.append(Score.failure(Outcome.ERROR, f"scoring failed: {reply.detail}"))
            elif isinstance(reply.value, _Unbuildable):
                log.warning(
                    "%s cannot be rebuilt in a worker process (%s); scoring in this process "
                    "without a time bound",
                    self.env.env_id,
                    reply.value.reason,
                )
                object.__setattr__(self, "_spec_bytes", None)
                return self.env.score_batch(completions, samples)
            else:
                scores.append(reply.value)  # type: ignore[arg-type]
        return scores


def _spec_bytes(env: Environment) -> bytes | None:
    """Return the pickled spec that rebuilds ``env`` in a worker, or None when it cannot travel."""
    if env.spec is None:
        return None
    try:
        return pickle.dumps(env.spec)
    except Exception:  # a lambda entry point, an unpicklable default: score in-process
        return None


class _Unbuildable:
    """The worker's answer when it cannot rebuild the environment (not a scoring failure)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


def serve_scoring() -> Callable[[object], object]:
    """Return the ``TimeLimit`` workers' handler: rebuild environments from specs, score."""
    envs: dict[bytes, Environment] = {}

    def handle(request: object) -> object:
        spec_bytes: bytes
        completion: str
        sample: Sample
        spec_bytes, completion, sample = request  # type: ignore[misc]
        env = envs.get(spec_bytes)
        if env is None:
            try:
                spec = pickle.loads(spec_bytes)
                env = spec.load()(**spec.defaults)
                env.env_id, env.spec = spec.id, spec
            except Exception as exc:
                return _Unbuildable(f"{type(exc).__name__}: {exc}"[:REASON_CHARS])
            envs[spec_bytes] = env
        return env.score(completion, sample)

    return handle


def wrap(env: Environment) -> Environment:
    """Apply the wrappers of ``make``: ``ScoreGuard(TimeLimit(env))``.

    Without ``TimeLimit`` when ``env`` bounds its own scoring time or scores in-process
    (``score_workers == 0``).
    """
    inner = env
    if not env.scoring_is_bounded() and env.score_workers != 0:
        inner = TimeLimit(env)
    return ScoreGuard(inner)
