r"""The ids an environment's reply inserts into an episode, from the reply alone.

A multi-turn episode trains on the ids the engine sampled, exactly, and the ids the environment's
replies insert between turns (loss mask 0). Rendering the whole history again at every turn and
requiring the old rendering to be a prefix of the new one fails on the templates most runs start
from: Qwen3's drops earlier ``<think>`` blocks and the empty ``<think>\n\n</think>\n\n`` block
of the last assistant turn once another message follows; DeepSeek-R1 distills strip thinking
from earlier turns; Mistral's moves the system message to the last user turn.

``ReplyRenderer`` renders a reply as the suffix of a fixed anchor conversation instead (the
"continuous token" technique of verl's ``render_delta_token_id``, TRL's ``_get_tool_suffix_ids``
and SkyRL's ``get_obs_ids_from_obs``): ``[user, assistant MARK] + reply`` with the generation
prompt, cut right after the anchor assistant's content ``MARK``. What follows the cut is the
template's closing of an assistant turn (``<|im_end|>\n``, ``<end_of_turn>\n``, ``</s>``...),
the reply's messages and the generation prompt, rendered with the run's template and
``chat_template_kwargs`` (``enable_thinking``). No earlier turn is re-rendered, so nothing the
template does to earlier turns can break the episode. The closing is cut at the template's turn
terminator: when the engine's last sampled token is the terminator's start (the stop token it
sampled: ``<|im_end|>``, Gemma's ``<end_of_turn>``, Llama's ``<|eot_id|>``, not necessarily
``eos_token_id``), it is not inserted again; the rest of the closing (the ``\n`` after
``<|im_end|>``), or all of it after a turn cut by its token budget, is inserted with mask 0.

The anchors alternate roles (user, assistant, reply): templates that require alternating roles
(Mistral, Gemma) raise on ``[user, user]``. A template without a ``tool`` role (it raises, or
drops the message: Gemma, Phi-4) gets tool results as one user message, found once, at start-up
(``check_template``), and said in the renderer's ``describe``.

``HistoryPolicy`` says what the model is shown at the next turn: ``KEEP`` its own sampled tokens
plus the inserted ids (one training sequence per episode), or ``RERENDER`` the template's
rendering of the whole history; where that is not the kept ids, a new training sequence starts
from it (``grpo_train.episodes.tokens.TemplateBreak`` with ``fork=True``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from grpo_train.episodes.plain_text import (
    Segment,
    chat_segments,
    drop_chars,
    encode_segments,
    join,
)

logger = logging.getLogger(__name__)

#: The anchor assistant turn's content: a private-use character no template writes on its own.
MARK = "\ue000"
#: The anchor user turn's content.
ANCHOR_USER = "\ue001"


class HistoryPolicy(StrEnum):
    """What the model conditions on at a later turn of an episode."""

    KEEP = "keep"
    """Its own sampled tokens, then the reply's inserted ids: one training sequence."""
    RERENDER = "rerender"
    """The template's rendering of the whole history; a new training sequence where it differs."""


class TemplateRenderer(Protocol):
    """What ``ReplyRenderer`` uses: the run's template applied with its kwargs, and the codec."""

    def apply_chat_template(self, conversation: object, **kwargs: object) -> object:
        """Render messages with the run's template and ``chat_template_kwargs``."""
        ...

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]:
        """Text -> ids (no special tokens added)."""
        ...

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = ...) -> str:
        """Ids -> text (special tokens kept)."""
        ...


class TemplateError(ValueError):
    """The chat template cannot render an environment's reply; names the template and why."""


@dataclass(frozen=True)
class ReplyRenderer:
    """Renders an environment's reply as the ids it inserts after a sampled turn.

    ``template``: the template's name for messages (a file name, or the tokenizer's).
    ``tool_role``: ``"tool"``, or ``"user"`` for a template without a tool role (tool results
    are then one user message). ``tools``: tool schemas (``apply_chat_template(tools=)``).
    """

    codec: TemplateRenderer
    template: str
    tool_role: str = "tool"
    tools: tuple[Mapping[str, object], ...] | None = None
    extra: Mapping[str, object] = field(default_factory=dict)
    """Extra ``apply_chat_template`` kwargs of this renderer (the start-up check's thinking)."""

    def messages(self, reply: Sequence[Mapping[str, str]]) -> list[dict[str, str]]:
        r"""Return the reply as the template is given it.

        Tool results become user messages when the template has no tool role, and consecutive
        user messages are then joined (such templates require alternating roles).

        >>> class _T:  # the codec is not used here
        ...     pass
        >>> ReplyRenderer(_T(), "t", tool_role="user").messages([{"role": "tool", "content": "1"},
        ...     {"role": "tool", "content": "2"}, {"role": "user", "content": "Go on."}])
        [{'role': 'user', 'content': '1\n\n2\n\nGo on.'}]
        """
        out: list[dict[str, str]] = []
        for m in reply:
            role, content = str(m["role"]), str(m["content"])
            if self.tool_role != "tool":
                role = self.tool_role if role == "tool" else role
                if out and out[-1]["role"] == role == self.tool_role:
                    out[-1] = {"role": role, "content": out[-1]["content"] + "\n\n" + content}
                    continue
            out.append({"role": role, "content": content})
        return out

    def render(self, messages: Sequence[Mapping[str, str]], generation_prompt: bool) -> str:
        """Render ``messages`` with the run's template (text)."""
        kwargs: dict[str, object] = {
            "tokenize": False,
            "add_generation_prompt": generation_prompt,
            **self.extra,
        }
        if self.tools:
            kwargs["tools"] = [dict(t) for t in self.tools]
        try:
            text = self.codec.apply_chat_template([dict(m) for m in messages], **kwargs)
        except Exception as err:  # jinja2's TemplateError, raise_exception's message...
            roles = ", ".join(str(m.get("role")) for m in messages)
            raise TemplateError(
                f"chat template {self.template}: rendering [{roles}] failed: "
                f"{type(err).__name__}: {err}"
            ) from err
        if not isinstance(text, str):
            raise TypeError(f"apply_chat_template(tokenize=False) returned {type(text).__name__}")
        return text

    def suffix(self, reply: Sequence[Mapping[str, str]]) -> str:
        """Return the text after an assistant turn's content: closing, reply, generation prompt."""
        return join(self.suffix_segments(reply))

    def suffix_segments(self, reply: Sequence[Mapping[str, str]]) -> list[Segment]:
        """Return ``suffix`` as the template's text and the reply's contents (plain text)."""
        messages = self.messages(reply)
        anchor = [{"role": "user", "content": ANCHOR_USER}, {"role": "assistant", "content": MARK}]
        conversation = [*anchor, *messages]
        segments = chat_segments(
            lambda ms: self.render(ms, True),
            self.codec,
            conversation,
            [i >= len(anchor) for i in range(len(conversation))],
        )
        text = join(segments)
        at = text.rfind(MARK)
        if at < 0:
            raise TemplateError(
                f"chat template {self.template}: an assistant turn's content is not in its "
                "rendering when a reply follows (the template drops or rewrites it)"
            )
        rest = drop_chars(segments, at + len(MARK))
        suffix = join(rest)
        for m in messages:
            if not _shows(m["content"], suffix):
                raise TemplateError(
                    f"chat template {self.template}: a {m['role']!r} message's content is not in "
                    "its rendering (the template drops that role)"
                )
        return rest

    def inserted(
        self, reply: Sequence[Mapping[str, str]], turn_ids: Sequence[int], stopped: bool
    ) -> tuple[int, ...]:
        """Return the ids ``reply`` inserts after a sampled turn (mask 0).

        ``turn_ids``: the ids the engine sampled; ``stopped``: whether it ended on a stop token
        (``finish_reason == "stop"``). That token's text, when the template's closing starts
        with it, is the terminator the engine sampled: the closing's rest follows it. Otherwise
        (a turn cut by its budget, or another stop token) the whole closing is inserted. The
        reply's contents are plain text (``grpo_train.episodes.plain_text``): whatever they hold,
        the only control tokens inserted are the template's own.
        """
        segments = self.suffix_segments(reply)
        if stopped and turn_ids and segments and not segments[0].data:
            last = self.codec.decode([turn_ids[-1]], skip_special_tokens=False)
            if last and segments[0].text.startswith(last):
                segments = drop_chars(segments, len(last))
        return tuple(encode_segments(self.codec, segments))

    def render_ids(
        self, messages: Sequence[Mapping[str, str]], generation_prompt: bool = True
    ) -> tuple[int, ...]:
        """Return the ids of a whole conversation as the template renders it (``RERENDER``).

        Every content but the assistant's turns is plain text (``grpo_train.episodes.plain_text``).
        """
        fixed = self.messages(messages)  # tool results as the template takes them
        segments = chat_segments(
            lambda ms: self.render(ms, generation_prompt),
            self.codec,
            fixed,
            [m["role"] != "assistant" for m in fixed],
        )
        return tuple(encode_segments(self.codec, segments))

    def describe(self) -> str:
        """One line for the run log: the template and how replies are rendered."""
        tools = "tool results as tool messages"
        if self.tool_role != "tool":
            tools = f"tool results as {self.tool_role} messages (the template has no tool role)"
        return f"chat template {self.template}: replies rendered after an anchor turn; {tools}"


def _shows(content: str, text: str) -> bool:
    r"""Return whether ``text`` holds ``content`` as written, trimmed, or JSON-encoded.

    Templates trim messages (Llama, Gemma) or write tool results as JSON strings (Llama's
    ``ipython`` turn: quotes and newlines escaped).

    >>> _shows('say "hi"\n', 'x"say \\"hi\\"\\n"y')
    True
    >>> _shows("dropped", "something else")
    False
    """
    core = content.strip()
    if not core or core in text:
        return True
    return any(
        json.dumps(form, ensure_ascii=ascii)[1:-1] in text
        for form in (content, core)
        for ascii in (False, True)
    )


#: The start-up check's episodes: a user-feedback one and a tool one (two results in a row).
_FEEDBACK = ({"role": "user", "content": "12 is not right: it is too low."},)
_TOOLS = (
    {"role": "tool", "content": "4"},
    {"role": "tool", "content": "[error] NameError: name 'x' is not defined"},
)


def _tool_role(renderer: ReplyRenderer) -> str:
    """``"tool"`` when the template renders tool messages, else ``"user"``."""
    try:
        renderer.suffix(_TOOLS)
    except TemplateError:
        return "user"
    return "tool"


def check_template(
    codec: TemplateRenderer,
    template: str,
    *,
    tools: Sequence[Mapping[str, object]] | None = None,
    prompt: Sequence[Mapping[str, str]] = ({"role": "user", "content": "What is 7 + 5?"},),
) -> ReplyRenderer:
    """Return the renderer of a template after checking it extends short episodes.

    Renders a 3-turn user-feedback episode and a 3-turn tool episode (two tool results in a
    row), with thinking on and off (``enable_thinking``; templates without it ignore it), and
    checks each: the reply's content is in its inserted text, the sampled ids stay as they were,
    and the inserted ids end with the generation prompt the template writes. Raises
    ``TemplateError`` (naming the template and what failed) for a template the renderer cannot
    extend, so a run refuses it before any generation.
    """
    tool_tuple = tuple(tools) if tools else None
    base = ReplyRenderer(codec, template, tools=tool_tuple)
    role = _tool_role(base)
    renderer = ReplyRenderer(codec, template, role, tool_tuple)
    for thinking in (True, False):
        probe = ReplyRenderer(codec, template, role, tool_tuple, {"enable_thinking": thinking})
        with_gen, without = probe.render(list(prompt), True), probe.render(list(prompt), False)
        gen = with_gen[len(without) :] if with_gen.startswith(without) else None
        # After a tool result some templates let the assistant continue without a new header
        # (DeepSeek-R1's): only a user reply must end with the generation prompt.
        for name, reply, end in (("user-feedback", _FEEDBACK, gen), ("tool", _TOOLS, None)):
            _check_episode(probe, [dict(m) for m in prompt], reply, name, thinking, end)
    return renderer


def _check_episode(
    renderer: ReplyRenderer,
    prompt: list[dict[str, str]],
    reply: Sequence[Mapping[str, str]],
    name: str,
    thinking: bool,
    gen: str | None,
) -> None:
    where = f"chat template {renderer.template}: the {name} episode (thinking {thinking})"
    codec = renderer.codec
    ids = list(renderer.render_ids(prompt))
    for turn in range(3):
        sampled = codec.encode(f"The answer is {turn + 11}.", add_special_tokens=False)
        ids.extend(sampled)
        if turn == 2:
            break
        try:
            inserted = renderer.inserted(reply, sampled, stopped=False)
        except TemplateError as err:
            raise TemplateError(f"{where}, turn {turn + 1}: {err}") from None
        text = codec.decode(list(inserted), skip_special_tokens=False)
        for m in renderer.messages(reply):
            if not _shows(m["content"], text):
                raise TemplateError(
                    f"{where}, turn {turn + 1}: the reply's {m['role']!r} content is not in "
                    f"the inserted ids (they decode to {text[:120]!r})"
                )
        if gen is not None and not text.endswith(gen):
            raise TemplateError(
                f"{where}, turn {turn + 1}: the inserted ids do not end with the generation "
                f"prompt {gen!r} (they decode to {text[-120:]!r})"
            )
        ids.extend(inserted)
    if ids[-len(sampled) :] != sampled:
        raise TemplateError(f"{where}: the sampled ids were not kept")


__all__ = [
    "ANCHOR_USER",
    "MARK",
    "HistoryPolicy",
    "ReplyRenderer",
    "TemplateError",
    "TemplateRenderer",
    "check_template",
]
