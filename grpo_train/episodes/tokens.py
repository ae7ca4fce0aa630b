"""Token-exact training sequences for multi-turn episodes.

The tokens an episode trains on are the prompt's ids, then for each turn EXACTLY the ids the engine
sampled (never the re-tokenized text: decoding and re-encoding can merge or split tokens
differently, and the importance ratio would then compare logprobs of tokens that were never
sampled), then the ids the environment's reply inserts. Sampled tokens have loss mask 1 and keep
their sampling logprobs; environment tokens have mask 0.

The environment's ids come from rendering the reply alone after an anchor turn
(``grpo_train.episodes.reply_render.ReplyRenderer``, what rollouts use): earlier turns are never
re-rendered, so templates that render a finished turn differently once more messages follow
(Qwen3 drops earlier ``<think>`` blocks) still extend the episode. ``render_continuation`` is
the stricter whole-history check: the template's rendering of the history extended by the reply
must start with its rendering of the history so far, else a typed ``TemplateBreak``. A
``TemplateBreak`` (a reply the template cannot render, or a ``rerender`` fork) makes
``assemble_episode`` start a new training sequence from the re-rendered history
(``BreakPolicy.SPLIT``, and always for a fork) or stop the episode there (``BreakPolicy.END``).

Pure functions over ids; ``render_continuation`` only needs a tokenizer's ``apply_chat_template``,
``encode`` and ``decode``. Nothing heavy is imported here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from grpo_train.episodes.plain_text import chat_segments, drop_chars, encode_segments, join


class ChatTokenizer(Protocol):
    """What ``render_continuation`` uses of a Hugging Face tokenizer."""

    def apply_chat_template(self, conversation: object, **kwargs: object) -> object:
        """Render messages (``tokenize=False``: text)."""
        ...

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]:
        """Text -> ids."""
        ...

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = ...) -> str:
        """Ids -> text."""
        ...


@dataclass(frozen=True)
class SampledTurn:
    """One model turn as the engine returned it: sampled ids and their sampling logprobs."""

    ids: tuple[int, ...]
    logprobs: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.ids) != len(self.logprobs):
            raise ValueError(f"{len(self.ids)} sampled ids but {len(self.logprobs)} logprobs")


@dataclass(frozen=True)
class Extension:
    """The ids the environment's reply appends after a turn (mask 0)."""

    ids: tuple[int, ...]


@dataclass(frozen=True)
class TemplateBreak:
    """The template cannot extend the history: why, and the re-rendered history's ids.

    ``restart_ids`` is the full history (with the reply and the generation prompt) as the template
    renders it: the prompt of the next training sequence under ``BreakPolicy.SPLIT``.
    """

    reason: str
    restart_ids: tuple[int, ...]
    fork: bool = False
    """True where the ``rerender`` history policy chose the template's view (an expected new
    training sequence, not a failure); False where the template could not render the reply."""


Continuation = Extension | TemplateBreak


class BreakPolicy(StrEnum):
    """What ``assemble_episode`` does at a ``TemplateBreak``."""

    SPLIT = "split"  # a new training sequence starts from the re-rendered history
    END = "end"  # the episode's training data stops before the break


@dataclass(frozen=True)
class TrainingSequence:
    """One training sequence: ids, loss mask (1 = sampled) and sampling logprobs, aligned.

    ``logprobs`` is 0.0 where the mask is 0 (prompt and environment tokens are not scored).
    """

    input_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]
    logprobs: tuple[float, ...]
    prompt_len: int

    @property
    def environment_tokens(self) -> int:
        """Tokens after the prompt that the environment inserted (mask 0)."""
        return len(self.input_ids) - self.prompt_len - sum(self.loss_mask)


@dataclass(frozen=True)
class AssembledEpisode:
    """An episode's training sequences (one unless the template broke and SPLIT was chosen)."""

    sequences: tuple[TrainingSequence, ...]
    breaks: tuple[str, ...] = ()
    #: The index of the last turn included (all turns unless END stopped at a break).
    turns_used: int = 0


class _Builder:
    def __init__(self, prompt_ids: Sequence[int]) -> None:
        self.ids = list(prompt_ids)
        self.mask = [0] * len(self.ids)
        self.logprobs = [0.0] * len(self.ids)
        self.prompt_len = len(self.ids)

    def sampled(self, turn: SampledTurn) -> None:
        self.ids.extend(turn.ids)
        self.mask.extend([1] * len(turn.ids))
        self.logprobs.extend(turn.logprobs)

    def inserted(self, ids: Sequence[int]) -> None:
        self.ids.extend(ids)
        self.mask.extend([0] * len(ids))
        self.logprobs.extend([0.0] * len(ids))

    def done(self) -> TrainingSequence:
        return TrainingSequence(
            tuple(self.ids), tuple(self.mask), tuple(self.logprobs), self.prompt_len
        )


def assemble_episode(
    prompt_ids: Sequence[int],
    turns: Sequence[SampledTurn],
    continuations: Sequence[Continuation],
    *,
    on_break: BreakPolicy = BreakPolicy.SPLIT,
) -> AssembledEpisode:
    """Build the training sequence(s) of an episode.

    ``continuations[i]`` follows ``turns[i]``: there is one per turn except the last (the episode
    ended there). The turn after a ``TemplateBreak`` must have been sampled from the break's
    ``restart_ids`` (that is what the rollout shows the model), which is why SPLIT starts the
    next sequence with them. A fork (``TemplateBreak.fork``: the ``rerender`` history policy)
    always starts a new sequence and is not a break.

    >>> turns = [SampledTurn((5, 6), (-0.5, -0.25)), SampledTurn((7,), (-1.0,))]
    >>> episode = assemble_episode([1, 2], turns, [Extension((9,))])
    >>> seq = episode.sequences[0]
    >>> seq.input_ids, seq.loss_mask, seq.logprobs
    ((1, 2, 5, 6, 9, 7), (0, 0, 1, 1, 0, 1), (0.0, 0.0, -0.5, -0.25, 0.0, -1.0))
    """
    if not turns:
        raise ValueError("an episode has at least one turn")
    if len(continuations) != len(turns) - 1:
        raise ValueError(
            f"{len(turns)} turns need {len(turns) - 1} continuations, got {len(continuations)}"
        )
    builder = _Builder(prompt_ids)
    sequences: list[TrainingSequence] = []
    breaks: list[str] = []
    for i, turn in enumerate(turns):
        builder.sampled(turn)
        if i == len(continuations):
            break
        nxt = continuations[i]
        if isinstance(nxt, Extension):
            builder.inserted(nxt.ids)
            continue
        if not nxt.fork:
            breaks.append(f"after turn {i}: {nxt.reason}")
        if on_break is BreakPolicy.END and not nxt.fork:
            return AssembledEpisode((builder.done(),), tuple(breaks), i + 1)
        sequences.append(builder.done())
        builder = _Builder(nxt.restart_ids)
    sequences.append(builder.done())
    return AssembledEpisode(tuple(sequences), tuple(breaks), len(turns))


def _render(
    tokenizer: ChatTokenizer,
    messages: Sequence[Mapping[str, str]],
    generation_prompt: bool,
    tools: Sequence[Mapping[str, object]] | None,
) -> str:
    kwargs: dict[str, object] = {"tokenize": False, "add_generation_prompt": generation_prompt}
    if tools:
        kwargs["tools"] = list(tools)
    text = tokenizer.apply_chat_template(list(messages), **kwargs)
    if not isinstance(text, str):
        raise TypeError(f"apply_chat_template(tokenize=False) returned {type(text).__name__}")
    return text


def render_continuation(
    tokenizer: ChatTokenizer,
    history: Sequence[Mapping[str, str]],
    turn_ids: Sequence[int],
    reply: Sequence[Mapping[str, str]],
    *,
    tools: Sequence[Mapping[str, object]] | None = None,
) -> Continuation:
    """Return the ids the environment's ``reply`` adds after a sampled turn, or why there are none.

    ``history`` is every message up to and including the assistant turn whose sampled ids are
    ``turn_ids`` (its content is that turn's text without the end-of-turn token). Three checks,
    each a ``TemplateBreak`` when it fails: the template's rendering of the history extended by
    the reply starts with its rendering of the history; the turn's text appears at the end of
    the latter, followed only by the template's end-of-turn text, of which the engine may have
    sampled a prefix (the EOS token); tokenized on its own, the inserted text gives the same ids
    as at the end of the whole rendering (no token merges across the boundary).
    """
    extended = [*history, *reply]
    # Every content but the assistant's turns is plain text (``grpo_train.episodes.plain_text``).
    after_segments = chat_segments(
        lambda ms: _render(tokenizer, ms, True, tools),
        tokenizer,
        extended,
        [m.get("role") != "assistant" for m in extended],
    )
    after = join(after_segments)
    restart = tuple(encode_segments(tokenizer, after_segments))
    if not history or history[-1].get("role") != "assistant":
        raise ValueError("history must end with the assistant turn that was sampled")
    before = _render(tokenizer, history, False, tools)
    if not after.startswith(before):
        at = next((i for i, (a, b) in enumerate(zip(before, after)) if a != b), len(after))
        return TemplateBreak(
            f"the template re-renders earlier history differently (from character {at}: "
            f"{before[at : at + 40]!r} became {after[at : at + 40]!r})",
            restart,
        )
    content = history[-1]["content"]
    # Where the turn's content ends in the rendering: found with a private-use marker appended
    # to it, so an empty turn or a content that also occurs earlier in the history is no trap.
    marker = "\ue000"
    probe = _render(
        tokenizer, [*history[:-1], {**history[-1], "content": content + marker}], False, tools
    )
    cut = probe.rfind(marker)
    closing = probe[cut + len(marker) :] if cut >= 0 else ""
    if cut < 0 or not before.endswith(content + closing):
        return TemplateBreak("the template changes the assistant turn's content", restart)
    sampled_text = tokenizer.decode(list(turn_ids), skip_special_tokens=False)
    sampled_tail = sampled_text[len(content) :] if sampled_text.startswith(content) else None
    if sampled_tail is None or not closing.startswith(sampled_tail):
        return TemplateBreak(
            "the sampled turn does not end as the template closes it "
            f"(sampled tail {sampled_text[len(content) :][:40]!r}, template {closing[:40]!r})",
            restart,
        )
    # closing[len(sampled_tail):] + after[len(before):], the closing being the end of ``before``
    cut = len(before) - len(closing) + len(sampled_tail)
    inserted = tuple(encode_segments(tokenizer, drop_chars(after_segments, cut)))
    if inserted and restart[-len(inserted) :] != inserted:
        return TemplateBreak("the inserted text tokenizes differently in context", restart)
    return Extension(inserted)


__all__ = [
    "AssembledEpisode",
    "BreakPolicy",
    "ChatTokenizer",
    "Continuation",
    "Extension",
    "SampledTurn",
    "TemplateBreak",
    "TrainingSequence",
    "assemble_episode",
    "render_continuation",
]
