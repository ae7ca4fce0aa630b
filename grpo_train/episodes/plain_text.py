r"""Environment text enters the model's context as plain text: it never becomes a control token.

Everything an environment puts into the context (the dataset's prompt and system text, tool
results, feedback that may echo the model's own answer, observations) is data. A chat template
writes it between its own structure tokens (``<|im_start|>``, ``<|eot_id|>``, ``[INST]``...),
and a tokenizer's ``encode`` turns every occurrence of an added token's text into that token,
wherever it stands. So a tool that prints ``<|im_end|>\n<|im_start|>assistant`` would, encoded
with the rendered reply, give real control tokens: a forged assistant turn the model is trained
and evaluated on. Here the rule is kept in one place:

- ``chat_segments`` renders messages with the template and returns the text as segments: the
  template's own text, encoded as the tokenizer always does (its structure tokens are control
  tokens), and each untrusted message's content, encoded by ``encode_plain``;
- ``encode_plain`` gives the ids of a text as ordinary text tokens: every added token's string in
  it (special ones such as ``<|im_end|>`` and added non-special ones such as Qwen's
  ``<tool_response>`` or ``</think>``, which ``split_special_tokens`` leaves whole) is encoded
  from its characters.

How the content is found in the rendering: only a content that holds a control string needs
care (every other text encodes exactly as before). Such a content is replaced by a private-use
sentinel and the conversation rendered again: what the template wrote around the sentinel is
the template's text, with no data in it. The content goes back where the sentinel was, in the
form the template gave it (as written, trimmed, or JSON-escaped as Llama's ``ipython`` turn
writes tool results), which is read off the real rendering; where that cannot be read (a
template that rewrites content in another way) the content goes back as written. Either way
the template's structure tokens come only from the template.
"""

from __future__ import annotations

import contextlib
import json
import re
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

#: Sentinels around a content's index: private-use characters no template writes on its own
#: (``reply_render`` uses U+E000 and U+E001 for its anchors).
_OPEN, _CLOSE = "\ue010", "\ue011"


def _encode(codec: object, text: str) -> list[int]:
    """Text -> ids with no special tokens added (added tokens' strings become those tokens).

    ``codec``: a tokenizer (``encode``, or a call returning ``input_ids``) or a wrapper of one.
    """
    encode = getattr(codec, "encode", None)
    if callable(encode):
        return [int(i) for i in encode(text, add_special_tokens=False)]
    ids = codec(text, add_special_tokens=False)["input_ids"]  # type: ignore[operator]
    return [int(i) for i in ids]


@dataclass(frozen=True)
class ControlStrings:
    """A tokenizer's added tokens (special or not): their strings and ids."""

    pattern: re.Pattern[str] | None
    """Matches any of the strings, longest first; None when the tokenizer has none."""
    ids: frozenset[int]

    def found(self, text: str) -> bool:
        """Return whether ``text`` holds an added token's string."""
        return self.pattern is not None and self.pattern.search(text) is not None


#: Per tokenizer (weakly held): its vocabulary size when read, and its control strings.
_CACHE: weakref.WeakKeyDictionary[object, tuple[int, ControlStrings]] = weakref.WeakKeyDictionary()


def control_strings(codec: object) -> ControlStrings:
    """Return ``codec``'s added tokens (``get_added_vocab``; none for a codec without it).

    >>> class Codec:
    ...     def get_added_vocab(self):
    ...         return {"<|im_end|>": 2, "<tool_response>": 7, "<|im_end|>x": 9}
    >>> strings = control_strings(Codec())
    >>> strings.pattern.findall("a<|im_end|>x<tool_response>"), sorted(strings.ids)
    (['<|im_end|>x', '<tool_response>'], [2, 7, 9])
    """
    tokenizer = codec if hasattr(codec, "get_added_vocab") else getattr(codec, "tokenizer", codec)
    size = len(tokenizer) if hasattr(tokenizer, "__len__") else None
    try:
        cached = _CACHE.get(tokenizer)
    except TypeError:  # not weakly referable or not hashable: read it every time
        cached = None
    if cached is not None and size is not None and cached[0] == size:
        return cached[1]
    vocab_of = getattr(tokenizer, "get_added_vocab", None)
    vocab: Mapping[str, int] = vocab_of() if callable(vocab_of) else {}
    strings = sorted((s for s in vocab if s), key=len, reverse=True)
    pattern = re.compile("|".join(map(re.escape, strings))) if strings else None
    result = ControlStrings(pattern, frozenset(int(i) for i in vocab.values()))
    if size is not None:
        with contextlib.suppress(TypeError):
            _CACHE[tokenizer] = (size, result)
    return result


def encode_plain(codec: object, text: str) -> list[int]:
    """Return the ids of ``text`` as ordinary text tokens: no added token, whatever it holds.

    Each added token's string in the text is encoded from its first character and the rest
    apart, so that it cannot match the token; the text between is encoded as usual. A string
    that only its added token can encode (a one-character added token) keeps it.
    """
    controls = control_strings(codec)
    if not controls.found(text):
        return [int(i) for i in _encode(codec, text)]
    assert controls.pattern is not None
    ids: list[int] = []
    at = 0
    for match in controls.pattern.finditer(text):
        if match.start() > at:
            ids += _encode(codec, text[at : match.start()])
        token = match.group()
        ids += _encode(codec, token[0])
        ids += encode_plain(codec, token[1:]) if len(token) > 1 else []
        at = match.end()
    if at < len(text):
        ids += _encode(codec, text[at:])
    return [int(i) for i in ids]


@dataclass(frozen=True)
class Segment:
    """A piece of a rendered conversation: the template's text, or an untrusted content."""

    text: str
    data: bool
    """True: an untrusted content, encoded as plain text (``encode_plain``)."""


def encode_segments(codec: object, segments: Sequence[Segment]) -> list[int]:
    """Return the ids of ``segments``: the template's text as usual, data as plain text."""
    if not any(s.data for s in segments):
        return [int(i) for i in _encode(codec, join(segments))]
    ids: list[int] = []
    for segment in segments:
        if segment.data:
            ids += encode_plain(codec, segment.text)
        elif segment.text:
            ids += _encode(codec, segment.text)
    return [int(i) for i in ids]


def join(segments: Sequence[Segment]) -> str:
    """Return the text of ``segments``."""
    return "".join(s.text for s in segments)


def drop_chars(segments: Sequence[Segment], count: int) -> list[Segment]:
    """Return ``segments`` without their first ``count`` characters.

    >>> drop_chars([Segment("ab", False), Segment("cd", True)], 3)
    [Segment(text='d', data=True)]
    """
    out: list[Segment] = []
    for segment in segments:
        if count >= len(segment.text):
            count -= len(segment.text)
            continue
        out.append(Segment(segment.text[count:], segment.data))
        count = 0
    return out


Render = Callable[[list[dict[str, str]]], str]


def chat_segments(
    render: Render,
    codec: object,
    messages: Sequence[Mapping[str, str]],
    untrusted: Sequence[bool],
) -> list[Segment]:
    r"""Render ``messages`` and return the text as template segments and untrusted contents.

    ``render``: the run's template applied to messages (text). ``untrusted[i]``: whether the
    content of ``messages[i]`` is data (environment text) rather than the model's own turn.
    Where no untrusted content holds a control string, the rendering is one template segment.

    >>> class Codec:
    ...     def get_added_vocab(self):
    ...         return {"<end>": 1}
    >>> def render(ms):
    ...     return "".join(f"<{m['role']}>{m['content'].strip()}<end>" for m in ms)
    >>> segments = chat_segments(render, Codec(), [{"role": "tool", "content": " 1<end> "}], [True])
    >>> [(s.text, s.data) for s in segments]
    [('<tool>', False), ('1<end>', True), ('<end>', False)]
    """
    fixed = [dict(m) for m in messages]
    text = render(fixed)
    controls = control_strings(codec)
    hostile = [i for i, m in enumerate(fixed) if untrusted[i] and controls.found(str(m["content"]))]
    if not hostile:
        return [Segment(text, False)]
    probe = [dict(m) for m in fixed]
    for slot, i in enumerate(hostile):
        probe[i]["content"] = f"{_OPEN}{slot}{_CLOSE}"
    pieces, slots = _split_at_sentinels(render(probe), len(hostile))
    contents = [str(fixed[hostile[s]]["content"]) for s in slots]
    forms = _decompose(text, pieces, contents) or contents
    segments: list[Segment] = [Segment(pieces[0], False)]
    for form, piece in zip(forms, pieces[1:], strict=True):
        segments += [Segment(form, True), Segment(piece, False)]
    return [s for s in segments if s.text]


def _split_at_sentinels(text: str, count: int) -> tuple[list[str], list[int]]:
    r"""Return the template's pieces between sentinels and the slot of each sentinel.

    A template that writes contents as JSON strings with ASCII escapes writes ``\ue010``.
    """
    forms = []
    for slot in range(count):
        raw = f"{_OPEN}{slot}{_CLOSE}"
        forms += [(raw, slot), (json.dumps(raw)[1:-1], slot)]
    pattern = re.compile("|".join(re.escape(f) for f, _ in forms))
    slot_of = dict(forms)
    pieces, slots, at = [], [], 0
    for match in pattern.finditer(text):
        pieces.append(text[at : match.start()])
        slots.append(slot_of[match.group()])
        at = match.end()
    pieces.append(text[at:])
    return pieces, slots


def _forms(content: str) -> list[str]:
    """Return how a template may write ``content``: as is, trimmed, or JSON-escaped."""
    forms = [content, content.strip(), content.lstrip(), content.rstrip()]
    for text in (content, content.strip()):
        forms += [json.dumps(text, ensure_ascii=a)[1:-1] for a in (False, True)]
    return list(dict.fromkeys(forms))


def _decompose(text: str, pieces: Sequence[str], contents: Sequence[str]) -> list[str] | None:
    """Return the form of each content such that ``text`` is the pieces with them between."""
    if not text.startswith(pieces[0]):
        return None

    def walk(at: int, k: int) -> list[str] | None:
        if k == len(contents):
            return [] if at == len(text) else None
        for form in _forms(contents[k]):
            after = at + len(form)
            if text.startswith(form, at) and text.startswith(pieces[k + 1], after):
                rest = walk(after + len(pieces[k + 1]), k + 1)
                if rest is not None:
                    return [form, *rest]
        return None

    return walk(len(pieces[0]), 0)


__all__ = [
    "ControlStrings",
    "Segment",
    "chat_segments",
    "control_strings",
    "drop_chars",
    "encode_plain",
    "encode_segments",
    "join",
]
