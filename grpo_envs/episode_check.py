"""The episode part of ``check_env``: garbage turns, cut episodes, determinism.

Run by ``check_env`` for environments that run episodes (``grpo_envs.episode.Episodic``); a
single-turn environment is already covered by the scoring checks (its one-turn view scores what
``score`` scores).
"""

from __future__ import annotations

from collections.abc import Sequence

from grpo_envs.base import Environment
from grpo_envs.episode import EpisodeEnd, EpisodeResult, Episodic, run_episode, scripted
from grpo_envs.types import Sample

#: Turns that must never make a step function raise or an episode succeed. Text only: the
#: engine always returns text; non-text completions are ``check_env``'s scoring checks' job.
GARBAGE_TURNS: tuple[str, ...] = (
    "",
    "   \n\t ",
    "x" * 200_000,
    "<tool_call>{" * 500 + "```python\n" * 200,
    '<tool_call>{"name": "python", "arguments": {"code": 1}}</tool_call>',
    "ñ 数学 🧮 \u200b \x00",
)


class EpisodeCheckError(AssertionError):
    """An episodic environment broke the episode part of the contract.

    ``check_env`` raises it as its ``EnvCheckError``.
    """


def _fail(env: Environment, message: str) -> EpisodeCheckError:
    return EpisodeCheckError(f"{env.env_id or type(env).__name__}: {message}")


def check_episodes(env: Environment, rows: Sequence[Sample], twin: Environment | None) -> None:
    """Check the episodes of ``env`` on ``rows``; ``twin`` (built from the same spec) or None.

    - every garbage turn, played for a whole episode, ends it (the episode is cut at
      ``max_turns`` at the latest, the end is typed) without raising and without a success;
    - a policy that never gives an answer sees its episode cut at ``max_turns`` (or ended by
      the environment), never run on;
    - the same sample and the same turns give the same observations and score, on ``env``
      twice and on ``twin``.
    """
    episodes = env.unwrapped
    if not isinstance(episodes, Episodic):
        return
    budget = episodes.budget
    if not rows:
        return
    for garbage in GARBAGE_TURNS:
        result = _play(env, episodes, rows[0], [garbage], f"garbage turn {garbage[:30]!r}")
        if result.score.correct:
            raise _fail(env, f"garbage turn {garbage[:30]!r} scored as a success")
        if result.end is EpisodeEnd.ENV_ERROR:
            raise _fail(
                env, f"step function failed on garbage turn {garbage[:30]!r}: {result.state.error}"
            )
    stubborn = _play(env, episodes, rows[0], ["I will not answer."], "a never-ending policy")
    if len(stubborn.state.turns) > budget.max_turns:
        raise _fail(env, f"episode ran {len(stubborn.state.turns)} > max_turns turns")
    for row in rows:
        turns = ["I do not know.", "```python\nprint(1)\n```", "\\boxed{0}", "<answer>1</answer>"]
        first = _play(env, episodes, row, turns, f"row {row.id}")
        again = _play(env, episodes, row, turns, f"row {row.id} (again)")
        _same(env, first, again, f"row {row.id}: two plays of the same turns")
        if twin is not None and isinstance(twin.unwrapped, Episodic):
            other = _play(twin, twin.unwrapped, row, turns, f"row {row.id} (twin)")
            _same(env, first, other, f"row {row.id}: two builds from the same spec")


def _play(
    env: Environment, episodes: Episodic, row: Sample, turns: list[str], what: str
) -> EpisodeResult:
    try:
        result = run_episode(episodes, row, scripted(turns))
    except Exception as exc:
        raise _fail(env, f"{what}: the episode raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(result.end, EpisodeEnd):
        raise _fail(env, f"{what}: episode end {result.end!r} is not an EpisodeEnd")
    return result


def _same(env: Environment, a: EpisodeResult, b: EpisodeResult, what: str) -> None:
    if a.state.observations != b.state.observations:
        raise _fail(env, f"{what} gave different observations")
    if (a.end, a.score.outcome, a.score.reward) != (b.end, b.score.outcome, b.score.reward):
        raise _fail(
            env,
            f"{what} gave different results: {a.end}/{a.score.outcome}/{a.score.reward} vs "
            f"{b.end}/{b.score.outcome}/{b.score.reward}",
        )
