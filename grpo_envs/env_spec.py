"""``EnvSpec``: how to build one registered environment (its id, entry point and arguments).

A module of its own, below both ``base`` and ``registration``: an ``Environment`` records the
spec that built it (``env.spec``) and the registry builds environments from specs, so the spec
may name neither. Its factory is typed as returning ``object`` for that reason; ``registration``
(which knows ``Environment``) types what it registers and what ``make`` returns.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass, replace

#: ``namespace/name-vN``: namespace and name are words (letters, digits, ``_ . -``), N an integer.
ID_PATTERN = re.compile(r"^(?P<namespace>[\w.-]+)/(?P<name>[\w.-]+?)-v(?P<version>\d+)$")

#: A class or function that builds an environment from keyword arguments.
SpecFactory = Callable[..., object]


class RegistryError(KeyError):
    """An unknown, malformed or duplicate environment id (a KeyError with a readable message)."""

    def __str__(self) -> str:  # KeyError quotes its message; print it plainly instead.
        return str(self.args[0]) if self.args else ""


def parse_env_id(env_id: str) -> tuple[str, str, int]:
    """Split ``namespace/name-vN`` into its three parts; RegistryError when malformed.

    >>> parse_env_id("math/gsm8k-v0")
    ('math', 'gsm8k', 0)
    """
    match = ID_PATTERN.match(env_id)
    if match is None:
        raise RegistryError(
            f"malformed environment id {env_id!r}: expected 'namespace/name-vN', "
            "e.g. 'math/gsm8k-v0'"
        )
    return match["namespace"], match["name"], int(match["version"])


@dataclass(frozen=True)
class EnvSpec:
    """How to build one registered environment.

    Attributes:
        id: ``namespace/name-vN``.
        entry_point: ``"module:attr"`` (imported on ``make``) or the factory itself.
        kwargs: default keyword arguments for the factory; ``make(id, **overrides)`` updates them.
            Stored as sorted pairs so that the spec stays hashable and immutable.
        description: one line for ``grpo envs list``.
    """

    id: str
    entry_point: str | SpecFactory
    kwargs: tuple[tuple[str, object], ...] = ()
    description: str = ""

    @property
    def namespace(self) -> str:
        """The part before ``/``."""
        return parse_env_id(self.id)[0]

    @property
    def name(self) -> str:
        """The part between ``/`` and ``-vN``."""
        return parse_env_id(self.id)[1]

    @property
    def version(self) -> int:
        """The ``N`` of ``-vN``."""
        return parse_env_id(self.id)[2]

    @property
    def defaults(self) -> dict[str, object]:
        """The default keyword arguments as a fresh dict."""
        return dict(self.kwargs)

    @property
    def module(self) -> str | None:
        """The module of a string entry point (None for a callable one)."""
        return self.entry_point.split(":", 1)[0] if isinstance(self.entry_point, str) else None

    def with_kwargs(self, **overrides: object) -> EnvSpec:
        """Return a copy whose defaults are updated with ``overrides``."""
        merged = {**self.defaults, **overrides}
        return replace(self, kwargs=tuple(sorted(merged.items())))

    def load(self) -> SpecFactory:
        """Import and return the factory (class or function) behind ``entry_point``."""
        if not isinstance(self.entry_point, str):
            return self.entry_point
        module_name, _, attr = self.entry_point.partition(":")
        if not module_name or not attr:
            raise RegistryError(
                f"{self.id}: entry point {self.entry_point!r} is not of the form 'module:attr'"
            )
        module = importlib.import_module(module_name)
        try:
            factory = getattr(module, attr)
        except AttributeError as exc:
            raise RegistryError(
                f"{self.id}: module {module_name!r} has no attribute {attr!r}"
            ) from exc
        return factory  # type: ignore[no-any-return]
