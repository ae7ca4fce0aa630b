"""Batched multi-turn rollouts: every live episode of a step advances together, token-exactly.

``generate_episodes`` plays a group of episodes per prompt with a rollout engine. Turn 0 is one
``engine.generate`` call over the prompts (exactly the single-turn call: same ids, same sampling);
each later turn is one call over every live episode, whose prompt is the episode's token history
so far: the prompt's ids, the ids the engine sampled, the ids the environment's replies inserted.
Text is never re-tokenized into the history: decoding and re-encoding can merge or split tokens
differently (``grpo_train.episodes.tokens``). The environment's replies are stepped together
(``grpo_envs.episode.step_many``, so tool calls of different episodes overlap) and each reply is
rendered once, after an anchor turn (``reply_render.ReplyRenderer``: no earlier turn is
re-rendered). Under the ``rerender`` history policy the next turn is sampled from the template's
rendering of the whole history instead, a new training sequence where it differs (a fork). A
reply the template cannot render is a ``TemplateBreak``, said out loud (``_report_break``): it
ends the episode there (``BreakPolicy.END``) or continues it from the re-rendered history
(``BreakPolicy.SPLIT``). The cost of a step is then about the cost of the
tokens it samples, not of ``turns x episodes`` sequential passes.

Budgets: ``EpisodeSettings.max_episode_tokens`` caps everything after the prompt (sampled and
inserted ids), so a history always fits the engine's context (prompt + completion length);
each turn samples at most ``min(sampling.max_new_tokens, what is left)`` tokens. An episode with
nothing left is cut (``EpisodeEnd.MAX_TOKENS``). The environment's own budgets
(``EpisodeBudget``) apply as in ``step_many``.

Models without a chat template (``chat_template: plain``): the observation's raw ``text`` is
encoded and appended; there is no template to check the extension against.

Why one module over 500 lines: the renderer, the settings, the rollout record, the batched loop
and the step statistics are one contract (what a multi-turn rollout is and how it is bounded),
used as a whole by the trainer, ``grpo eval`` and the benchmarks; about half is docstrings.
"""

from __future__ import annotations

import functools
import logging
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from grpo_envs.base import Environment
from grpo_envs.episode import (
    EpisodeEnd,
    EpisodeState,
    Episodic,
    OneTurn,
    ToolStatus,
    episodic,
    step_many,
)
from grpo_envs.types import Sample, Score
from grpo_train.episodes.plain_text import encode_plain
from grpo_train.episodes.prompts import PLAIN, PromptFormat, encode_prompt
from grpo_train.episodes.records import ToolCallRecord, TurnRecord
from grpo_train.episodes.reply_render import (
    HistoryPolicy,
    ReplyRenderer,
    TemplateError,
    check_template,
)
from grpo_train.episodes.tokens import (
    AssembledEpisode,
    BreakPolicy,
    Continuation,
    Extension,
    SampledTurn,
    TemplateBreak,
    TrainingSequence,
    assemble_episode,
)
from grpo_train.rollout.base import Completion, RolloutEngine, SamplingConfig

logger = logging.getLogger(__name__)

#: Seed offset between turns: turn ``t`` samples with ``sampling.seed + t * TURN_SEED_STRIDE``.
TURN_SEED_STRIDE = 1_000_033


@dataclass(frozen=True)
class EpisodeRenderer:
    """How an episode's history becomes ids: the tokenizer and the run's ``PromptFormat``.

    ``tools``: tool schemas for templates with tool calling (``apply_chat_template(tools=)``).
    ``history``: the history policy (``reply_render.HistoryPolicy``): ``KEEP`` inserts each
    reply's ids rendered after an anchor turn (``ReplyRenderer``); ``RERENDER`` shows the model
    the template's rendering of the whole history, a new training sequence where it differs.
    """

    tokenizer: Any
    prompt_format: PromptFormat = field(default_factory=PromptFormat)
    tools: tuple[Mapping[str, object], ...] | None = None
    history: HistoryPolicy = HistoryPolicy.KEEP

    @property
    def chat(self) -> bool:
        """Whether histories go through a chat template (False: plain text)."""
        fmt = self.prompt_format
        if fmt.chat_template.strip() == PLAIN:
            return False
        return bool(fmt.template_text() or getattr(self.tokenizer, "chat_template", None))

    @property
    def template_name(self) -> str:
        """The chat template's name for messages: its file, or the tokenizer's."""
        given = self.prompt_format.chat_template.strip()
        if given and "{" not in given and Path(given).is_file():
            return Path(given).name
        if given:
            return "given as text"
        return f"of {getattr(self.tokenizer, 'name_or_path', '') or 'the tokenizer'}"

    @functools.cached_property
    def replies(self) -> ReplyRenderer:
        """The reply renderer, after the start-up check (``TemplateError`` when it fails)."""
        return check_template(self, self.template_name, tools=self.tools)

    def check(self) -> str | None:
        """Check the template extends episodes (raises ``TemplateError``); its description."""
        return self.replies.describe() if self.chat else None

    def prompt_ids(self, sample: Sample, max_tokens: int | None = None) -> list[int]:
        """Return the prompt's ids, as single-turn training and ``grpo eval`` encode them."""
        return encode_prompt(self.tokenizer, sample, self.prompt_format, max_tokens).ids

    def apply_chat_template(self, conversation: object, **kwargs: object) -> object:
        """Call the tokenizer's ``apply_chat_template`` with the run's template and kwargs."""
        fmt = self.prompt_format
        template = fmt.template_text()
        extra: dict[str, object] = {**fmt.chat_template_kwargs, **kwargs}
        if template is not None:
            extra["chat_template"] = template
        return self.tokenizer.apply_chat_template(conversation, **extra)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Text -> ids (no special tokens added: the template writes them)."""
        return [int(i) for i in self.tokenizer.encode(text, add_special_tokens=add_special_tokens)]

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """Ids -> text."""
        return str(self.tokenizer.decode(list(token_ids), skip_special_tokens=skip_special_tokens))

    def continuation(
        self,
        state: EpisodeState,
        completions: Sequence[Completion],
        history_ids: Sequence[int] = (),
    ) -> Continuation:
        """Return the ids the latest observation of ``state`` inserts after the last turn.

        ``history_ids``: what the last turn was sampled from, then its ids (``RERENDER``
        compares the template's rendering of the whole history with it plus the reply's ids).
        A reply the template cannot render is a ``TemplateBreak`` (not a fork).
        """
        observation = state.observations[-1]
        if not self.chat:  # the observation's text is data: plain text, no control token
            return Extension(tuple(encode_plain(self, observation.text)))
        reply = _dicts(observation.messages)
        last = completions[-1]
        try:
            inserted = self.replies.inserted(reply, last.token_ids, last.finish_reason == "stop")
        except TemplateError as err:
            return TemplateBreak(str(err), self._rerendered(state, completions) or ())
        if self.history is HistoryPolicy.KEEP:
            return Extension(inserted)
        kept = (*history_ids, *inserted)
        restart = self._rerendered(state, completions)
        if restart is None or restart == kept:
            return Extension(inserted)
        at = next((i for i, (a, b) in enumerate(zip(kept, restart)) if a != b), len(kept))
        return TemplateBreak(
            f"the template re-renders the history differently from token {at}", restart, True
        )

    def _rerendered(
        self, state: EpisodeState, completions: Sequence[Completion]
    ) -> tuple[int, ...] | None:
        """Return the whole history as the template renders it, generation prompt included."""
        history = self.prompt_format.messages(state.sample)
        for i, completion in enumerate(completions):
            history.append({"role": "assistant", "content": self.turn_content(completion)})
            history.extend(_dicts(state.observations[i].messages))
        try:
            return self.replies.render_ids(history)
        except TemplateError:
            return None

    def turn_content(self, completion: Completion) -> str:
        """Return the sampled turn as the template must render it (ids decoded, specials kept).

        The engine's ``text`` drops special tokens; a turn that sampled one mid-way would then
        be rendered as something it did not sample. Only a final stop token is left out: the
        template writes the closing.
        """
        ids = completion.token_ids
        if completion.finish_reason == "stop" and ids:
            ids = ids[:-1]
        return self.decode(ids, skip_special_tokens=False)


def _dicts(messages: Iterable[Any]) -> list[dict[str, str]]:
    return [{"role": m.role, "content": m.content} for m in messages]


#: Threads stepping one turn's environments: tool calls of different episodes overlap in the
#: sandbox. Step functions are pure in the episode state (the episode contract), so thread-safe.
STEP_WORKERS = 4


@dataclass(frozen=True)
class EpisodeSettings:
    """How ``generate_episodes`` bounds and assembles episodes."""

    max_episode_tokens: int
    """Cap on the ids after the prompt (sampled + inserted); keeps histories in the context."""
    on_break: BreakPolicy = BreakPolicy.END
    """At a ``TemplateBreak``: END stops the episode; SPLIT continues from the re-rendering."""
    workers: int = 1
    """Threads stepping the environments of one turn (tool calls overlap)."""
    max_turn_tokens: int | None = None
    """Cap on one turn's sampled ids (None: ``sampling.max_new_tokens``)."""
    max_sequence_tokens: int | None = None
    """Cap on a whole history, prompt included (an engine's context length; None: no cap)."""
    fatal_breaks: bool = False
    """A reply the chat template cannot render raises ``TemplateBreakError`` (else: a warning
    the first time, the episode ends there, ``episodes/broken_share`` counts it)."""

    def left(self, prompt_len: int, history_len: int) -> int:
        """Ids a history may still grow by: the prompt plus ``max_episode_tokens`` in all.

        >>> EpisodeSettings(max_episode_tokens=10).left(4, 9)
        5
        >>> EpisodeSettings(max_episode_tokens=10, max_sequence_tokens=12).left(4, 9)
        3
        """
        cap = prompt_len + self.max_episode_tokens
        if self.max_sequence_tokens is not None:
            cap = min(cap, self.max_sequence_tokens)
        return cap - history_len

    def turn_cap(self, sampling: SamplingConfig) -> int:
        """Ids one turn may sample at most (before the episode's own budget).

        >>> EpisodeSettings(max_episode_tokens=10, max_turn_tokens=4).turn_cap(SamplingConfig())
        4
        """
        cap = min(sampling.max_new_tokens, self.max_episode_tokens)
        return cap if self.max_turn_tokens is None else min(cap, self.max_turn_tokens)

    def __post_init__(self) -> None:
        if self.max_episode_tokens < 1:
            raise ValueError(f"max_episode_tokens must be >= 1, got {self.max_episode_tokens}")
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")
        for name in ("max_turn_tokens", "max_sequence_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1 or None, got {value}")


@dataclass(frozen=True)
class EpisodeRollout:
    """One finished episode of one prompt: its state, the engine's turns, its training ids."""

    prompt_index: int
    prompt_ids: tuple[int, ...]
    state: EpisodeState
    completions: tuple[Completion, ...]
    continuations: tuple[Continuation, ...]
    """What followed each turn but the last (``Extension`` or, under SPLIT, ``TemplateBreak``)."""
    assembled: AssembledEpisode
    end_break: TemplateBreak | None = None
    """The break that ended the episode under ``BreakPolicy.END`` (``TEMPLATE_BREAK``)."""
    tools_after_turn: tuple[int, ...] = ()
    """Per model turn: how many of ``state.tools`` had been made once its step ran (turn ``t``'s
    calls are ``state.tools[tools_after_turn[t - 1]:tools_after_turn[t]]``)."""

    @property
    def sequence(self) -> TrainingSequence:
        """The training sequence a GRPO row holds (the first; the only one unless SPLIT broke)."""
        return self.assembled.sequences[0]

    @property
    def completion_ids(self) -> tuple[int, ...]:
        """The sequence after the prompt: sampled and inserted ids."""
        return self.sequence.input_ids[self.sequence.prompt_len :]

    @property
    def loss_mask(self) -> tuple[int, ...]:
        """1 on sampled ids, 0 on the environment's, aligned with ``completion_ids``."""
        return self.sequence.loss_mask[self.sequence.prompt_len :]

    @property
    def sampling_logprobs(self) -> tuple[float, ...]:
        """The engine's logprob of each sampled id (0.0 on inserted ids)."""
        return self.sequence.logprobs[self.sequence.prompt_len :]

    @property
    def turns(self) -> int:
        """Model turns played."""
        return len(self.completions)

    @property
    def sampled_tokens(self) -> int:
        """Ids the engine sampled, over every turn."""
        return sum(len(c.token_ids) for c in self.completions)

    @property
    def environment_tokens(self) -> int:
        """Ids the environment's replies inserted (in every training sequence)."""
        return sum(s.environment_tokens for s in self.assembled.sequences)

    @property
    def tool_calls(self) -> int:
        """Tool calls the episode made."""
        return len(self.state.tools)

    @property
    def tool_errors(self) -> int:
        """Tool calls that did not end OK (errors, malformed calls, timeouts, sandbox faults)."""
        return sum(t.status is not ToolStatus.OK for t in self.state.tools)

    @property
    def template_breaks(self) -> int:
        """Replies the chat template could not render (forks of ``rerender`` are not breaks)."""
        split = sum(isinstance(c, TemplateBreak) and not c.fork for c in self.continuations)
        return split + (self.end_break is not None)

    @property
    def forks(self) -> int:
        """Where ``rerender`` started a new training sequence from the template's rendering."""
        return sum(isinstance(c, TemplateBreak) and c.fork for c in self.continuations)

    @property
    def truncated(self) -> bool:
        """True when a budget cut the episode or its last turn ran out of tokens."""
        end = self.state.end
        cut = end is not None and end.truncated
        return cut or self.completions[-1].truncated

    @property
    def text(self) -> str:
        """The final turn's text (what the rubric scores)."""
        return self.state.last_turn


@dataclass
class _Live:
    """One episode while it runs (private: mutated as its turns come in)."""

    prompt_index: int
    prompt_ids: tuple[int, ...]
    env: Episodic
    state: EpisodeState
    history: list[int]
    """The ids the next turn is sampled from."""
    completions: list[Completion] = field(default_factory=list)
    continuations: list[Continuation] = field(default_factory=list)
    end_break: TemplateBreak | None = None
    tools_after_turn: list[int] = field(default_factory=list)


def generate_episodes(
    engine: RolloutEngine,
    renderer: EpisodeRenderer,
    envs: Sequence[Episodic],
    samples: Sequence[Sample],
    prompt_ids: Sequence[Sequence[int]],
    sampling: SamplingConfig,
    settings: EpisodeSettings,
) -> list[list[EpisodeRollout]]:
    """Play ``sampling.n`` episodes per prompt to their end; ``[prompt][episode]``.

    Turn 0: one ``engine.generate(prompt_ids, sampling)``. Turn ``t``: one call (per distinct
    per-turn token budget) over every live episode's history, ``n=1``, seed ``sampling.seed +
    t * TURN_SEED_STRIDE``. The environments then step together; each reply is rendered once.
    """
    if not (len(envs) == len(samples) == len(prompt_ids)):
        raise ValueError(
            f"{len(envs)} envs, {len(samples)} samples, {len(prompt_ids)} prompts: one each"
        )
    if not samples:
        return []
    renderer.check()  # the start-up check (once per renderer): before any generation
    if settings.turn_cap(sampling) != sampling.max_new_tokens:
        sampling = replace(sampling, max_new_tokens=settings.turn_cap(sampling))
    left = min(settings.left(len(p), len(p)) for p in prompt_ids)
    if left < sampling.max_new_tokens:
        # A prompt near the context's end: the first turn gets only what every prompt can.
        if left < 1:
            raise ValueError(
                f"a prompt of {max(len(p) for p in prompt_ids)} tokens leaves no room in the "
                f"context of {settings.max_sequence_tokens} tokens"
            )
        sampling = replace(sampling, max_new_tokens=left)
    first = engine.generate([list(p) for p in prompt_ids], sampling)
    live = [
        _Live(p, tuple(prompt_ids[p]), envs[p], envs[p].start(samples[p]), list(prompt_ids[p]))
        for p in range(len(samples))
        for _ in range(sampling.n)
    ]
    flat = [c for group in first for c in group]
    if len(flat) != len(live):
        raise RuntimeError(f"the engine returned {len(flat)} completions for {len(live)} asked")
    _take_turn(live, flat, renderer, settings)
    turn = 1
    while running := [e for e in live if not e.state.done]:
        results = _sample_turn(engine, running, sampling, settings, turn)
        _take_turn(running, results, renderer, settings)
        turn += 1
    groups: list[list[EpisodeRollout]] = [[] for _ in samples]
    for e in live:
        assembled = assemble_episode(
            e.prompt_ids,
            [SampledTurn(c.token_ids, c.logprobs) for c in e.completions],
            e.continuations,
            on_break=settings.on_break,
        )
        if e.end_break is not None:
            why = f"after turn {len(e.completions) - 1}: {e.end_break.reason}"
            assembled = replace(assembled, breaks=(*assembled.breaks, why))
        groups[e.prompt_index].append(
            EpisodeRollout(
                e.prompt_index,
                e.prompt_ids,
                e.state,
                tuple(e.completions),
                tuple(e.continuations),
                assembled,
                e.end_break,
                tuple(e.tools_after_turn),
            )
        )
    return groups


def _sample_turn(
    engine: RolloutEngine,
    running: Sequence[_Live],
    sampling: SamplingConfig,
    settings: EpisodeSettings,
    turn: int,
) -> list[Completion]:
    """One engine call per distinct token budget over the running episodes; in their order.

    Episodes whose budget is below ``max_new_tokens`` get their own call: the engine's context
    is sized for the prompt plus the completion budget, and a history near the end of its budget
    must not be allowed ``max_new_tokens`` more.
    """
    seed = None if sampling.seed is None else sampling.seed + turn * TURN_SEED_STRIDE
    by_budget: dict[int, list[int]] = defaultdict(list)
    for i, e in enumerate(running):
        left = settings.left(len(e.prompt_ids), len(e.history))
        by_budget[min(settings.turn_cap(sampling), left)].append(i)
    out: list[Completion | None] = [None] * len(running)
    for budget, members in sorted(by_budget.items(), reverse=True):
        asked = replace(
            sampling,
            n=1,
            max_new_tokens=budget,
            seed=None if seed is None else seed + members[0],
        )
        results = engine.generate([running[i].history for i in members], asked)
        for i, group in zip(members, results):
            out[i] = group[0]
    assert all(c is not None for c in out)
    return [c for c in out if c is not None]


def _take_turn(
    live: Sequence[_Live],
    completions: Sequence[Completion],
    renderer: EpisodeRenderer,
    settings: EpisodeSettings,
) -> None:
    """Record each episode's sampled turn, step the environments, render their replies."""
    by_env: dict[int, list[int]] = defaultdict(list)
    for i, e in enumerate(live):
        e.completions.append(completions[i])
        e.history.extend(completions[i].token_ids)
        by_env[id(e.env)].append(i)
    for members in by_env.values():
        env = live[members[0]].env
        states = step_many(
            env,
            [live[i].state for i in members],
            [completions[i].text for i in members],
            [len(completions[i].token_ids) for i in members],
            workers=settings.workers,
        )
        for i, state in zip(members, states):
            live[i].state = state
            live[i].tools_after_turn.append(len(state.tools))
    for e in live:
        if not e.state.done:
            _extend(e, renderer, settings)


def _extend(e: _Live, renderer: EpisodeRenderer, settings: EpisodeSettings) -> None:
    """Append the environment's reply to a live episode's history, or end the episode.

    A reply that leaves no room for another turn ends the episode (``MAX_TOKENS``) without
    entering the history: no sampled turn would follow it.
    """
    continuation = renderer.continuation(e.state, e.completions, e.history)
    if isinstance(continuation, TemplateBreak):
        if not continuation.fork:
            _report_break(continuation, renderer, len(e.completions), settings)
        if not continuation.restart_ids or (
            settings.on_break is BreakPolicy.END and not continuation.fork
        ):
            e.end_break = continuation
            e.state = replace(e.state, end=EpisodeEnd.TEMPLATE_BREAK)
            return
        history = list(continuation.restart_ids)
    else:
        history = [*e.history, *continuation.ids]
    if settings.left(len(e.prompt_ids), len(history)) <= 0:
        e.state = replace(e.state, end=EpisodeEnd.MAX_TOKENS)
        return
    e.history = history
    e.continuations.append(continuation)


class TemplateBreakError(RuntimeError):
    """A reply the chat template could not render, with ``fatal_breaks`` set.

    ``template_breaks: error``: the run stops rather than train on an episode cut short.
    """


#: Templates whose first break this process has warned about (one warning each).
_WARNED: set[str] = set()


def _report_break(
    brk: TemplateBreak, renderer: EpisodeRenderer, turn: int, settings: EpisodeSettings
) -> None:
    """Raise (``fatal_breaks``) or warn, the first time per template, about a break."""
    template = renderer.template_name
    what = (
        f"chat template {template}: the environment's reply after turn {turn} could not be "
        f"rendered ({brk.reason}); the episode ends there"
    )
    if settings.fatal_breaks:
        raise TemplateBreakError(what)
    if template not in _WARNED:
        _WARNED.add(template)
        logger.warning(
            "%s. Further breaks are counted in episodes/broken_share; "
            "template_breaks: error makes them stop the run.",
            what,
        )


def is_multi_turn(env: Environment) -> bool:
    """Whether ``env`` runs episodes of its own (not the one-turn view of a single-turn env)."""
    return not isinstance(episodic(env), OneTurn)


def episode_row(rollout: EpisodeRollout) -> Completion:
    """Return the episode as one row of the step: its ids after the prompt, sampled logprobs.

    ``text`` is the transcript after the prompt (turns and replies, for the samples log); the
    finish reason is the last turn's, or ``length`` when a budget cut the episode.
    """
    parts = []
    for i, turn in enumerate(rollout.state.turns):
        parts.append(turn)
        if i < len(rollout.state.observations):
            parts.append(
                "\n".join(f"[{m.role}] {m.content}" for m in rollout.state.observations[i].messages)
            )
    return Completion(
        prompt_index=rollout.prompt_index,
        text="\n".join(parts),
        token_ids=rollout.completion_ids,
        logprobs=rollout.sampling_logprobs,
        finish_reason="length" if rollout.truncated else "stop",
    )


def episode_turns(rollout: EpisodeRollout) -> tuple[TurnRecord, ...]:
    """Return the episode turn by turn: each model turn, then the environment's reply to it.

    A model turn carries its sampled ids, finish reason and the tool calls its step ran (with
    their results); the last model turn is marked ``scored`` (the rubric judges the final turn).
    A reply carries the ids it inserted into the training sequence (None where the template
    re-rendered the history, or the reply ended the episode without entering it).
    """
    state = rollout.state
    bounds = (0, *rollout.tools_after_turn)
    out: list[TurnRecord] = []
    for i, turn in enumerate(state.turns):
        done = rollout.completions[i] if i < len(rollout.completions) else None
        tools = state.tools[bounds[i] : bounds[i + 1]] if i + 1 < len(bounds) else ()
        out.append(
            TurnRecord(
                role="assistant",
                text=turn,
                tokens=None if done is None else len(done.token_ids),
                finish_reason="" if done is None else done.finish_reason,
                tool_calls=tuple(
                    ToolCallRecord(
                        name=t.name,
                        call=t.code,
                        status=t.status.value,
                        seconds=t.seconds,
                        output=t.output,
                    )
                    for t in tools
                ),
                scored=i == len(state.turns) - 1,
            )
        )
        if i < len(state.observations):
            reply = state.observations[i].messages
            follow = rollout.continuations[i] if i < len(rollout.continuations) else None
            roles = list(dict.fromkeys(m.role for m in reply))
            out.append(
                TurnRecord(
                    role="+".join(roles),
                    text="\n".join(m.content for m in reply),
                    tokens=len(follow.ids) if isinstance(follow, Extension) else None,
                )
            )
    return tuple(out)


def score_episodes(
    envs: Sequence[Episodic], rollouts: Sequence[Sequence[EpisodeRollout]]
) -> list[list[Score]]:
    """Score each finished episode with its prompt's environment (``score_episode``)."""
    return [[envs[p].score_episode(r.state) for r in group] for p, group in enumerate(rollouts)]


@dataclass(frozen=True)
class EpisodeStats:
    """What a step's episodes did: turns, tool use, environment tokens, cuts, template breaks."""

    episodes: int = 0
    turns_mean: float = 0.0
    tool_calls: int = 0
    tool_errors: int = 0
    environment_token_share: float = 0.0
    """Inserted ids / (inserted + sampled ids), over every episode."""
    truncated: int = 0
    """Episodes a budget cut (turns, tokens, tool time)."""
    template_breaks: int = 0
    broken_share: float = 0.0
    """Episodes with a template break / episodes: the share cut short by the chat template."""
    sequences_mean: float = 0.0
    """Training sequences per episode (above 1 only where ``rerender`` forked)."""

    @classmethod
    def of(cls, rollouts: Iterable[EpisodeRollout]) -> EpisodeStats:
        """Aggregate finished episodes.

        >>> EpisodeStats.of([])
        EpisodeStats(episodes=0, turns_mean=0.0, tool_calls=0, tool_errors=0, \
environment_token_share=0.0, truncated=0, template_breaks=0, broken_share=0.0, \
sequences_mean=0.0)
        """
        items = list(rollouts)
        if not items:
            return cls()
        env = sum(r.environment_tokens for r in items)
        sampled = sum(r.sampled_tokens for r in items)
        return cls(
            episodes=len(items),
            turns_mean=sum(r.turns for r in items) / len(items),
            tool_calls=sum(r.tool_calls for r in items),
            tool_errors=sum(r.tool_errors for r in items),
            environment_token_share=env / (env + sampled) if env + sampled else 0.0,
            truncated=sum(r.truncated for r in items),
            template_breaks=sum(r.template_breaks for r in items),
            broken_share=sum(r.template_breaks > 0 for r in items) / len(items),
            sequences_mean=sum(len(r.assembled.sequences) for r in items) / len(items),
        )

    def metrics(self, prefix: str = "episodes") -> dict[str, float]:
        """Return the stats as run-log metrics (``episodes/turns_mean``...).

        Means per episode and shares, which compare across steps of any size; the one count,
        ``template_breaks``, is what the run summary adds up (its share is ``broken_share``).

        >>> m = EpisodeStats(episodes=4, turns_mean=1.5, tool_calls=6, tool_errors=3,
        ...                  truncated=1).metrics()
        >>> [m[f"episodes/{k}"] for k in ("tool_calls_mean", "tool_error_share", "truncated_share")]
        [1.5, 0.5, 0.25]
        """
        per_episode = 1 / self.episodes if self.episodes else 0.0
        return {
            f"{prefix}/turns_mean": self.turns_mean,
            f"{prefix}/tool_calls_mean": self.tool_calls * per_episode,
            f"{prefix}/tool_error_share": self.tool_errors / self.tool_calls
            if self.tool_calls
            else 0.0,
            f"{prefix}/environment_token_share": self.environment_token_share,
            f"{prefix}/truncated_share": self.truncated * per_episode,
            f"{prefix}/template_breaks": float(self.template_breaks),
            f"{prefix}/broken_share": self.broken_share,
            f"{prefix}/sequences_mean": self.sequences_mean,
        }


__all__ = [
    "STEP_WORKERS",
    "TURN_SEED_STRIDE",
    "EpisodeRenderer",
    "EpisodeRollout",
    "EpisodeSettings",
    "EpisodeStats",
    "TemplateBreakError",
    "episode_row",
    "episode_turns",
    "generate_episodes",
    "is_multi_turn",
    "score_episodes",
]
