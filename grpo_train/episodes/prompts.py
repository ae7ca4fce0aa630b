"""How a sample becomes prompt tokens: the one place, shared by training and ``grpo eval``.

A model is scored on the prompt it was trained on only if both sides render it the same way, so
the trainer and the evaluation runner both call ``encode_prompt`` with the run's
``PromptFormat``:

- a chat model: its tokenizer's chat template, or one given with ``chat_template`` (a Jinja file
  or the template text), with ``chat_template_kwargs`` (e.g. Qwen3's ``enable_thinking``) and an
  optional ``system_prompt``; the rendered text is tokenized without adding special tokens (the
  template writes them);
- a model without a chat template (a base model), or ``chat_template: plain``: the messages'
  text joined by blank lines, put into ``prompt_template`` (``{prompt}``), tokenized with the
  tokenizer's usual special tokens (BOS).

Over-long prompts keep their last tokens: the question and the assistant header the model must
continue from (TRL truncates on the left too).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpo_envs.types import Sample
from grpo_train.episodes.plain_text import Segment, chat_segments, encode_segments, join

logger = logging.getLogger("grpo_train")

PLAIN = "plain"
"""``chat_template`` value that forces the plain-text format even for a chat model."""


class PromptFormatError(ValueError):
    """The prompt format cannot be used (a missing template file, a broken template)."""


@dataclass(frozen=True)
class PromptFormat:
    """How prompts are rendered; the defaults are the tokenizer's chat template, as is."""

    chat_template: str = ""
    """Empty: the tokenizer's; ``plain``: none; otherwise a Jinja file path or template text."""
    chat_template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    """Extra variables for the chat template (``enable_thinking``...)."""
    system_prompt: str = ""
    """A system message put first (replacing the sample's own system message, if any)."""
    prompt_template: str = "{prompt}"
    """Plain-text format: ``{prompt}`` is replaced by the messages' text."""

    def __post_init__(self) -> None:
        if "{prompt}" not in self.prompt_template:
            raise PromptFormatError(
                f"prompt_template {self.prompt_template!r} has no {{prompt}} placeholder; "
                "e.g. 'Question: {prompt}\\nAnswer:'"
            )

    def template_text(self) -> str | None:
        """Return the chat template replacing the tokenizer's (None: keep the tokenizer's)."""
        given = self.chat_template.strip()
        if not given or given == PLAIN:
            return None
        if "{{" in given or "{%" in given:  # the template itself
            return self.chat_template
        path = Path(given).expanduser()
        try:
            return path.read_text()
        except OSError as err:
            raise PromptFormatError(
                f"chat_template: cannot read {given!r} ({err.strerror}); give a Jinja file, the "
                "template text, 'plain', or leave it empty for the tokenizer's"
            ) from None

    def describe(self, tokenizer: object) -> dict[str, object]:
        """Return what summaries record: the template used, its sha256, the other settings."""
        template = None if self.chat_template.strip() == PLAIN else self.template_text()
        if template is None and self.chat_template.strip() != PLAIN:
            own = getattr(tokenizer, "chat_template", None)
            template = own if isinstance(own, str) and own else None
        return {
            "chat_template": template,
            "sha256": hashlib.sha256(template.encode()).hexdigest() if template else None,
            "chat_template_kwargs": dict(self.chat_template_kwargs),
            "system_prompt": self.system_prompt,
            "prompt_template": None if template else self.prompt_template,
        }

    def messages(self, sample: Sample) -> list[dict[str, str]]:
        """Return the sample's messages with ``system_prompt`` applied."""
        messages = sample.messages
        if self.system_prompt:
            rest = [m for m in messages if m["role"] != "system"]
            messages = [{"role": "system", "content": self.system_prompt}, *rest]
        return messages

    def render(self, tokenizer: Any, sample: Sample) -> tuple[list[Segment], bool]:
        """Return the prompt as segments and whether a chat template made it.

        Every message's content (the dataset's question, its system text, the run's system
        prompt) is data: plain text, never a control token (``grpo_train.episodes.plain_text``).
        """
        messages = self.messages(sample)
        template = self.template_text()
        use_chat = self.chat_template.strip() != PLAIN and bool(
            template or getattr(tokenizer, "chat_template", None)
        )
        if not use_chat:
            body = "\n\n".join(m["content"] for m in messages)
            return [Segment(self.prompt_template.replace("{prompt}", body), True)], False
        kwargs: dict[str, Any] = dict(self.chat_template_kwargs)
        if template is not None:
            kwargs["chat_template"] = template

        def render(conversation: list[dict[str, str]]) -> str:
            text = tokenizer.apply_chat_template(
                conversation, tokenize=False, add_generation_prompt=True, **kwargs
            )
            if not isinstance(text, str):
                raise PromptFormatError(
                    f"apply_chat_template returned {type(text).__name__}, expected str"
                )
            return text

        try:
            segments = chat_segments(render, tokenizer, messages, [True] * len(messages))
        except PromptFormatError:
            raise
        except Exception as err:  # jinja errors, a template that rejects a role...
            raise PromptFormatError(
                f"the chat template failed on sample {sample.id!r}: {type(err).__name__}: {err}"
            ) from err
        return segments, True


@dataclass(frozen=True)
class EncodedPrompt:
    """A rendered, tokenized prompt."""

    text: str
    ids: list[int]
    cut: bool
    """True when the prompt was longer than the limit and lost its first tokens."""


def encode_prompt(
    tokenizer: Any,
    sample: Sample,
    fmt: PromptFormat | None = None,
    max_tokens: int | None = None,
) -> EncodedPrompt:
    """Render ``sample`` with ``fmt`` and tokenize it, keeping the last ``max_tokens`` tokens.

    The one encoding of training and ``grpo eval``: the chat template (or the plain-text format
    for base models), the run's system prompt and template kwargs. A cut prompt is warned about.
    """
    segments, chat = (fmt or PromptFormat()).render(tokenizer, sample)
    text = join(segments)
    ids = encode_segments(tokenizer, segments)
    if not chat:  # a chat template writes its own special tokens; plain text gets the BOS
        ids = _with_special_tokens(tokenizer, text, ids)
    if not ids:
        raise PromptFormatError(f"sample {sample.id!r}: the tokenizer produced no prompt tokens")
    if max_tokens is not None and len(ids) > max_tokens:
        logger.warning(
            "prompt %s has %d tokens, over the limit of %d (max_prompt_length): kept its last "
            "tokens",
            sample.id,
            len(ids),
            max_tokens,
        )
        return EncodedPrompt(text, ids[-max_tokens:], True)
    return EncodedPrompt(text, ids, False)


def _with_special_tokens(tokenizer: Any, text: str, ids: list[int]) -> list[int]:
    """Return ``ids`` with the special tokens the tokenizer adds around ``text`` (its BOS).

    They are read off the tokenizer's own encoding of ``text``: what it adds before and after
    the ids it gives without them.
    """
    bare = [int(i) for i in tokenizer(text, add_special_tokens=False)["input_ids"]]
    full = [int(i) for i in tokenizer(text, add_special_tokens=True)["input_ids"]]
    for start in range(len(full) - len(bare) + 1):
        if full[start : start + len(bare)] == bare:
            return [*full[:start], *ids, *full[start + len(bare) :]]
    return ids
