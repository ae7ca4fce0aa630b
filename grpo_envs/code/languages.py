"""The programming languages of code tasks: names, fences, prompts, and the toolchain check.

A task's language is one of the sandbox's (SandboxFusion's names: ``python``, ``cpp``, ``java``,
``nodejs``, ``rust``, ``bash``); Python is the default everywhere, and a Python task's samples,
prompts and extraction are exactly what they were before other languages existed.
"""

from __future__ import annotations

from types import MappingProxyType

PYTHON = "python"
#: The sandbox's language names, in its order (``sandbox.Language``; not imported here: loading
#: data must not import the sandbox).
LANGUAGES = ("python", "cpp", "java", "nodejs", "rust", "bash")
#: How a prompt names each language.
DISPLAY_NAMES = MappingProxyType({
    "python": "Python 3", "cpp": "C++17", "java": "Java 17", "nodejs": "JavaScript (Node.js 20)",
    "rust": "Rust (2021 edition, standard library only)", "bash": "bash",
})  # fmt: skip
#: The fence info string a prompt asks for.
FENCES = MappingProxyType({
    "python": "python", "cpp": "cpp", "java": "java", "nodejs": "javascript", "rust": "rust",
    "bash": "bash",
})  # fmt: skip
#: What a language needs said in the prompt besides its name.
_NOTES = MappingProxyType(
    {
        "java": " Name the class that holds main `public class Main`.",
    }
)


def check_language(name: object) -> str:
    """Return ``name`` if it is a known language (``ValueError`` listing the valid ones).

    >>> check_language("cpp")
    'cpp'
    >>> check_language("c++")
    Traceback (most recent call last):
    ...
    ValueError: unknown language 'c++': valid languages are python, cpp, java, nodejs, rust, bash
    """
    if not isinstance(name, str) or name not in LANGUAGES:
        raise ValueError(f"unknown language {name!r}: valid languages are {', '.join(LANGUAGES)}")
    return name


def require_toolchain(name: str) -> str:
    """Return ``name`` if its toolchain is installed here, else raise the sandbox's clear error.

    ``sandbox.LanguageUnavailableError`` (a ``ValueError``) names the missing program and what to
    install. Python needs nothing beyond the sandbox itself.
    """
    check_language(name)
    if name != PYTHON:
        from sandbox import require_language

        require_language(name)
    return name


def stdio_instruction(language: str) -> str:
    """Return the default prompt of a stdin/stdout task in ``language`` (with ``{statement}``).

    >>> "```cpp code block" in stdio_instruction("cpp")
    True
    """
    return (
        f"Solve the following problem in {DISPLAY_NAMES[language]}. Read the input from standard "
        "input and write the answer to standard output.\n\n{statement}\n\n"
        f"Reply with your complete program in a single ```{FENCES[language]} code block."
        f"{_NOTES.get(language, '')}"
    )


def reference_fence(code: str, language: str) -> str:
    """Return a reference solution as the completion a model would write (a fenced block)."""
    return f"```{FENCES[language]}\n{code}\n```"
