"""Evaluation protocols: named, recorded sampling presets, reasoning removal, run comparability.

A protocol fixes what moves a benchmark score besides the model: the decoding (temperature,
top_p, token budget), the samples per problem of each suite, and whether the reasoning block is
removed before grading. Published presets:

- ``r1``: DeepSeek-R1 ("DeepSeek-R1: Incentivizing Reasoning Capability in LLMs via Reinforcement
  Learning", arXiv 2501.12948, section 3): temperature 0.6, top_p 0.95, at most 32,768 generated
  tokens, pass@1 averaged over k samples. The samples per suite are Open-R1's (lighteval): AIME 64,
  MATH-500 4, GPQA-Diamond 8, LiveCodeBench 16. AMC 2023 and HumanEval+/MBPP+ are not in that
  table; they get 32 and 16 here (stated in ``note``).
- ``greedy``: temperature 0, one sample per problem (what lm-eval does by default).

Every field can be overridden; the overridden fields are recorded with the protocol, so a run says
"r1, max_tokens overridden" rather than "r1". ``RunRecord`` is what a run folder's
``protocol.json`` holds: the protocol, prompt format, token limits, each suite's dataset digest
and the grader's version; ``compare_records`` says whether two runs are comparable, and why not.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from grpo_envs.base import Environment

PROTOCOL_FILE = "protocol.json"
#: Bumped when the eval path's own grading rules change (reasoning removal, voting, metrics).
GRADING_RULES_VERSION = 1


@dataclass(frozen=True)
class ThinkingTags:
    """The tags around a reasoning block, removed before grading."""

    open: str = "<think>"
    close: str = "</think>"

    def __post_init__(self) -> None:
        if not self.open or not self.close or self.open == self.close:
            raise ValueError(
                f"thinking tags need a distinct, non-empty open and close tag, got "
                f"{self.open!r}, {self.close!r}"
            )

    @classmethod
    def parse(cls, text: str) -> ThinkingTags | None:
        """``"<think>,</think>"`` -> tags; ``"none"`` -> None (grade the whole completion)."""
        if text.strip().lower() in ("none", "off", ""):
            return None
        parts = [p.strip() for p in text.split(",")]
        if len(parts) != 2:
            raise ValueError(
                f"--think_tags must be OPEN,CLOSE (e.g. '<think>,</think>') or 'none', got {text!r}"
            )
        return cls(parts[0], parts[1])


def strip_reasoning(
    completion: str, tags: ThinkingTags, *, opened_in_prompt: bool = False
) -> str | None:
    r"""Return the part of ``completion`` that is graded: what follows the reasoning block.

    A closed block (``<think>...</think>``) is removed with everything before it; an unclosed one
    (an opening tag after the last closing tag, or none closed when the prompt itself ends with
    the opening tag, as reasoning models' chat templates do) means the model never answered:
    None. A completion without tags is graded whole.

    >>> t = ThinkingTags()
    >>> strip_reasoning("<think>maybe 3</think>The answer is 4.", t)
    'The answer is 4.'
    >>> strip_reasoning("<think>the answer is 3, or", t) is None
    True
    >>> strip_reasoning("so 3</think> \\\\boxed{4}", t, opened_in_prompt=True)
    ' \\\\boxed{4}'
    >>> strip_reasoning("still thinking: 3", t, opened_in_prompt=True) is None
    True
    >>> strip_reasoning("The answer is 4.", t)
    'The answer is 4.'
    """
    close_at = completion.rfind(tags.close)
    open_at = completion.rfind(tags.open)
    if close_at < 0:
        if open_at >= 0 or opened_in_prompt:
            return None
        return completion
    if open_at > close_at:
        return None  # a second block opened after the last close, never closed
    return completion[close_at + len(tags.close) :]


@dataclass(frozen=True)
class EvalProtocol:
    """Decoding and grading settings of an evaluation, by name."""

    name: str
    temperature: float
    top_p: float
    max_tokens: int
    n: int
    """Samples per problem for suites not in ``n_per_suite``."""
    n_per_suite: Mapping[str, int] = field(default_factory=dict)
    thinking: ThinkingTags | None = ThinkingTags()
    """Tags of the reasoning block removed before grading; None: grade the whole completion."""
    seed: int = 0
    note: str = ""
    overridden: tuple[str, ...] = ()
    """Fields changed from the named preset (recorded: "r1" with a smaller budget is not r1)."""

    def __post_init__(self) -> None:
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.max_tokens < 1:
            raise ValueError(
                f"protocol {self.name!r}: temperature >= 0, top_p in (0, 1] and max_tokens >= 1 "
                f"needed, got {self.temperature}, {self.top_p}, {self.max_tokens}"
            )
        counts = [self.n, *self.n_per_suite.values()]
        if any(c < 1 for c in counts):
            raise ValueError(f"protocol {self.name!r}: samples per problem must be >= 1")
        if self.temperature == 0 and any(c > 1 for c in counts):
            raise ValueError(
                f"protocol {self.name!r}: temperature 0 with n > 1 samples one greedy completion "
                "several times; set a temperature or n = 1"
            )

    def n_for(self, suite: str) -> int:
        """Return the samples per problem for ``suite`` (a suite name or a task label)."""
        return self.n_per_suite.get(suite, self.n)

    def with_overrides(self, **changes: object) -> EvalProtocol:
        """Return a copy with ``changes`` applied (None: unchanged), recorded in ``overridden``.

        ``n`` given explicitly applies to every suite.

        >>> PROTOCOLS["r1"].with_overrides(max_tokens=4096).overridden
        ('max_tokens',)
        """
        given = {k: v for k, v in changes.items() if v is not None}
        valid = {f.name for f in dataclasses.fields(self)} - {"name", "overridden", "note"}
        unknown = sorted(set(given) - valid)
        if unknown:
            raise ValueError(f"unknown protocol field(s) {unknown}; valid: {sorted(valid)}")
        changed = [k for k, v in given.items() if k != "n" and getattr(self, k) != v]
        if "n" in given:
            # One n for every suite: an override wherever a suite's own count differs from it.
            if given["n"] != self.n or any(c != given["n"] for c in self.n_per_suite.values()):
                changed.append("n")
            given["n_per_suite"] = {}
        merged = tuple(sorted({*self.overridden, *changed}))
        return dataclasses.replace(self, **given, overridden=merged)  # type: ignore[arg-type]

    def overrides_for(self, suite: str) -> tuple[str, ...]:
        """Return the fields that, for ``suite``, differ from the named preset's values.

        The samples per problem are compared per suite: ``--n 4`` under r1 overrides AIME's 64
        but not MATH-500's 4. A protocol that is not a named preset reports ``overridden``.

        >>> PROTOCOLS["r1"].with_overrides(n=4).overrides_for("aime24")
        ('n',)
        >>> PROTOCOLS["r1"].with_overrides(n=4).overrides_for("math500")
        ()
        """
        preset = PROTOCOLS.get(self.name)
        if preset is None:
            return self.overridden
        fields = ("max_tokens", "seed", "temperature", "thinking", "top_p")
        out = {f for f in fields if getattr(self, f) != getattr(preset, f)}
        if self.n_for(suite) != preset.n_for(suite):
            out.add("n")
        return tuple(sorted(out))

    @property
    def label(self) -> str:
        """``r1`` or ``r1 (overridden: max_tokens)``."""
        extra = f" (overridden: {', '.join(self.overridden)})" if self.overridden else ""
        return self.name + extra

    def to_json(self) -> dict[str, object]:
        """JSON-ready form (``protocol.json``)."""
        out = dataclasses.asdict(self)
        out["thinking"] = None if self.thinking is None else dataclasses.asdict(self.thinking)
        out["n_per_suite"] = dict(self.n_per_suite)
        out["overridden"] = list(self.overridden)
        return out


def overrides_label(name: str, per_suite: Mapping[str, Sequence[str]]) -> str:
    """Name a run's protocol with what it overrode, per suite where the suites differ.

    >>> overrides_label("r1", {"aime24": ["max_tokens", "n"], "math500": ["max_tokens"]})
    'r1 (overridden: max_tokens, n for aime24)'
    >>> overrides_label("r1", {"aime24": [], "math500": []})
    'r1'
    """
    fields = sorted({f for overridden in per_suite.values() for f in overridden})
    parts = []
    for f in fields:
        suites = [s for s, overridden in per_suite.items() if f in overridden]
        parts.append(f if len(suites) == len(per_suite) else f"{f} for {' '.join(suites)}")
    return f"{name} (overridden: {', '.join(parts)})" if parts else name


_R1_N = {
    "aime24": 64,
    "aime25": 64,
    "amc23": 32,
    "math500": 4,
    "gpqa_diamond": 8,
    "livecodebench": 16,
    "humaneval_plus": 16,
    "mbpp_plus": 16,
}

PROTOCOLS: dict[str, EvalProtocol] = {
    "r1": EvalProtocol(
        name="r1",
        temperature=0.6,
        top_p=0.95,
        max_tokens=32768,
        n=4,
        n_per_suite=_R1_N,
        note="DeepSeek-R1 sampling (T 0.6, top_p 0.95, 32768 tokens); Open-R1's samples per "
        "suite (AIME 64, MATH-500 4, GPQA 8, LiveCodeBench 16); AMC 32, HumanEval+/MBPP+ 16 and "
        "other suites 4 are this project's choice",
    ),
    "greedy": EvalProtocol(
        name="greedy",
        temperature=0.0,
        top_p=1.0,
        max_tokens=32768,
        n=1,
        note="greedy decoding, one completion per problem (lm-eval's default)",
    ),
}


def get_protocol(name: str) -> EvalProtocol:
    """Return the named preset; ``ValueError`` lists the known ones."""
    try:
        return PROTOCOLS[name]
    except KeyError:
        raise ValueError(
            f"unknown --protocol {name!r}; known: {', '.join(sorted(PROTOCOLS))}"
        ) from None


# --- what a run folder records -------------------------------------------------------------


def dataset_digest(env: Environment, split: str, limit: int | None) -> dict[str, object]:
    """sha256 over the evaluated problems (id, prompt, gold, metadata with the tests), and count.

    Hashing the rows as evaluated, not a file, tells two runs apart whatever the source (hub
    revision, local copy, a file): same digest, same problems.
    """
    ds = env.dataset(split)
    if limit is not None:
        ds = ds.select(range(min(limit, len(ds))))
    digest = hashlib.sha256()
    for row in ds:
        item = [row.get("id"), row.get("prompt"), row.get("answer"), row.get("metadata")]
        digest.update(json.dumps(item, sort_keys=True, default=str).encode("utf-8"))
        digest.update(b"\n")
    info: dict[str, object] = {"sha256": digest.hexdigest(), "rows": len(ds)}
    source = getattr(env, "data_source", None)
    if callable(source):
        info["source"] = source(split)
    return info


def _source_digest(paths: Sequence[Path]) -> str:
    digest = hashlib.sha256()
    for path in sorted(
        p for root in paths for p in (root.rglob("*.py") if root.is_dir() else [root])
    ):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def grader_info(env: Environment) -> dict[str, object]:
    """Describe the grader's version: grpo-kit's, the grading rules', a digest of its code.

    The digest covers the env's module and the scorer package it relies on (math verifier or code
    sandbox), so two checkouts of the same release that grade differently are told apart.
    """
    import grpo_envs

    root = Path(grpo_envs.__file__).parent
    env = getattr(env, "unwrapped", env)  # make()'s wrappers are not the grader
    module = type(env).__module__
    module_file = Path(__import__(module, fromlist=["_"]).__file__ or root / "__init__.py")
    scorers = [root / "math"]
    if env.env_id.startswith("code/"):
        import sandbox

        scorers = [root / "code", Path(sandbox.__file__).parent]
    try:
        version = importlib.metadata.version("grpo-kit")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    return {
        "grpo_kit": version,
        "grading_rules": GRADING_RULES_VERSION,
        "env_class": f"{module}.{type(env).__qualname__}",
        "source_sha256": _source_digest([module_file, *scorers]),
    }


class Severity(StrEnum):
    """How much a difference between two runs matters."""

    INCOMPARABLE = "incomparable"
    """The numbers measure different things (other problems, decoding or grading rules)."""
    WARNING = "warning"
    """Comparable, but a score may move for a reason other than the model (grader code)."""


@dataclass(frozen=True)
class Difference:
    """One setting two runs do not share."""

    what: str
    a: object
    b: object
    severity: Severity
    note: str = ""
    """Which run overrode its named protocol's value here, from the records (empty: neither)."""

    def describe(self) -> str:
        """One line for the user."""
        extra = f"; {self.note}" if self.note else ""
        return f"{self.severity.value}: {self.what} differs ({self.a!r} vs {self.b!r}){extra}"


_INCOMPARABLE_KEYS = ("temperature", "top_p", "max_tokens", "thinking", "n")


def compare_records(a: Mapping[str, object], b: Mapping[str, object]) -> list[Difference]:
    """List what differs between two runs' ``protocol.json`` contents, shared tasks only.

    Decoding, samples per suite, reasoning removal, prompt format and dataset digests make runs
    incomparable; the grader's version only warns (a fixed grader bug should not block a
    comparison, but it should be said).
    """
    out: list[Difference] = []
    pa, pb = _mapping(a.get("protocol")), _mapping(b.get("protocol"))
    for key in _INCOMPARABLE_KEYS:
        if pa.get(key) != pb.get(key):
            note = _override_note(key, _overridden(pa), _overridden(pb), pa, pb)
            out.append(
                Difference(f"protocol.{key}", pa.get(key), pb.get(key), Severity.INCOMPARABLE, note)
            )
    for key in ("prompt_sha256", "max_prompt_tokens"):
        if a.get(key) != b.get(key):
            out.append(Difference(key, a.get(key), b.get(key), Severity.INCOMPARABLE))
    ta, tb = _tasks(a), _tasks(b)
    for label in [t for t in ta if t in tb]:
        for key, severity in (
            ("n", Severity.INCOMPARABLE),
            ("dataset", Severity.INCOMPARABLE),
            ("grader", Severity.WARNING),
        ):
            va, vb = ta[label].get(key), tb[label].get(key)
            if key == "dataset":
                va, vb = _mapping(va).get("sha256"), _mapping(vb).get("sha256")
            if va != vb:
                note = ""
                if key == "n":
                    oa = _overridden(ta[label]) if "overridden" in ta[label] else _overridden(pa)
                    ob = _overridden(tb[label]) if "overridden" in tb[label] else _overridden(pb)
                    note = _override_note(key, oa, ob, pa, pb)
                out.append(Difference(f"{label}.{key}", va, vb, severity, note))
    return out


def _overridden(record: Mapping[str, object]) -> set[str]:
    value = record.get("overridden")
    return {str(v) for v in value} if isinstance(value, list | tuple) else set()


def _override_note(
    key: str,
    in_a: set[str],
    in_b: set[str],
    pa: Mapping[str, object],
    pb: Mapping[str, object],
) -> str:
    """Say which run's record lists ``key`` as overridden from its named protocol."""
    runs = [run for run, fields in (("A", in_a), ("B", in_b)) if key in fields]
    if not runs:
        return ""
    names = {run: (pa if run == "A" else pb).get("name") for run in runs}
    return "; ".join(f"{run} overrode {names[run]}'s {key}" for run in runs)


def _mapping(value: object) -> Mapping[str, object]:
    return value if isinstance(value, Mapping) else {}


def _tasks(record: Mapping[str, object]) -> dict[str, Mapping[str, object]]:
    tasks = record.get("tasks")
    if not isinstance(tasks, list):
        return {}
    return {str(t.get("label")): t for t in tasks if isinstance(t, Mapping)}


def read_record(run_dir: str | Path) -> dict[str, object] | None:
    """Read a run folder's ``protocol.json``; None for runs made before protocols existed."""
    path = Path(run_dir) / PROTOCOL_FILE
    if not path.is_file():
        return None
    raw = json.loads(path.read_text())
    return raw if isinstance(raw, dict) else None
