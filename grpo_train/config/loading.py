"""Reading a configuration: YAML files, command-line values, TRL's names; writing it back.

``TrainConfig.from_flat`` takes ``{field: value}`` (strings from the command line too),
``from_yaml`` a flat or sectioned YAML file; each value is converted to its field's type
(``coerce``: one boolean parser, ``parse_bool``; environments, ``parse_envs``; mappings,
``parse_mapping``). TRL's ``GRPOConfig`` names are accepted as aliases (``TRL_ALIASES``,
``normalise_aliases``) and saved under ours. ``to_yaml`` writes what ``from_yaml`` reads back.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import inspect
import itertools
import textwrap
import types
import typing
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from functools import cache
from pathlib import Path
from typing import Literal, get_type_hints

import yaml

from grpo_train.algorithm.choices import ScaleRewards
from grpo_train.config.sections import (
    SECTIONS,
    AlgorithmConfig,
    DataConfig,
    EnvEntry,
    OptimConfig,
    PolicyConfig,
    RolloutConfig,
    RunConfig,
    SandboxConfig,
)
from grpo_train.config.validation import ConfigError, problems_text, validate


def unknown_fields_text(unknown: Sequence[str], known: Sequence[str]) -> str:
    """Name the unknown fields, each with its closest known names (a likely typo).

    >>> text = unknown_fields_text(["learning_rte"], ["learning_rate", "lr_scheduler", "seed"])
    >>> text.split(";")[0]
    "unknown config field 'learning_rte' (did you mean learning_rate?)"
    """
    parts = []
    for name in unknown:
        close = difflib.get_close_matches(str(name), known, n=3, cutoff=0.6)
        hint = f" (did you mean {' or '.join(close)}?)" if close else ""
        parts.append(f"{name!r}{hint}")
    plural = "s" if len(unknown) > 1 else ""
    return f"unknown config field{plural} {', '.join(parts)}; `grpo train --help` lists them all"


@dataclass(frozen=True)
class TrainConfig:
    """The whole configuration of a training run."""

    # The sections are frozen dataclasses (``sections.py``): one shared default is safe.
    policy: PolicyConfig = PolicyConfig()  # noqa: RUF009
    data: DataConfig = DataConfig()  # noqa: RUF009
    rollout: RolloutConfig = RolloutConfig()  # noqa: RUF009
    algorithm: AlgorithmConfig = AlgorithmConfig()  # noqa: RUF009
    optim: OptimConfig = OptimConfig()  # noqa: RUF009
    run: RunConfig = RunConfig()  # noqa: RUF009
    sandbox: SandboxConfig = SandboxConfig()  # noqa: RUF009

    def __post_init__(self) -> None:
        problems = validate(self)
        if problems:
            raise ConfigError(problems_text(problems))

    @classmethod
    def from_flat(
        cls, values: Mapping[str, object], base: TrainConfig | None = None
    ) -> TrainConfig:
        """Build a config from ``{field: value}`` (values may be strings from the command line).

        TRL's ``GRPOConfig`` names are accepted too (``normalise_aliases``).
        """
        values = normalise_aliases(values)
        owners = field_owners()
        unknown = [k for k in values if k not in owners]
        if unknown:
            raise ConfigError(unknown_fields_text(unknown, [*owners, *SECTIONS]))
        problems: list[str] = []
        sections = {name: getattr(base or cls(), name) for name in SECTIONS}
        for section_name, section in sections.items():
            changes: dict[str, object] = {}
            for f in fields(section):
                if f.name in values:
                    try:
                        changes[f.name] = coerce(f.name, values[f.name], field_types()[f.name])
                    except (TypeError, ValueError) as err:
                        problems.append(str(err))
            sections[section_name] = dataclasses.replace(section, **changes)
        if problems:
            raise ConfigError(problems_text(problems))
        return cls(**sections)

    @classmethod
    def from_yaml(cls, path: str | Path, base: TrainConfig | None = None) -> TrainConfig:
        """Load a flat or sectioned YAML file over ``base`` (default: the dataclass defaults)."""
        try:
            raw = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as err:
            raise ConfigError(f"cannot read config file {path}: {err}") from err
        if not isinstance(raw, Mapping):
            raise ConfigError(
                f"{path}: expected a mapping of field: value, got {type(raw).__name__}"
            )
        flat: dict[str, object] = {}
        for key, value in raw.items():
            if key in SECTIONS and isinstance(value, Mapping):
                flat.update(value)
            elif key in SECTIONS:
                example = next(f.name for f in fields(SECTIONS[key]))
                raise ConfigError(
                    f"{path}: {key}: is a section and needs a mapping of its fields, got "
                    f"{type(value).__name__} {value!r}; write e.g. `{key}: {{{example}: ...}}` "
                    f"or the fields flat at the top level"
                )
            else:
                flat[str(key)] = value
        return cls.from_flat(flat, base)

    def to_dict(self) -> dict[str, dict[str, object]]:
        """Return the sectioned, YAML-ready form (enums as strings, env entries as mappings)."""
        return {
            name: {k: _plain(v) for k, v in flat_items(getattr(self, name))} for name in SECTIONS
        }

    def to_yaml(self) -> str:
        """YAML text that ``from_yaml`` reads back to an equal config."""
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def save(self, path: str | Path) -> None:
        """Write ``to_yaml()`` to ``path``."""
        Path(path).write_text(self.to_yaml())


#: TRL ``GRPOConfig`` / ``TrainingArguments`` / ``ModelConfig`` names (TRL 1.16) -> ours, for
#: the ones that mean the same thing. ``epsilon``, ``report_to``, ``use_vllm`` and ``bf16`` need
#: a translation of their value too: ``normalise_aliases`` handles them.
TRL_ALIASES: Mapping[str, str] = {
    "model_name_or_path": "model",
    "num_iterations": "mu",
    "mask_truncated_completions": "mask_truncated",
    "vllm_importance_sampling_correction": "is_correction",
    "vllm_importance_sampling_cap": "is_cap",
    "vllm_importance_sampling_clip_max": "is_cap",
    "lr": "learning_rate",
    "lr_scheduler_type": "lr_scheduler",
    "save_steps": "save_every",
    "save_total_limit": "keep_last",
    "eval_steps": "eval_every",
    "vllm_gpu_memory_utilization": "vllm_memory_fraction",
    "vllm_enable_sleep_mode": "vllm_sleep_mode",
    "lora_target_modules": "target_modules",
    "load_in_4bit": "use_qlora",
    "use_peft": "",  # implied by lora_r > 0; accepted and dropped when consistent
}

#: TRL names whose value is translated as well: name -> what it sets.
TRL_TRANSLATED: Mapping[str, str] = {
    "epsilon": "epsilon_low, and epsilon_high unless given (TRL's symmetric clip)",
    "report_to": "wandb (true when it names wandb or all); TensorBoard is always written",
    "use_vllm": "engine (vllm or hf)",
    "bf16": "dtype (bfloat16 or float32)",
}

_SCHEDULER_ALIASES = {"constant_with_warmup": "constant", "linear": "linear", "cosine": "cosine"}


_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def is_bool_text(value: object) -> bool:
    """Return whether ``value`` is a bool or a word ``parse_bool`` reads (true/false/1/0/yes/no)."""
    return isinstance(value, bool) or str(value).strip().lower() in _TRUE | _FALSE


def parse_bool(name: str, value: object) -> bool:
    """Read a boolean field: a YAML bool, or ``true/false/1/0/yes/no/on/off`` in any case.

    The one boolean parser of the configuration (fields, TRL's boolean names, ``on``/``off``
    choices, TRL's boolean ``scale_rewards``).

    >>> parse_bool("progress", "No"), parse_bool("progress", True)
    (False, True)
    >>> parse_bool("progress", "maybe")
    Traceback (most recent call last):
    ...
    ValueError: progress: expected true or false, got 'maybe'
    """
    if isinstance(value, bool):
        return value
    if not is_bool_text(value):
        raise ValueError(f"{name}: expected true or false, got {value!r}")
    return str(value).strip().lower() in _TRUE


def normalise_aliases(values: Mapping[str, object]) -> dict[str, object]:
    """Rename TRL's field names to ours and translate their values; our own names pass through.

    >>> normalise_aliases({"num_iterations": 2, "epsilon": 0.1, "lr": "1e-6"})
    {'mu': 2, 'learning_rate': '1e-6', 'epsilon_low': 0.1, 'epsilon_high': 0.1}
    >>> normalise_aliases({"epsilon": 0.1, "epsilon_high": 0.3})
    {'epsilon_high': 0.3, 'epsilon_low': 0.1}
    >>> normalise_aliases({"report_to": ["wandb"], "lr_scheduler_type": "constant_with_warmup"})
    {'lr_scheduler': 'constant', 'wandb': True}
    """
    out: dict[str, object] = {}
    problems: list[str] = []
    given: dict[str, str] = {}  # our name -> the name it was given under

    def put(ours: str, value: object, source: str) -> None:
        if ours in given and given[ours] != source:
            problems.append(
                f"{source}: sets {ours}, which {given[ours]} also sets; give only one of them"
            )
            return
        given[ours] = source
        out[ours] = value

    translated: dict[str, object] = {}
    for key, value in values.items():
        if key in TRL_TRANSLATED:
            translated[key] = value
        elif key in TRL_ALIASES:
            ours = TRL_ALIASES[key]
            if key == "lr_scheduler_type":
                text = str(value)
                if text not in _SCHEDULER_ALIASES:
                    problems.append(
                        f"lr_scheduler_type: {text!r} is not supported; use one of "
                        f"{sorted(_SCHEDULER_ALIASES)}"
                    )
                    continue
                value = _SCHEDULER_ALIASES[text]
            if key == "save_total_limit" and value is None:
                value = 1_000_000  # TRL: None keeps every checkpoint
            if ours:
                put(ours, value, key)
        else:
            put(key, value, key)
    for key, value in translated.items():
        if key == "epsilon":
            put("epsilon_low", value, key)
            if "epsilon_high" not in out:
                out["epsilon_high"] = value
        elif key == "report_to":
            targets = value if isinstance(value, list | tuple) else str(value).split(",")
            names = {str(t).strip().lower() for t in targets}
            put("wandb", bool(names & {"wandb", "all"}), key)
        elif key in ("use_vllm", "bf16"):
            try:
                on = parse_bool(key, value)
            except ValueError as err:
                problems.append(str(err))
                continue
            if key == "use_vllm":
                put("engine", "vllm" if on else "hf", key)
            else:
                put("dtype", "bfloat16" if on else "float32", key)
    if problems:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(problems))
    return out


def flat_items(section: object) -> Iterator[tuple[str, object]]:
    """Yield the ``(field, value)`` pairs of one section dataclass."""
    for f in fields(section):  # type: ignore[arg-type]
        yield f.name, getattr(section, f.name)


def _plain(value: object) -> object:
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, EnvEntry):
        plain: dict[str, object] = {"id": value.id, "weight": value.weight}
        plain["kwargs"] = dict(value.kwargs)
        if value.stages:
            plain["stages"] = [dict(stage) for stage in value.stages]
        return plain
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, str):  # StrEnum members become plain strings
        return str(value)
    return value


@cache
def field_owners() -> dict[str, str]:
    """Map every field name to the section it belongs to."""
    owners: dict[str, str] = {}
    for section, cls in SECTIONS.items():
        for f in fields(cls):
            if f.name in owners:  # pragma: no cover - guarded by a test
                raise AssertionError(f"field {f.name} appears in two sections")
            owners[f.name] = section
    return owners


@cache
def field_types() -> dict[str, object]:
    """Map every field name to its resolved type annotation."""
    out: dict[str, object] = {}
    for cls in SECTIONS.values():
        out.update(get_type_hints(cls))
    return out


@cache
def field_docs() -> dict[str, str]:
    """Map every field name to the docstring written under it (read from the source by ``ast``)."""
    docs: dict[str, str] = {}
    for cls in SECTIONS.values():
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
        body = tree.body[0].body  # type: ignore[attr-defined]
        for node, nxt in itertools.pairwise(body):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)
            ):
                docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def coerce(name: str, value: object, annotation: object) -> object:
    """Convert ``value`` (a YAML value or a command-line string) to the field's type."""
    origin = typing.get_origin(annotation)
    if annotation is bool:
        return parse_bool(name, value)
    if annotation in (int, float):
        if isinstance(value, bool):
            raise ValueError(f"{name}: expected a number, got {value!r}")
        try:
            number = float(value) if annotation is float else int(str(value))  # type: ignore[arg-type]
        except ValueError:
            raise ValueError(f"{name}: expected {annotation.__name__}, got {value!r}") from None  # type: ignore[union-attr]
        return number
    if annotation is str:
        if isinstance(value, list | tuple):  # YAML lists of names (target_modules)
            return ",".join(str(v) for v in value)
        return str(value)
    if origin is Literal:
        allowed = typing.get_args(annotation)
        if "on" in allowed and is_bool_text(value):
            return "on" if parse_bool(name, value) else "off"
        if value not in allowed:
            raise ValueError(f"{name}: {value!r} is not one of {list(allowed)}")
        return value
    if isinstance(annotation, type) and issubclass(annotation, str):  # StrEnum
        if annotation is ScaleRewards and is_bool_text(value):
            # TRL's scale_rewards also takes a bool: true is "group", false is "none"
            return ScaleRewards.GROUP if parse_bool(name, value) else ScaleRewards.NONE
        try:
            return annotation(value)
        except ValueError:
            allowed_values = [m.value for m in annotation]  # type: ignore[attr-defined]
            raise ValueError(f"{name}: {value!r} is not one of {allowed_values}") from None
    if name == "chat_template_kwargs":
        return parse_mapping(name, value)
    if origin in (tuple, types.UnionType) or name == "env":
        return parse_envs(value)
    raise TypeError(f"{name}: unsupported field type {annotation}")  # pragma: no cover


def parse_mapping(name: str, value: object) -> dict[str, str | int | float | bool]:
    """Read a mapping field: a YAML mapping, or JSON / ``key=value,key=value`` text.

    >>> parse_mapping("chat_template_kwargs", '{"enable_thinking": false}')
    {'enable_thinking': False}
    >>> parse_mapping("chat_template_kwargs", "enable_thinking=false")
    {'enable_thinking': False}
    """
    if isinstance(value, str):
        text = value.strip()
        if not text:
            return {}
        if text.startswith("{"):
            loaded = yaml.safe_load(text)  # JSON is YAML; YAML also takes unquoted keys
        else:
            loaded = {}
            for part in text.split(","):
                key, sep, raw = part.partition("=")
                if not sep:
                    raise ValueError(f"{name}: cannot read {part!r}; use key=value or JSON")
                loaded[key.strip()] = yaml.safe_load(raw)
        value = loaded
    if not isinstance(value, Mapping):
        raise ValueError(f"{name}: expected a mapping such as {{enable_thinking: false}}")
    return {str(k): v for k, v in value.items()}


def parse_envs(value: object) -> tuple[EnvEntry, ...]:
    """Parse ``id``, ``id:weight,id:weight``, or a YAML list of ids / ``{id, weight, kwargs}``.

    On the command line a flow-style YAML value carries kwargs too:
    ``--env '{id: math/dataset-v0, kwargs: {path: q.jsonl, question: problem}}'``.
    """
    if isinstance(value, EnvEntry):
        return (value,)
    if isinstance(value, str) and value.lstrip().startswith(("[", "{")):
        import yaml

        try:
            value = yaml.safe_load(value)
        except yaml.YAMLError as exc:
            raise ValueError(f"env: {value!r} is not valid flow YAML/JSON: {exc}") from None
    items: list[object]
    if isinstance(value, str):
        items = [part.strip() for part in value.split(",") if part.strip()]
    elif isinstance(value, list | tuple):
        items = list(value)
    else:
        items = [value]
    entries: list[EnvEntry] = []
    for item in items:
        if isinstance(item, EnvEntry):
            entries.append(item)
        elif isinstance(item, str):
            # ``module:ns/name-v0`` (import the module first) also has a colon: a weight is only
            # what follows the last colon when there is no "/" after it.
            env_id, sep, weight = item.rpartition(":")
            if not sep or "/" in weight:
                env_id, weight = item, ""
            try:
                entries.append(EnvEntry(env_id.strip(), float(weight) if weight else 1.0))
            except ValueError:
                raise ValueError(
                    f"env: weight of {item!r} is {weight!r}, not a number; "
                    "use id:weight with a positive number (math/arithmetic-v0:2)"
                ) from None
        elif isinstance(item, Mapping) and "id" in item:
            extra = set(item) - {"id", "weight", "kwargs", "stages"}
            if extra:
                raise ValueError(
                    f"env: unknown key(s) {sorted(extra)} in {dict(item)}; use id, weight, "
                    "kwargs, stages"
                )
            weight, kwargs = item.get("weight", 1.0), item.get("kwargs") or {}
            try:
                number = float(weight)  # type: ignore[arg-type]
            except (TypeError, ValueError):
                raise ValueError(
                    f"env: weight of {item['id']} is {weight!r}, not a number; "
                    "give a positive number such as 1.0"
                ) from None
            if not isinstance(kwargs, Mapping):
                raise ValueError(
                    f"env: kwargs of {item['id']} is {kwargs!r}; give a mapping of "
                    "argument: value (`grpo envs show ID` lists the arguments)"
                )
            stages = _parse_stages(str(item["id"]), item.get("stages") or [])
            entries.append(EnvEntry(str(item["id"]), number, dict(kwargs), stages))
        else:
            raise ValueError(f"env: cannot read {item!r}; give an id or a mapping with an 'id' key")
    return tuple(entries)


def _parse_stages(env_id: str, value: object) -> tuple[Mapping[str, str | int | float | bool], ...]:
    """Read an env entry's ``stages``: a list of kwargs mappings, easiest first."""
    if not isinstance(value, list | tuple) or not all(isinstance(s, Mapping) for s in value):
        raise ValueError(
            f"env: stages of {env_id} is {value!r}; give a list of kwargs overrides, easiest "
            "first, e.g. [{digits: 1}, {operands: 2}]"
        )
    return tuple(dict(stage) for stage in value)
