"""``check_env``: the contract every environment must pass (Gymnasium's ``check_env`` idea).

Checks, per split: the split exists and is a ``datasets.Dataset`` with the ``Sample`` columns and
types; ids are unique; prompts are chat messages; rows convert to ``Sample``. Then, on a few rows:
scores are valid ``Score`` objects with a finite reward; ``score_batch`` agrees with ``score``; a
reference completion (when the env offers one) succeeds; garbage completions (empty, 1 MB of junk,
odd unicode, non-text) give a typed failure instead of raising. Finally, determinism: a second
environment built from the same spec has the same rows (ids stable) and gives the same scores.
Environments that run episodes are also played (``grpo_envs.episode_check``): garbage turns,
an episode that never ends is cut, same turns -> same observations and score.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import datasets

from grpo_envs.base import Environment
from grpo_envs.types import Outcome, Sample, Score

REQUIRED_COLUMNS = ("id", "prompt", "answer", "env_id", "metadata")
ROLES = frozenset({"system", "user", "assistant", "tool"})

#: Completions that must never make a scorer raise.
GARBAGE: tuple[object, ...] = (
    "",
    "   \n\t ",
    "x" * 1_000_000,
    "\\boxed{" * 1000 + "<answer>" * 1000 + "{" * 1000,
    "ñ 数学 🧮 \u200b \x00 \ud800".encode("utf-8", "replace").decode("utf-8"),
    "</answer><answer>",
    None,
    123,
    [{"role": "assistant"}],
)


class EnvCheckError(AssertionError):
    """An environment broke the contract; the message says which check and where."""


@dataclass(frozen=True)
class CheckReport:
    """What ``check_env`` checked on an environment that passed."""

    env_id: str
    split_rows: tuple[tuple[str, int], ...]
    """Each checked split and its number of rows."""
    scored_rows: int
    """Rows per split whose scoring was checked."""
    references: int
    """Reference completions (known-correct answers or solutions) that scored as successes."""
    garbage: int
    """Hostile completions that scored as failures, quickly."""
    determinism: bool
    """Whether a second build from the spec gave the same data and scores."""
    episodes: bool
    """Whether the multi-turn episode contract was checked."""

    def describe(self) -> str:
        """Say in a few lines what passed.

        >>> report = CheckReport("x/y-v0", (("train", 10), ("test", 5)), 4, 8, 6, True, False)
        >>> print(report.describe())
        x/y-v0: passed
          splits: train (10 rows), test (5 rows); scoring checked on 4 rows of each
          references: 8 reference completions scored as successes
          garbage: 6 hostile completions per split scored as failures, in time
          score_batch: agrees with score
          determinism: a second build from the spec gave the same rows and scores
        """
        splits = ", ".join(f"{name} ({rows} rows)" for name, rows in self.split_rows)
        refs = (
            f"{self.references} reference completions scored as successes"
            if self.references
            else "no reference completions (the environment offers none)"
        )
        lines = [
            f"{self.env_id}: passed",
            f"  splits: {splits}; scoring checked on {self.scored_rows} rows of each",
            f"  references: {refs}",
            f"  garbage: {self.garbage} hostile completions per split scored as failures, in time",
            "  score_batch: agrees with score",
        ]
        if self.determinism:
            lines.append(
                "  determinism: a second build from the spec gave the same rows and scores"
            )
        if self.episodes:
            lines.append("  episodes: the multi-turn contract holds on the checked rows")
        return "\n".join(lines)


def _fail(env: Environment, message: str) -> EnvCheckError:
    return EnvCheckError(f"{env.env_id or type(env).__name__}: {message}")


def _check_score(env: Environment, score: object, what: str) -> Score:
    if not isinstance(score, Score):
        raise _fail(env, f"{what}: expected a Score, got {type(score).__name__}")
    if not isinstance(score.outcome, Outcome):
        raise _fail(env, f"{what}: outcome {score.outcome!r} is not an Outcome")
    if not isinstance(score.reward, int | float) or not math.isfinite(score.reward):
        raise _fail(env, f"{what}: reward {score.reward!r} is not a finite number")
    weighted = math.fsum(c.weighted for c in score.components)
    if score.components and not math.isclose(weighted, score.reward, abs_tol=1e-6):
        raise _fail(env, f"{what}: reward {score.reward} != weighted sum of components {weighted}")
    try:
        json.dumps(score.to_json())
    except (TypeError, ValueError) as exc:
        raise _fail(env, f"{what}: score is not JSON-serialisable ({exc})") from exc
    return score


def _check_split(env: Environment, split: str) -> datasets.Dataset:
    ds = env.dataset(split)
    if not isinstance(ds, datasets.Dataset):
        raise _fail(env, f"dataset({split!r}) returned {type(ds).__name__}, not datasets.Dataset")
    missing = [c for c in REQUIRED_COLUMNS if c not in ds.column_names]
    if missing:
        raise _fail(env, f"split {split!r} lacks columns {missing}")
    if len(ds) == 0:
        raise _fail(env, f"split {split!r} is empty")
    ids = ds["id"]
    if len(set(ids)) != len(ids):
        dupes = sorted({i for i in ids if ids.count(i) > 1})[:5] if len(ids) < 5000 else "..."
        raise _fail(env, f"split {split!r} has duplicate ids, e.g. {dupes}")
    for column in ("id", "answer", "env_id", "metadata"):
        kinds = {type(v).__name__ for v in ds[column][:256]}
        if kinds != {"str"}:
            raise _fail(env, f"split {split!r} column {column!r} must hold str, got {kinds}")
    for row in ds.select(range(min(len(ds), 64))):
        prompt = row["prompt"]
        if not isinstance(prompt, list) or not prompt:
            raise _fail(env, f"row {row['id']}: prompt must be a non-empty list of chat messages")
        for message in prompt:
            if set(message) != {"role", "content"} or message["role"] not in ROLES:
                raise _fail(env, f"row {row['id']}: bad chat message {message!r}")
            if not isinstance(message["content"], str):
                raise _fail(env, f"row {row['id']}: message content must be a string")
        if not isinstance(json.loads(row["metadata"]), dict):
            raise _fail(env, f"row {row['id']}: metadata must be a JSON object")
        if env.env_id and row["env_id"] != env.env_id:
            raise _fail(env, f"row {row['id']}: env_id {row['env_id']!r} != {env.env_id!r}")
        Sample.from_row(row)
    return ds


def _fingerprint(ds: datasets.Dataset, n: int) -> list[tuple[str, str, str]]:
    rows = ds.select(range(min(n, len(ds))))
    return [(r["id"], json.dumps(r["prompt"]), r["answer"]) for r in rows]


def check_env(
    env: Environment,
    *,
    n_samples: int = 4,
    splits: Sequence[str] | None = None,
    check_determinism: bool = True,
    max_score_s: float = 10.0,
) -> CheckReport:
    """Run ``env`` through the contract; raise ``EnvCheckError`` naming the first broken rule.

    Returns what was checked (``CheckReport.describe()`` says it in words).

    Args:
        env: the environment (built by ``make`` to also check determinism against its spec).
        n_samples: rows per split that are scored.
        splits: the splits to check (default: all of ``env.splits``).
        check_determinism: rebuild the env from ``env.spec`` and compare data and scores.
        max_score_s: the most seconds ``score`` may take on one garbage completion.
    """
    if not env.splits or not all(isinstance(s, str) for s in env.splits):
        raise _fail(env, f"splits must be a non-empty tuple of names, got {env.splits!r}")
    from grpo_envs.episode import Episodic

    split_rows, references, scored = [], 0, 0
    for split in splits if splits is not None else env.splits:
        ds = _check_split(env, split)
        rows = [Sample.from_row(r) for r in ds.select(range(min(n_samples, len(ds))))]
        references += _check_scoring(env, rows, max_score_s)
        if check_determinism and env.spec is not None:
            _check_determinism(env, split, ds, rows)
        _check_episodes(env, rows, check_determinism)
        split_rows.append((split, len(ds)))
        scored = max(scored, len(rows))
    return CheckReport(
        env.env_id or type(env).__name__,
        tuple(split_rows),
        scored,
        references,
        len(GARBAGE),
        check_determinism and env.spec is not None,
        isinstance(env.unwrapped, Episodic),
    )


def _check_episodes(env: Environment, rows: list[Sample], check_determinism: bool) -> None:
    from grpo_envs.episode import Episodic

    if not isinstance(env.unwrapped, Episodic):
        return
    from grpo_envs.episode_check import EpisodeCheckError, check_episodes
    from grpo_envs.registration import make

    twin = make(env.spec) if check_determinism and env.spec is not None else None
    try:
        check_episodes(env, rows, twin)
    except EpisodeCheckError as exc:
        raise EnvCheckError(str(exc)) from exc


def _check_scoring(env: Environment, rows: list[Sample], max_score_s: float) -> int:
    """Check scoring on ``rows``; return how many reference completions scored as successes."""
    completions: list[object] = []
    samples: list[Sample] = []
    single: list[Score] = []
    for row in rows:
        reference = env.reference_completion(row)
        if reference is not None:
            score = _check_score(env, env.score(reference, row), f"reference for {row.id}")
            if not score.correct:
                raise _fail(
                    env,
                    f"reference completion for {row.id} scored {score.outcome}: "
                    f"{dict(score.details)}",
                )
            completions.append(reference)
            samples.append(row)
            single.append(score)
    for garbage in GARBAGE:
        start = time.monotonic()
        try:
            score = env.score(garbage, rows[0])  # type: ignore[arg-type]
        except Exception as exc:
            raise _fail(
                env, f"score raised {type(exc).__name__} on garbage {str(garbage)[:40]!r}: {exc}"
            ) from exc
        elapsed = time.monotonic() - start
        if elapsed > max_score_s:
            raise _fail(
                env,
                f"scoring garbage {str(garbage)[:40]!r} took {elapsed:.1f} s "
                f"(> {max_score_s:g} s): hostile input must stay cheap",
            )
        _check_score(env, score, f"garbage {str(garbage)[:40]!r}")
        if score.correct:
            raise _fail(env, f"garbage completion {str(garbage)[:40]!r} scored as a success")
        completions.append(garbage)
        samples.append(rows[0])
        single.append(score)
    batch = env.score_batch(completions, samples)  # type: ignore[arg-type]
    if len(batch) != len(completions):
        raise _fail(env, f"score_batch returned {len(batch)} scores for {len(completions)} items")
    for i, (a, b) in enumerate(zip(single, batch)):
        _check_score(env, b, f"score_batch item {i}")
        if (a.outcome, a.reward) != (b.outcome, b.reward):
            raise _fail(
                env,
                f"score_batch item {i} gave {b.outcome}/{b.reward}, score gave "
                f"{a.outcome}/{a.reward}",
            )
    return len(completions) - len(GARBAGE)


def _check_determinism(
    env: Environment, split: str, ds: datasets.Dataset, rows: list[Sample]
) -> None:
    from grpo_envs.registration import make

    assert env.spec is not None
    twin = make(env.spec)
    if _fingerprint(twin.dataset(split), 256) != _fingerprint(ds, 256):
        raise _fail(
            env,
            f"split {split!r} differs between two builds from the same spec "
            "(ids or prompts not deterministic)",
        )
    for row in rows:
        reference = env.reference_completion(row)
        for completion in (reference, "\\boxed{0}", "<answer>1</answer>"):
            if completion is None:
                continue
            a, b = env.score(completion, row), twin.score(completion, row)
            if (a.outcome, a.reward) != (b.outcome, b.reward):
                raise _fail(env, f"scores of {row.id} differ between two builds: {a} vs {b}")
