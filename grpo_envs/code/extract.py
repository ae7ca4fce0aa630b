"""Pull a runnable program (Python, or another language's fenced block) out of a completion.

Models answer in three shapes: a fenced Markdown block (often after prose or a ``<think>``
section), bare code, or, for HumanEval-style prompts, the continuation of a function body. The
extractors here are pure functions that return ``None`` when no code that Python can parse is
found; the environments turn that into ``Outcome.UNPARSABLE``.

They never raise and their work is bounded on any text (NUL bytes, invalid Unicode, deep nesting,
huge literals, megabytes of junk): model text never turns into a scoring failure here.
"""

from __future__ import annotations

import ast
import re
import warnings
from dataclasses import dataclass
from enum import StrEnum

#: Fence info strings accepted as Python; an untagged fence counts too (models often omit it).
PYTHON_TAGS = frozenset({"", "python", "python3", "py", "py3", "python 3"})
#: Fence info strings accepted for each other language (``sandbox.Language`` names); an untagged
#: fence counts too. No parser checks these programs here: a compile error is the sandbox's
#: verdict (``compile_error``).
LANGUAGE_TAGS = {
    "python": PYTHON_TAGS,
    "cpp": frozenset({"", "cpp", "c++", "cxx", "cc", "c++17", "c++20", "cpp17", "cpp20"}),
    "java": frozenset({"", "java"}),
    "nodejs": frozenset({"", "javascript", "js", "node", "nodejs", "node.js"}),
    "rust": frozenset({"", "rust", "rs"}),
    "bash": frozenset({"", "bash", "sh", "shell"}),
}

# An opening fence (``` or ~~~, 3 or more), its info string, the body, and the matching close or
# the end of the text (a generation cut off by max_tokens leaves the last block unterminated).
# The fence and the info string are possessive (``*+``): a line of many tildes with no newline
# after it otherwise backtracks through every split of fence and info string (quadratic: 45 s
# for a 40,000-tilde line).
_FENCE_RE = re.compile(
    r"^[ \t]{0,3}(?P<fence>`{3,}+|~{3,}+)[ \t]*+(?P<tag>[^\n`]*+)\n"
    r"(?P<body>.*?)(?:^[ \t]{0,3}(?P=fence)[ \t]*$|\Z)",
    re.DOTALL | re.MULTILINE,
)
_THINK_END = "</think>"
# Lines that can start a program; used to cut prose off bare code.
_CODE_START_RE = re.compile(r"^(def |async def |class |import |from \S+ import |@)")
#: Completions longer than this are not searched line by line for bare code (bounds the work).
MAX_BARE_LINES = 400
#: The most characters the line-by-line search for bare code compiles in all (each candidate is
#: compiled whole, so without a budget 400 lines of junk that fails only at its end cost
#: 400 compilations of the whole text: minutes for a megabyte).
MAX_BARE_SEARCH_CHARS = 2_000_000


class ExtractionMethod(StrEnum):
    """Where the program came from; logged in ``Score.details``."""

    FENCED = "fenced"  # a fenced Markdown block
    BARE = "bare"  # the completion (or a part of it) is code without fences
    CONTINUATION = "continuation"  # HumanEval: prompt + completion continues the function body
    FULL_FUNCTION = "full_function"  # HumanEval: the model rewrote the whole function


@dataclass(frozen=True)
class ExtractedCode:
    """A program that parses, and how it was found."""

    code: str
    method: ExtractionMethod


def parses(code: str) -> bool:
    """Whether ``code`` compiles as a Python module (nothing is executed).

    ``compile`` rather than ``ast.parse``: the parser accepts code the compiler rejects, e.g. a
    ``return`` outside a function (a body-only completion pasted at the top level).
    """
    try:
        # SyntaxWarning (e.g. invalid escape sequences in model code) is not our concern here.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compile(code, "<completion>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError, OverflowError, MemoryError, RecursionError):
        # ValueError: NUL bytes; OverflowError: huge literals; MemoryError / RecursionError:
        # pathologically nested input.
        return False
    return True


def defined_functions(code: str) -> frozenset[str]:
    """Names of the functions defined at the top level of ``code`` (empty if it does not parse)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = ast.parse(code)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return frozenset()
    return frozenset(
        node.name for node in tree.body if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    )


def strip_reasoning(completion: str) -> str:
    """Return the text after the last ``</think>`` (reasoning models put drafts before it)."""
    _, sep, tail = completion.rpartition(_THINK_END)
    return tail if sep else completion


def fenced_blocks(text: str, language: str = "python") -> list[str]:
    """Bodies of the fenced blocks tagged as ``language`` (or untagged), in order of appearance."""
    tags = LANGUAGE_TAGS[language]
    blocks = []
    for match in _FENCE_RE.finditer(text):
        tag = match.group("tag").strip().lower()
        if tag in tags:
            blocks.append(match.group("body"))
    return blocks


def _bare_code(text: str) -> str | None:
    """Return the whole text if it parses, else the largest parsing run of code-like lines."""
    stripped = text.strip("\n")
    if stripped.strip() and parses(stripped):
        return stripped
    lines = stripped.split("\n")
    if len(lines) > MAX_BARE_LINES:
        return None
    budget = MAX_BARE_SEARCH_CHARS
    for start, line in enumerate(lines):
        if not _CODE_START_RE.match(line):
            continue
        # Drop trailing prose one line at a time; the first end that parses wins (largest).
        for end in range(len(lines), start, -1):
            candidate = "\n".join(lines[start:end])
            budget -= len(candidate)
            if budget < 0:
                return None
            if parses(candidate):
                return candidate
        return None  # the first code-looking line starts no parsable program
    return None


def extract_code(
    completion: str, entry_point: str | None = None, language: str = "python"
) -> ExtractedCode | None:
    r"""Extract the program from a completion.

    Rules, in order: text before the last ``</think>`` is ignored; among fenced Python blocks that
    parse, the last one defining ``entry_point`` wins, else the last one; without fenced blocks the
    completion itself (or its largest code-looking part) is used if it parses. ``None`` means no
    parsable code was found.

    Another ``language`` (``cpp``, ``java``, ``nodejs``, ``rust``, ``bash``): the last non-empty
    fenced block tagged as that language (``LANGUAGE_TAGS``; untagged counts too), else
    ``None``: nothing parses these here, and prose is not guessed at.

    >>> extract_code("Here:\n```python\ndef f():\n    return 1\n```\nDone.").code
    'def f():\n    return 1\n'
    >>> extract_code("I don't know.") is None
    True
    >>> extract_code("```c++\nint main() {}\n```", language="cpp").code
    'int main() {}\n'
    >>> extract_code("```python\nprint(1)\n```", language="cpp") is None
    True
    """
    if language != "python":
        if language not in LANGUAGE_TAGS:
            return None
        tagged = [b for b in fenced_blocks(strip_reasoning(completion), language) if b.strip()]
        return ExtractedCode(tagged[-1], ExtractionMethod.FENCED) if tagged else None
    text = strip_reasoning(completion)
    blocks = [b for b in fenced_blocks(text) if b.strip() and parses(b)]
    if blocks:
        if entry_point is not None:
            defining = [b for b in blocks if entry_point in defined_functions(b)]
            if defining:
                return ExtractedCode(defining[-1], ExtractionMethod.FENCED)
        return ExtractedCode(blocks[-1], ExtractionMethod.FENCED)
    if fenced_blocks(text):
        return None  # the model fenced its code and none of it parses: do not guess from prose
    bare = _bare_code(text)
    return ExtractedCode(bare, ExtractionMethod.BARE) if bare is not None else None


def extract_humaneval_program(
    completion: str, prompt_code: str, entry_point: str
) -> ExtractedCode | None:
    """Build the program of a HumanEval-style task: prompt + completion, or a full function.

    ``prompt_code`` is the function signature and docstring the model was asked to complete.
    Rules, in order:

    1. Unfenced text that compiles after the prompt is run as ``prompt + text``, verbatim: the
       original HumanEval protocol (a body continuation), which also covers a bare full function
       (it replaces the stub) and keeps any top-level code the completion adds after the body.
    2. Otherwise, code extracted by ``extract_code`` that defines ``entry_point`` runs after the
       prompt (which keeps its imports and helper functions; the model's definition replaces
       the stub).
    3. Otherwise, a fenced block holding only the indented body continues the prompt.

    ``None`` if nothing parses.
    """
    text = strip_reasoning(completion)
    fences = fenced_blocks(text)
    if not fences and text.strip():
        continued = prompt_code + text
        if parses(continued):
            full = entry_point in defined_functions(text)
            method = ExtractionMethod.FULL_FUNCTION if full else ExtractionMethod.CONTINUATION
            return ExtractedCode(continued, method)
    extracted = extract_code(completion, entry_point)
    if extracted is not None and entry_point in defined_functions(extracted.code):
        program = f"{prompt_code.rstrip()}\n\n\n{extracted.code}"
        if parses(program):
            return ExtractedCode(program, ExtractionMethod.FULL_FUNCTION)
    for block in reversed(fences):
        continued = prompt_code + block
        if block.strip() and parses(continued):
            return ExtractedCode(continued, ExtractionMethod.CONTINUATION)
    return None
