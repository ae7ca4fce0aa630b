"""The typed contract every environment speaks: samples in, scores out.

These types are the boundary between environments, the trainer and evaluation; keep them small and
stable. See ``grpo_envs.base.Environment`` for the environment interface itself.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TypeAlias

#: A value allowed in ``Score.details`` and ``Sample.metadata``: plain JSON scalars only, so that
#: every score can be written to JSONL and compared for determinism.
Scalar: TypeAlias = str | int | float | bool | None
JSONValue: TypeAlias = Scalar | list["JSONValue"] | dict[str, "JSONValue"]


class DataUnavailableError(RuntimeError):
    """An environment's data cannot be loaded (an offline hub, a missing local copy).

    The message says what to download and where to put it; command-line tools print it as one
    line instead of a traceback.
    """


class Outcome(StrEnum):
    """Why a completion got the reward it got. One enum for all environments."""

    CORRECT = "correct"  # math/format: the answer is right
    WRONG = "wrong"  # an answer was found and it is wrong
    PASSED = "passed"  # code: every test passed
    FAILED = "failed"  # code: the program ran, at least one test failed
    UNPARSABLE = "unparsable"  # no answer / no code could be extracted
    TIMEOUT = "timeout"  # scoring or the program ran out of time
    MEMORY = "memory"  # the program ran out of memory
    RUNTIME_ERROR = "runtime_error"  # the program raised / crashed
    COMPILE_ERROR = "compile_error"  # code: the program did not compile (compiled languages)
    SANDBOX_ERROR = "sandbox_error"  # the sandbox itself failed (not the model's fault)
    ERROR = "error"  # the scorer raised: counted and logged, reward 0

    @property
    def is_success(self) -> bool:
        """True for the outcomes that count towards accuracy / pass@k."""
        return self in (Outcome.CORRECT, Outcome.PASSED)


@dataclass(frozen=True)
class Component:
    """One named sub-reward: its raw ``value`` (usually in [0, 1]) and its ``weight`` in the sum."""

    name: str
    value: float
    weight: float = 1.0

    @property
    def weighted(self) -> float:
        """The contribution of this component to ``Score.reward``."""
        return self.value * self.weight


@dataclass(frozen=True)
class Score:
    """The result of scoring one completion.

    ``reward`` is the weighted sum of ``components`` (zero-weight components are logged metrics);
    ``outcome`` says why; ``details`` carries plain values for logs (extracted answer, test counts).
    """

    reward: float
    outcome: Outcome
    components: tuple[Component, ...] = ()
    details: Mapping[str, Scalar] = field(default_factory=dict)

    @property
    def correct(self) -> bool:
        """Whether the outcome counts as a success (``Outcome.is_success``)."""
        return self.outcome.is_success

    def component(self, name: str) -> Component:
        """Return the component called ``name``; KeyError lists the ones that exist."""
        for comp in self.components:
            if comp.name == name:
                return comp
        raise KeyError(f"no component {name!r}; this score has {[c.name for c in self.components]}")

    @classmethod
    def failure(cls, outcome: Outcome, reason: str, **details: Scalar) -> Score:
        """Return a zero-reward score for a scoring failure, with the reason kept for logs."""
        return cls(reward=0.0, outcome=outcome, details={"reason": reason, **details})

    def to_json(self) -> dict[str, JSONValue]:
        """Return a JSON-ready dict (for per-sample JSONL files)."""
        return {
            "reward": self.reward,
            "outcome": self.outcome.value,
            "components": {c.name: {"value": c.value, "weight": c.weight} for c in self.components},
            "details": dict(self.details),
        }


@dataclass(frozen=True)
class Message:
    """One chat message."""

    role: str
    content: str


@dataclass(frozen=True)
class Sample:
    """One task instance: what the model sees (``prompt``) and what the scorer needs.

    In ``datasets.Dataset`` form each row has the columns ``id`` (str, stable across runs),
    ``prompt`` (list of ``{"role", "content"}``), ``answer`` (str, the gold answer or reference
    solution), ``env_id`` (str) and ``metadata`` (a JSON string, so that rows with different task
    metadata share one Arrow schema). ``Sample.from_row`` / ``to_row`` convert.
    """

    id: str
    prompt: tuple[Message, ...]
    answer: str
    env_id: str = ""
    metadata: Mapping[str, JSONValue] = field(default_factory=dict)

    @classmethod
    def from_row(cls, row: Mapping[str, object] | Sample) -> Sample:
        """Build a Sample from a dataset row (or return it unchanged)."""
        if isinstance(row, Sample):
            return row
        missing = [k for k in ("id", "prompt", "answer") if k not in row]
        if missing:
            raise ValueError(
                f"dataset row lacks the column(s) {missing}; a row needs id, prompt, answer"
            )
        raw_prompt = row["prompt"]
        if isinstance(raw_prompt, str):
            prompt: tuple[Message, ...] = (Message("user", raw_prompt),)
        elif isinstance(raw_prompt, list | tuple):
            prompt = tuple(
                m if isinstance(m, Message) else Message(str(m["role"]), str(m["content"]))
                for m in raw_prompt
            )
        else:
            raise TypeError(
                "prompt must be a string or a list of chat messages, "
                f"got {type(raw_prompt).__name__}"
            )
        meta = row.get("metadata") or {}
        if isinstance(meta, str):
            meta = json.loads(meta) if meta else {}
        return cls(
            id=str(row["id"]),
            prompt=prompt,
            answer=str(row["answer"]),
            env_id=str(row.get("env_id") or ""),
            metadata=dict(meta),  # type: ignore[arg-type,call-overload]
        )

    def to_row(self) -> dict[str, object]:
        """Return the dataset-row form (see the class docstring)."""
        return {
            "id": self.id,
            "prompt": [{"role": m.role, "content": m.content} for m in self.prompt],
            "answer": self.answer,
            "env_id": self.env_id,
            "metadata": json.dumps(dict(self.metadata), sort_keys=True),
        }

    @property
    def messages(self) -> list[dict[str, str]]:
        """The prompt as plain chat-template messages."""
        return [{"role": m.role, "content": m.content} for m in self.prompt]
