"""Suites: named sets of environment ids, built in or defined in a user's YAML file.

A ``--suite`` argument is a comma-separated list whose items are suite names (``gsm8k``, ``code``,
a name from ``--suites_file``) or any environment id ``grpo train --env`` accepts: registered ids
(``math/arithmetic-v0``), ``module:id`` (the module is imported first), ids of installed plugins
and families (``rg/leg_counting-v0``). Each item expands to one or more ``Task`` s: the unit that
gets its own row in the report.

The YAML file maps names to env ids, or to ``{id, kwargs}`` entries (the environment's ``make``
arguments, e.g. a dataset environment's file and columns), at the top level or under ``suites:``::

    suites:
      my-math: [math/gsm8k-v0, math/arithmetic-v0]
      quick: math/arithmetic-v0
      mine:
        - id: math/dataset-v0
          kwargs: {path: data/questions.jsonl, question: problem, answer: solution}
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import yaml


@dataclass(frozen=True)
class Suite:
    """A named set of environment ids; ``kwargs`` holds ``make`` arguments per id."""

    name: str
    env_ids: tuple[str, ...]
    kwargs: Mapping[str, Mapping[str, object]] = field(default_factory=dict)


@dataclass(frozen=True)
class Task:
    """One environment evaluated as part of a suite; ``label`` names its row in reports."""

    label: str
    env_id: str
    suite: str
    kwargs: Mapping[str, object] = field(default_factory=dict)
    """Arguments for ``grpo_envs.make(env_id, **kwargs)`` (from a suites file)."""


def env_id_resolves(item: str) -> bool:
    """Whether ``item`` names an environment, exactly as ``grpo_envs.make`` resolves ids.

    Registered ids, ``module:id`` (imports the module; an import error is raised as a
    ``ValueError`` naming it), plugin ids and family ids (``rg/<task>-v0``).
    """
    try:
        import grpo_envs
    except ImportError:  # grpo_envs absent: pass id-looking items through to make's own error
        return "/" in item
    if ":" in item:
        module = item.split(":", 1)[0]
        try:
            grpo_envs.spec(item)
        except grpo_envs.RegistryError:
            return False
        except ImportError as err:
            raise ValueError(
                f"--suite item {item!r}: cannot import module {module!r}: {err}"
            ) from err
        return True
    try:
        grpo_envs.spec(item)
    except grpo_envs.RegistryError:
        return False
    return True


BUILTIN_SUITES: dict[str, Suite] = {
    s.name: s
    for s in (
        Suite("gsm8k", ("math/gsm8k-v0",)),
        Suite("math500", ("math/math500-v0",)),
        Suite("humaneval", ("code/humaneval-v0",)),
        Suite("mbpp", ("code/mbpp-v0",)),
        Suite("math", ("math/gsm8k-v0", "math/math500-v0")),
        Suite("code", ("code/humaneval-v0", "code/mbpp-v0")),
        # The benchmarks of reasoning-model papers (hub ids: grpo_envs/envs/benchmarks.py,
        # gpqa.py, code_benchmarks.py); `--protocol r1` samples each as those papers do.
        Suite("aime24", ("math/aime24-v0",)),
        Suite("aime25", ("math/aime25-v0",)),
        Suite("amc23", ("math/amc23-v0",)),
        Suite("gpqa_diamond", ("science/gpqa-diamond-v0",)),
        Suite("livecodebench", ("code/livecodebench-v0",)),
        Suite("humaneval_plus", ("code/humaneval-plus-v0",)),
        Suite("mbpp_plus", ("code/mbpp-plus-v0",)),
        Suite(
            "reasoning",
            (
                "math/aime24-v0",
                "math/aime25-v0",
                "math/amc23-v0",
                "math/math500-v0",
                "science/gpqa-diamond-v0",
                "code/livecodebench-v0",
            ),
        ),
        Suite("evalplus", ("code/humaneval-plus-v0", "code/mbpp-plus-v0")),
    )
}


def load_suites_file(path: str | Path) -> dict[str, Suite]:
    """Read user suites from a YAML file (see the module docstring for the format)."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError as err:
        raise ValueError(f"--suites_file {str(path)!r} does not exist") from err
    except yaml.YAMLError as err:
        raise ValueError(f"--suites_file {str(path)!r} is not valid YAML: {err}") from err
    if isinstance(raw, Mapping) and "suites" in raw:
        raw = raw["suites"]
    if not isinstance(raw, Mapping):
        raise ValueError(
            f"--suites_file {str(path)!r} must map suite names to env ids, e.g. "
            "`suites: {my-math: [math/gsm8k-v0, math/arithmetic-v0]}`"
        )
    suites: dict[str, Suite] = {}
    for name, value in raw.items():
        entries = [value] if isinstance(value, str | Mapping) else value
        env_ids: list[str] = []
        kwargs: dict[str, Mapping[str, object]] = {}
        ok = isinstance(entries, list) and bool(entries)
        for entry in entries if ok else []:
            if isinstance(entry, str):
                env_ids.append(entry)
            elif (
                isinstance(entry, Mapping)
                and isinstance(entry.get("id"), str)
                and set(entry) <= {"id", "kwargs"}
                and isinstance(entry.get("kwargs") or {}, Mapping)
            ):
                env_ids.append(entry["id"])
                kwargs[entry["id"]] = dict(entry.get("kwargs") or {})
            else:
                ok = False
        if not ok:
            raise ValueError(
                f"suite {name!r} in {str(path)!r} must be an env id, an {{id, kwargs}} entry or a "
                f"non-empty list of them, got {value!r}"
            )
        suites[str(name)] = Suite(str(name), tuple(env_ids), kwargs)
    return suites


def resolve_tasks(
    spec: str | Iterable[str],
    *,
    user_suites: Mapping[str, Suite] | None = None,
    registered_env_ids: Iterable[str] = (),
    resolves: Callable[[str], bool] = env_id_resolves,
) -> list[Task]:
    """Expand a ``--suite`` value into tasks, in order, without duplicates.

    Items are looked up as user suites first (so a user can override a built-in name), then
    built-in suites, then environment ids (``registered_env_ids``, else whatever ``resolves``
    accepts: by default every id ``grpo_envs.make`` accepts). An unknown item raises
    ``ValueError`` listing close matches. A suite with one env gets that env's row labelled by
    the suite name; a suite with several labels each row ``suite:env_id``.
    """
    items = [s.strip() for s in spec.split(",")] if isinstance(spec, str) else list(spec)
    items = [s for s in items if s]
    if not items:
        raise ValueError("--suite is empty; give suite names or env ids, e.g. gsm8k,humaneval")
    suites = {**BUILTIN_SUITES, **(user_suites or {})}
    registered = list(registered_env_ids)
    tasks: list[Task] = []
    seen: set[str] = set()
    for item in items:
        if item in suites:
            suite = suites[item]
            for env_id in suite.env_ids:
                label = suite.name if len(suite.env_ids) == 1 else f"{suite.name}:{env_id}"
                if env_id not in seen:
                    kwargs = dict(suite.kwargs.get(env_id, {}))
                    tasks.append(Task(label, env_id, suite.name, kwargs))
                    seen.add(env_id)
        elif item in registered or resolves(item):
            if item not in seen:
                tasks.append(Task(label=item, env_id=item, suite=item))
                seen.add(item)
        else:
            known = sorted(suites) + sorted(registered)
            close = difflib.get_close_matches(item, known, n=3)
            hint = f" Did you mean {', '.join(close)}?" if close else ""
            raise ValueError(
                f"unknown suite or env id {item!r}.{hint} Suites: {', '.join(sorted(suites))}; "
                f"env ids: {', '.join(sorted(registered)) or '(none registered)'}"
            )
    return tasks
