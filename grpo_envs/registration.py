"""The environment registry: ``register``, ``make``, ``spec``, ``list_envs``.

Modelled on Gymnasium's ``envs/registration.py``: a plain ``dict[str, EnvSpec]``, versioned ids
``namespace/name-vN``, lazy ``"module:attr"`` entry points (so listing environments imports none of
them), and errors that say what *is* registered. Additions:

- ``make("some.module:ns/name-v0")`` imports ``some.module`` first (it registers its environments
  on import), as Gymnasium does;
- installed packages are discovered through the ``grpo_envs`` entry-point group (``load_plugins``).
  A package declares, in its pyproject.toml::

      [project.entry-points.grpo_envs]
      my_envs = "my_package.envs"          # a module that calls grpo_envs.register on import
      # or "my_package.envs:register_all"  # a function that registers

- a *family* (``register_family``) resolves ids like ``rg/leg_counting-v0`` to one entry point
  with ``task="leg_counting"``, so a wrapper over 100+ generated tasks needs no 100 registrations.
"""

from __future__ import annotations

import difflib
import importlib
import os
import sys
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from typing import TYPE_CHECKING, cast

from grpo_envs.env_spec import ID_PATTERN, EnvSpec, RegistryError, parse_env_id

if TYPE_CHECKING:
    from grpo_envs.base import Environment

#: The entry-point group that third-party packages use to register environments. Each entry point
#: is a module (importing it registers) or a callable taking no arguments (calling it registers).
ENTRY_POINT_GROUP = "grpo_envs"

#: What ``register`` takes: a class or function that builds an ``Environment``.
EnvFactory = Callable[..., "Environment"]


@dataclass(frozen=True)
class _Family:
    """Ids ``namespace/<name>-vN`` not registered one by one: ``entry_point(param=name)``."""

    namespace: str
    entry_point: str | EnvFactory
    param: str
    version: int
    kwargs: tuple[tuple[str, object], ...] = field(default=())


#: The registry itself: id -> spec (insertion-ordered, as Gymnasium's).
registry: dict[str, EnvSpec] = {}
_families: dict[str, _Family] = {}
_plugins_loaded = False


def register(
    id: str,
    entry_point: str | EnvFactory,
    *,
    description: str = "",
    **kwargs: object,
) -> EnvSpec:
    """Register an environment under ``id`` (``namespace/name-vN``).

    Args:
        id: the environment id. Registering an id again replaces the old entry with a warning
            (as Gymnasium does: a notebook cell run twice); to keep both, bump the version.
        entry_point: ``"module:attr"`` (imported lazily by ``make``) or a factory callable.
        description: one line shown by ``grpo envs list``.
        **kwargs: default keyword arguments passed to the factory.

    Returns:
        The new ``EnvSpec``.
    """
    parse_env_id(id)
    if id in registry:
        warnings.warn(
            f"overriding environment {id!r} already in the registry (entry point "
            f"{registry[id].entry_point!r}); register a new version (-vN+1) to keep both",
            RuntimeWarning,
            stacklevel=2,
        )
    new = EnvSpec(id, entry_point, tuple(sorted(kwargs.items())), description)
    registry[id] = new
    return new


def register_family(
    namespace: str,
    entry_point: str | EnvFactory,
    *,
    param: str = "task",
    version: int = 0,
    **kwargs: object,
) -> None:
    """Resolve any unregistered ``namespace/<name>-v<version>`` to ``entry_point(param=name)``.

    Used for wrappers over a library of generated tasks (``rg/<task>-v0`` for reasoning-gym):
    ids are materialised into the registry on first ``make``/``spec``, then ``list_envs`` shows
    them.
    """
    if namespace in _families:
        raise RegistryError(f"a family for namespace {namespace!r} is already registered")
    _families[namespace] = _Family(
        namespace, entry_point, param, version, tuple(sorted(kwargs.items()))
    )


def _from_family(env_id: str) -> EnvSpec | None:
    match = ID_PATTERN.match(env_id)
    if match is None or match["namespace"] not in _families:
        return None
    family = _families[match["namespace"]]
    if int(match["version"]) != family.version:
        return None
    kwargs = {**dict(family.kwargs), family.param: match["name"]}
    return register(env_id, family.entry_point, description=f"{family.namespace} task", **kwargs)


def load_plugins(*, force: bool = False) -> list[str]:
    """Import third-party environments advertised in the ``grpo_envs`` entry-point group.

    Runs once (on the first ``list_envs``/``make``/``spec``); a broken plugin is reported with a
    warning naming it and skipped, so that one bad package cannot hide every other environment.

    Returns:
        The names of the entry points that loaded.
    """
    global _plugins_loaded
    if _plugins_loaded and not force:
        return []
    _plugins_loaded = True
    loaded = []
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            obj = ep.load()
            if callable(obj):
                obj()
            loaded.append(ep.name)
        except Exception as exc:
            warnings.warn(
                f"grpo_envs plugin {ep.name!r} ({ep.value}) failed to load: "
                f"{type(exc).__name__}: {exc}",
                RuntimeWarning,
                stacklevel=2,
            )
    return loaded


def _unknown(env_id: str) -> RegistryError:
    close = difflib.get_close_matches(env_id, list(registry), n=5, cutoff=0.5)
    hint = f" Did you mean: {', '.join(close)}?" if close else ""
    return RegistryError(
        f"no environment {env_id!r} is registered.{hint} "
        f"`grpo envs list` shows all {len(registry)} registered ids."
    )


def import_user_module(module_name: str) -> None:
    """Import the module of a ``module:ns/name-vN`` id, finding it in the current folder too.

    The ``grpo`` command, unlike ``python -m``, does not put the current folder on the import
    path, so a module beside the user's config would not be found; it is added at the end of
    ``sys.path`` (installed packages keep precedence).
    """
    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.append(here)
    importlib.import_module(module_name)


def spec(env_id: str) -> EnvSpec:
    """Return the ``EnvSpec`` of ``env_id`` (``"module:ns/name-vN"`` imports ``module`` first)."""
    load_plugins()
    if ":" in env_id:
        module_name, env_id = env_id.split(":", 1)
        import_user_module(module_name)
    if env_id in registry:
        return registry[env_id]
    parse_env_id(env_id)
    found = _from_family(env_id)
    if found is None:
        raise _unknown(env_id)
    return found


def make(env_id: str | EnvSpec, **overrides: object) -> Environment:
    """Build the environment registered as ``env_id`` with its defaults updated by ``overrides``.

    The returned environment has ``env_id`` set and ``spec`` holding the exact arguments used, so
    that ``make(env.spec)`` rebuilds an identical environment (``check_env`` relies on it). It is
    wrapped as ``grpo_envs.wrappers.wrap`` says: scoring never raises and always gives finite,
    typed scores, within a time bound; ``env.unwrapped`` is the environment itself.
    """
    from grpo_envs.wrappers import wrap  # imports datasets: not on `import grpo_envs`

    base = env_id if isinstance(env_id, EnvSpec) else spec(env_id)
    used = base.with_kwargs(**overrides)
    factory = base.load()
    try:
        # The factory registered for an Environment builds one (``EnvSpec`` cannot say so).
        env = cast("Environment", factory(**used.defaults))
    except TypeError as exc:
        raise TypeError(f"{base.id}: cannot build with arguments {used.defaults}: {exc}") from exc
    env.env_id = base.id
    env.spec = used
    return wrap(env)


def list_envs(namespace: str | None = None) -> list[EnvSpec]:
    """All registered specs (optionally of one namespace), sorted by id."""
    load_plugins()
    specs = sorted(registry.values(), key=lambda s: s.id)
    return [s for s in specs if namespace is None or s.namespace == namespace]


def families() -> Mapping[str, str]:
    """Return registered families: namespace -> a usage hint (for ``grpo envs list``)."""
    return {ns: f"{ns}/<{f.param}>-v{f.version}" for ns, f in _families.items()}
