r"""Episodes: environments that answer back, with single-turn as the one-turn special case.

An episode starts from a ``Sample``; the model takes a turn (text); the environment answers with an
``Observation`` (chat messages, and the same as raw text for models without a chat template) or
ends the episode; at the end the whole episode is scored with the environment's ``Rubric`` on the
final model turn, plus ``EpisodeComponent`` terms that see every turn (e.g. a penalty per extra
turn). State is a frozen ``EpisodeState`` (the transcript and the budgets used), never a dict:
an environment's step function is a pure function of the state and the new turn, which is what
makes episodes reproducible (same sample + same turns -> same observations and score).

Budgets (``EpisodeBudget``): ``max_turns``, total sampled tokens, tool seconds. An episode the
environment does not end is cut when a budget runs out, and ``EpisodeState.end`` says which
(``EpisodeEnd``); the episode is still scored on what the model produced.

``MultiTurnEnv`` is composed like ``SingleTurnEnv``, without subclassing::

    def step(state: EpisodeState, turn: str) -> Step:
        if "\\boxed{" in turn:
            return Step.end()
        return Step.reply("Put the final answer in \\boxed{}.")

    env = MultiTurnEnv(rows, rubric, step, budget=EpisodeBudget(max_turns=3))

Any other ``Environment`` is seen as one-turn episodes through ``episodic(env)``, so the trainer
and ``grpo eval`` can treat every environment as episodic, and single-turn environments keep
their behaviour exactly (their ``score`` is what ends the one turn).

``run_episode`` drives an episode with a plain ``text -> text`` policy (tests, ``check_env``).
The design follows the reset/step loop of OpenRLHF's ``MultiTurnExecutor`` and SkyRL's
``BaseTextEnv``, and verifiers' view of a single-turn environment as a one-turn multi-turn one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Protocol, runtime_checkable

from grpo_envs.base import Environment, SampleLike, SampleSource, SingleTurnEnv, _check_aligned
from grpo_envs.rubric import Rubric
from grpo_envs.types import Component, Message, Outcome, Sample, Score


class EpisodeOverError(ValueError):
    """A turn was given to an episode that has already ended (the caller's bug)."""


class EpisodeEnd(StrEnum):
    """How an episode ended (``None`` on ``EpisodeState.end`` while it runs)."""

    DONE = "done"  # the environment ended it (an answer was given, the task is over)
    MAX_TURNS = "max_turns"  # cut: the model used every turn without the environment ending it
    MAX_TOKENS = "max_tokens"  # cut: the sampled tokens of all turns reached the budget
    TOOL_TIME = "tool_time"  # cut: the tools' seconds reached the budget
    ENV_ERROR = "env_error"  # the step function raised or returned a non-Step (not the model's)
    # The trainer's chat template could not render the reply as an extension of the history
    # (grpo_train.episodes.tokens.TemplateBreak) and the episode was ended there.
    TEMPLATE_BREAK = "template_break"

    @property
    def truncated(self) -> bool:
        """True when a budget cut the episode (the environment did not end it)."""
        return self in (EpisodeEnd.MAX_TURNS, EpisodeEnd.MAX_TOKENS, EpisodeEnd.TOOL_TIME)


@dataclass(frozen=True)
class EpisodeBudget:
    """What one episode may use; ``max_turns`` counts model turns (1 = single-turn)."""

    max_turns: int = 4
    max_tokens: int | None = None
    max_tool_s: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.max_turns, int) or self.max_turns < 1:
            raise ValueError(f"max_turns must be an int >= 1, got {self.max_turns!r}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1 or None, got {self.max_tokens!r}")
        if self.max_tool_s is not None and not (
            math.isfinite(self.max_tool_s) and self.max_tool_s > 0
        ):
            raise ValueError(f"max_tool_s must be a positive number or None, got {self.max_tool_s}")

    def tool_s_left(self, used_s: float) -> float | None:
        """Seconds of tool time left after ``used_s`` (None: no cap; 0 once spent).

        >>> EpisodeBudget(max_tool_s=1.5).tool_s_left(1.0), EpisodeBudget().tool_s_left(9.0)
        (0.5, None)
        >>> EpisodeBudget(max_tool_s=1.5).tool_s_left(2.0)
        0.0
        """
        if self.max_tool_s is None:
            return None
        return max(self.max_tool_s - used_s, 0.0)


@dataclass(frozen=True)
class Observation:
    """The environment's answer to a turn: chat messages to append, and its raw-text form.

    ``text`` is what a model without a chat template sees (default: the messages' contents, one
    per line).
    """

    messages: tuple[Message, ...]
    text: str = ""

    def __post_init__(self) -> None:
        if not self.messages:
            raise ValueError("an observation needs at least one message")
        if not self.text:
            object.__setattr__(self, "text", "\n".join(m.content for m in self.messages) + "\n")


class ToolStatus(StrEnum):
    """How one tool call ended; every one of them is an observation the model sees."""

    OK = "ok"
    ERROR = "error"  # the code raised / its earlier calls failed on replay / ran out of memory
    MALFORMED = "malformed"  # the call could not be parsed (bad JSON, no name, unknown tool)
    TIMEOUT = "timeout"  # the tool ran out of time
    SANDBOX_ERROR = "sandbox_error"  # the sandbox itself failed (not the model's fault)
    # The code ended the interpreter (sys.exit, KeyboardInterrupt, os._exit, a fatal signal): that
    # call ended there, the tool's session goes on without it.
    EXITED = "exited"
    # Not run: the episode's tool budget (tool seconds, calls per reply) was spent.
    REFUSED = "refused"


@dataclass(frozen=True)
class ToolRecord:
    """One tool call of an episode: what was asked, how it ended, what it cost."""

    name: str
    code: str
    status: ToolStatus
    seconds: float = 0.0
    output: str = ""


@dataclass(frozen=True)
class Step:
    """What a step function returns: an observation (the episode goes on) or the end."""

    observation: Observation | None = None
    tools: tuple[ToolRecord, ...] = ()

    @classmethod
    def reply(
        cls,
        content: str | Sequence[Message],
        *,
        role: str = "user",
        tools: Sequence[ToolRecord] = (),
    ) -> Step:
        """Answer with one message of ``role`` (or the given messages) and go on."""
        messages = (Message(role, content),) if isinstance(content, str) else tuple(content)
        return cls(Observation(messages), tuple(tools))

    @classmethod
    def end(cls, *, tools: Sequence[ToolRecord] = ()) -> Step:
        """End the episode (it is then scored)."""
        return cls(None, tuple(tools))


@dataclass(frozen=True)
class EpisodeState:
    """An episode so far: the sample, the model's turns, the environment's observations, usage.

    ``observations[i]`` answers ``turns[i]``; the last turn has no observation once ended.
    """

    sample: Sample
    turns: tuple[str, ...] = ()
    observations: tuple[Observation, ...] = ()
    tokens: int = 0
    tools: tuple[ToolRecord, ...] = ()
    end: EpisodeEnd | None = None
    error: str = ""

    @property
    def done(self) -> bool:
        """True once the episode has ended (by the environment or a budget)."""
        return self.end is not None

    @property
    def tool_s(self) -> float:
        """Seconds the tools of this episode have used."""
        return math.fsum(t.seconds for t in self.tools)

    @property
    def last_turn(self) -> str:
        """The model's latest turn ("" before the first)."""
        return self.turns[-1] if self.turns else ""

    def messages(self) -> list[Message]:
        """Return the whole conversation: prompt, then each turn and its observation."""
        history = list(self.sample.prompt)
        for i, turn in enumerate(self.turns):
            history.append(Message("assistant", turn))
            if i < len(self.observations):
                history.extend(self.observations[i].messages)
        return history

    def text(self) -> str:
        """Return the conversation as raw text (for models without a chat template)."""
        parts = [m.content + "\n" for m in self.sample.prompt]
        for i, turn in enumerate(self.turns):
            parts.append(turn)
            if i < len(self.observations):
                parts.append(self.observations[i].text)
        return "".join(parts)


#: A step function: the state (the new turn already appended) and that turn -> the next Step.
StepFn = Callable[[EpisodeState, str], Step]


@dataclass(frozen=True)
class EpisodeComponent:
    """A weighted reward term over the whole episode (``weight * fn(state)``), added to the score.

    Its value joins ``Score.components`` next to the rubric's (so it is logged the same way).
    """

    name: str
    weight: float
    fn: Callable[[EpisodeState], float]


def turn_penalty(weight: float = -0.1) -> EpisodeComponent:
    """``weight`` per turn beyond the first (a one-turn episode is not penalised).

    >>> state = EpisodeState(Sample("0", (), "1"), turns=("a", "b", "c"))
    >>> turn_penalty(-0.1).fn(state)
    2.0
    """
    return EpisodeComponent(
        "extra_turns", weight, lambda state: float(max(len(state.turns) - 1, 0))
    )


def add_episode_components(
    score: Score, state: EpisodeState, components: Sequence[EpisodeComponent]
) -> Score:
    """Return ``score`` with the episode components added (reward = weighted sum of all).

    A failed score (no components: a typed failure) keeps its zero reward and only gains the
    episode's details. A component that raises or is not finite makes the score an ``ERROR``.
    """
    details = {**score.details, "turns": len(state.turns), "tool_calls": len(state.tools)}
    if state.end is not None:
        details["episode_end"] = state.end.value
    if not score.components:
        return replace(score, details=details)
    extra: list[Component] = []
    for comp in components:
        try:
            value = float(comp.fn(state))
        except Exception as exc:
            return Score.failure(
                Outcome.ERROR, f"episode component {comp.name!r} raised {type(exc).__name__}: {exc}"
            )
        if not math.isfinite(value):
            return Score.failure(Outcome.ERROR, f"episode component {comp.name!r} gave {value}")
        extra.append(Component(comp.name, value, comp.weight))
    parts = (*score.components, *extra)
    reward = math.fsum(c.weighted for c in parts)
    return Score(reward=reward, outcome=score.outcome, components=parts, details=details)


@runtime_checkable
class Episodic(Protocol):
    """What the episode driver (and the trainer) needs from an environment."""

    budget: EpisodeBudget

    def start(self, sample: SampleLike) -> EpisodeState:
        """Begin an episode for ``sample``."""
        ...

    def step(self, state: EpisodeState, turn: str, *, tokens: int = 0) -> EpisodeState:
        """Take the model's ``turn`` (``tokens`` sampled tokens); return the next state."""
        ...

    def score_episode(self, state: EpisodeState) -> Score:
        """Score the (ended) episode."""
        ...


def _advance(
    budget: EpisodeBudget, state: EpisodeState, turn: str, tokens: int, step_fn: StepFn
) -> EpisodeState:
    """Append ``turn``, ask ``step_fn`` for the answer, then apply the budgets (in that order).

    The environment's own end wins over a budget cut on the same turn: an episode that answered
    on its last allowed turn is DONE, not cut.
    """
    if state.done:
        raise EpisodeOverError(
            f"episode {state.sample.id} already ended ({state.end}); start a new one"
        )
    if not isinstance(turn, str):
        turn = "" if turn is None else str(turn)
    state = replace(state, turns=(*state.turns, turn), tokens=state.tokens + max(int(tokens), 0))
    try:
        result = step_fn(state, turn)
        if not isinstance(result, Step):
            raise TypeError(f"step function returned {type(result).__name__}, not a Step")
    except Exception as exc:
        return replace(state, end=EpisodeEnd.ENV_ERROR, error=f"{type(exc).__name__}: {exc}")
    state = replace(state, tools=(*state.tools, *result.tools))
    if result.observation is None:
        return replace(state, end=EpisodeEnd.DONE)
    if budget.max_tool_s is not None and state.tool_s >= budget.max_tool_s:
        return replace(state, end=EpisodeEnd.TOOL_TIME)
    if budget.max_tokens is not None and state.tokens >= budget.max_tokens:
        return replace(state, end=EpisodeEnd.MAX_TOKENS)
    if len(state.turns) >= budget.max_turns:
        return replace(state, end=EpisodeEnd.MAX_TURNS)
    return replace(state, observations=(*state.observations, result.observation))


class MultiTurnEnv(SingleTurnEnv):
    """A ``SingleTurnEnv`` whose episodes last up to ``budget.max_turns`` turns.

    Args:
        samples, rubric: as for ``SingleTurnEnv`` (the rubric scores the final turn).
        step_fn: ``(state, turn) -> Step`` (see ``StepFn``); pure in the state for determinism.
        budget: the episode budgets (default 4 turns, no token or tool-time cap).
        episode_components: reward terms over the whole episode (e.g. ``turn_penalty()``).
        **kwargs: ``system_prompt``, ``prompt_template``, ``reference``, ``splits``.

    ``score(completion, sample)`` scores a one-turn episode of that completion, so the
    single-turn trainer path and ``check_env``'s scoring checks apply unchanged.
    """

    def __init__(
        self,
        samples: SampleSource | None,
        rubric: Rubric,
        step_fn: StepFn,
        *,
        budget: EpisodeBudget | None = None,
        episode_components: Sequence[EpisodeComponent] = (),
        **kwargs: object,
    ) -> None:
        """Compose a multi-turn environment (see the class docstring)."""
        super().__init__(samples, rubric, **kwargs)  # type: ignore[arg-type]
        self.step_fn = step_fn
        self.budget = budget if budget is not None else EpisodeBudget()
        self.episode_components = tuple(episode_components)

    def start(self, sample: SampleLike) -> EpisodeState:
        """Begin an episode for ``sample`` (a dataset row or a ``Sample``)."""
        return EpisodeState(Sample.from_row(sample))

    def step(self, state: EpisodeState, turn: str, *, tokens: int = 0) -> EpisodeState:
        """Take the model's ``turn``; the returned state carries the observation or the end."""
        return _advance(self.budget, state, turn, tokens, self.step_fn)

    def score_episode(self, state: EpisodeState) -> Score:
        """Score the final turn with the rubric, plus the episode components."""
        if state.end is EpisodeEnd.ENV_ERROR:
            score = Score.failure(Outcome.ERROR, f"environment step failed: {state.error}")
            return add_episode_components(score, state, ())
        base = SingleTurnEnv.score(self, state.last_turn, state.sample)
        return add_episode_components(base, state, self.episode_components)

    def score(self, completion: object, sample: SampleLike) -> Score:  # type: ignore[override]
        """Score ``completion`` as a one-turn episode (ended there, whatever the step says)."""
        prepared = self._prepare(completion, sample)
        if isinstance(prepared, Score):
            return prepared
        text, parsed_sample = prepared
        state = EpisodeState(parsed_sample, turns=(text,), end=EpisodeEnd.DONE)
        return add_episode_components(
            self.rubric.score(text, parsed_sample), state, self.episode_components
        )

    def score_batch(
        self,
        completions: Sequence[str],
        samples: Sequence[SampleLike],
        *,
        workers: int | None = None,
        timeout_s: float | None = None,
    ) -> list[Score]:
        """``score`` over aligned lists, the rubric judging in one batch."""
        _check_aligned(completions, samples)
        scores = super().score_batch(completions, samples, workers=workers, timeout_s=timeout_s)
        out = []
        for completion, sample, score in zip(completions, samples, scores):
            prepared = self._prepare(completion, sample)
            if isinstance(prepared, Score):
                out.append(score)
                continue
            state = EpisodeState(prepared[1], turns=(prepared[0],), end=EpisodeEnd.DONE)
            out.append(add_episode_components(score, state, self.episode_components))
        return out


class OneTurn:
    """Any ``Environment`` as one-turn episodes: the first turn ends the episode.

    The score is exactly ``env.score(turn, sample)`` (with the wrappers ``make`` added, so it
    never raises), plus the episode's details (``turns``, ``episode_end``).
    """

    def __init__(self, env: Environment) -> None:
        """View ``env`` as episodic."""
        self.env = env
        self.budget = EpisodeBudget(max_turns=1)

    def start(self, sample: SampleLike) -> EpisodeState:
        """Begin an episode for ``sample``."""
        return EpisodeState(Sample.from_row(sample))

    def step(self, state: EpisodeState, turn: str, *, tokens: int = 0) -> EpisodeState:
        """End the episode with ``turn``."""
        return _advance(self.budget, state, turn, tokens, lambda _state, _turn: Step.end())

    def score_episode(self, state: EpisodeState) -> Score:
        """``env.score`` of the turn."""
        return add_episode_components(self.env.score(state.last_turn, state.sample), state, ())


class GuardedEpisodes:
    """An episodic environment whose ``score_episode`` never raises and is always a valid Score.

    ``make`` guards ``score`` (``grpo_envs.wrappers``); this does the same for episodes, so that a
    broken rubric or episode component costs one episode (an ``ERROR`` score), never the step.
    """

    def __init__(self, env: Episodic) -> None:
        """Guard ``env``."""
        self.env = env
        self.budget = env.budget

    def start(self, sample: SampleLike) -> EpisodeState:
        """Begin an episode (a malformed sample raises: it is the caller's data)."""
        return self.env.start(sample)

    def step(self, state: EpisodeState, turn: str, *, tokens: int = 0) -> EpisodeState:
        """Take the inner step; one that raises ends the episode as ``ENV_ERROR``."""
        try:
            return self.env.step(state, turn, tokens=tokens)
        except EpisodeOverError:
            raise
        except Exception as exc:
            ended = replace(state, turns=(*state.turns, turn), end=EpisodeEnd.ENV_ERROR)
            return replace(ended, error=f"{type(exc).__name__}: {exc}")

    def score_episode(self, state: EpisodeState) -> Score:
        """Return the inner score, or an ``ERROR`` score when it raises or is malformed."""
        from grpo_envs.wrappers import _valid

        try:
            return _valid(self.env.score_episode(state))
        except Exception as exc:
            return Score.failure(Outcome.ERROR, f"score_episode raised {type(exc).__name__}: {exc}")


def episodic(env: Environment) -> Episodic:
    """Return the episodes of ``env``: its own (guarded) if it runs them, else ``OneTurn(env)``."""
    if isinstance(env.unwrapped, Episodic):
        return GuardedEpisodes(env.unwrapped)
    return OneTurn(env)


def step_many(
    env: Episodic,
    states: Sequence[EpisodeState],
    turns: Sequence[str],
    tokens: Sequence[int] | None = None,
    *,
    workers: int = 1,
) -> list[EpisodeState]:
    """Step many live episodes (one engine batch's turns) at once; results in input order.

    With ``workers > 1`` the steps run in threads, so that tool calls of different episodes
    overlap in the sandbox's worker pool (the built-in step functions are thread-safe; a user's
    must be to use this). Ended episodes are returned unchanged.
    """
    if len(states) != len(turns) or (tokens is not None and len(tokens) != len(turns)):
        raise ValueError(f"{len(states)} states, {len(turns)} turns: pass one turn per episode")
    counts = list(tokens) if tokens is not None else [0] * len(turns)

    def one(i: int) -> EpisodeState:
        if states[i].done:
            return states[i]
        return env.step(states[i], turns[i], tokens=counts[i])

    if workers <= 1 or len(states) <= 1:
        return [one(i) for i in range(len(states))]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(workers, len(states))) as pool:
        return list(pool.map(one, range(len(states))))


#: A policy for the pure-python driver: the conversation so far as raw text -> the next turn.
Policy = Callable[[str], str]


@dataclass(frozen=True)
class EpisodeResult:
    """A finished episode and its score."""

    state: EpisodeState
    score: Score = field(compare=True)

    @property
    def end(self) -> EpisodeEnd:
        """How it ended."""
        assert self.state.end is not None
        return self.state.end


def count_words(text: str) -> int:
    """Count whitespace-separated words: the pure-python driver's stand-in for tokens.

    >>> count_words("two words")
    2
    """
    return len(text.split())


def run_episode(
    env: Episodic | Environment,
    sample: SampleLike,
    policy: Policy,
    *,
    count_tokens: Callable[[str], int] = count_words,
) -> EpisodeResult:
    """Play one episode to its end with ``policy`` and score it.

    The policy sees ``state.text()`` (the raw-text conversation) and returns the next turn. The
    loop is bounded by ``budget.max_turns`` even for an environment that never ends episodes:
    after that many turns the episode is cut here (``MAX_TURNS``) if ``step`` did not cut it.
    A policy that raises propagates (it is the caller's code, not the model's output).
    """
    episodes = episodic(env) if isinstance(env, Environment) else env
    state = episodes.start(sample)
    for _ in range(episodes.budget.max_turns):
        turn = policy(state.text())
        state = episodes.step(
            state, turn, tokens=count_tokens(turn if isinstance(turn, str) else "")
        )
        if state.done:
            break
    if not state.done:
        state = replace(state, end=EpisodeEnd.MAX_TURNS)
    return EpisodeResult(state, episodes.score_episode(state))


def scripted(turns: Sequence[str]) -> Policy:
    """Return a policy playing ``turns`` in order, then repeating the last one (for tests).

    >>> policy = scripted(["a", "b"])
    >>> [policy(""), policy(""), policy("")]
    ['a', 'b', 'b']
    """
    if not turns:
        raise ValueError("scripted() needs at least one turn")
    played = iter(turns)
    last = turns[-1]

    def play(_history: str) -> str:
        return next(played, last)

    return play


__all__ = [
    "EpisodeBudget",
    "EpisodeComponent",
    "EpisodeEnd",
    "EpisodeOverError",
    "EpisodeResult",
    "EpisodeState",
    "Episodic",
    "GuardedEpisodes",
    "MultiTurnEnv",
    "Observation",
    "OneTurn",
    "Policy",
    "Step",
    "StepFn",
    "ToolRecord",
    "ToolStatus",
    "add_episode_components",
    "count_words",
    "episodic",
    "run_episode",
    "scripted",
    "step_many",
    "turn_penalty",
]
