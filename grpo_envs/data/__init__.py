"""Small problem sets shipped with the package (package data), for benchmarks and tests.

``CPP_STDIO``: 22 stdin/stdout problems in this project's stdio shape (``id``, ``language``
``cpp``, ``prompt``, ``tests`` of ``{input, output}``, a reference C++ ``solution``; a few also
carry ``other_solutions`` in Java and Rust). Load it with ``code/stdio-v0``
(``data_files=CPP_STDIO``) or ``code/dataset-v0`` (``path=str(CPP_STDIO), question="prompt",
language_column="language"``).
"""

from __future__ import annotations

from pathlib import Path

CPP_STDIO = Path(__file__).with_name("cpp_stdio.jsonl")

__all__ = ["CPP_STDIO"]
