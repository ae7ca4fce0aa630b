"""What every logged completion says, in training's and evaluation's ``samples.jsonl`` alike.

The trainer logs ``collect.samples.TrainingSample`` rows (the step and advantage of a sampled
completion); ``grpo eval`` writes ``eval.records.SampleRecord`` rows (a resumable result keyed by
generation index, with extraction and pass@k fields). Both are this record plus their own fields,
so tools reading either file find the same names for the same facts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True)
class CompletionRecord:
    """One scored completion: where its prompt came from, the texts, and the judgement."""

    env_id: str
    sample_id: str
    prompt: str
    """The prompt text (evaluation: as the model saw it, chat template applied; training: the
    last message)."""
    completion: str
    reward: float
    outcome: str
    """A ``grpo_envs.types.Outcome`` value."""


@dataclass(frozen=True, kw_only=True)
class RewardPart:
    """One component of a score: its value, its weight, and what it judged."""

    name: str
    value: float
    weight: float
    weighted: float
    """``value * weight``: its share of the reward (the reward is the sum of these)."""
    judged: str
    """``completion`` (single-turn), ``final_turn`` (the rubric judged the episode's last model
    turn) or ``episode`` (a term over the whole episode, such as a per-turn penalty)."""


@dataclass(frozen=True, kw_only=True)
class ToolCallRecord:
    """One tool call a model turn made, and its result."""

    name: str
    call: str
    """The code or arguments the model sent (untrusted model text, as written)."""
    status: str
    """A ``grpo_envs.episode.ToolStatus`` value (``ok``, ``error``, ``malformed``...)."""
    seconds: float
    output: str
    """What the tool returned (what the environment showed the model)."""


@dataclass(frozen=True, kw_only=True)
class TurnRecord:
    """One turn of an episode: a model turn, or the environment's reply to one."""

    role: str
    """``assistant`` for a model turn; the reply's message role(s) otherwise (``user``,
    ``tool``; several roles joined by ``+``)."""
    text: str
    tokens: int | None
    """Model turn: ids sampled. Reply: ids inserted into the training sequence; None where the
    chat template re-rendered the history instead (a template break or ``rerender``) or the
    reply ended the episode without entering it (no room for another turn)."""
    finish_reason: str = ""
    """Model turns: ``stop`` or ``length`` (the turn's token cap); empty for replies."""
    tool_calls: tuple[ToolCallRecord, ...] = ()
    """Model turns: the tool calls the environment ran for this turn, with their results."""
    scored: bool = False
    """True on the model turn the rubric judged (the final one)."""

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> TurnRecord:
        """Rebuild a turn from its JSON object (what ``dataclasses.asdict`` wrote)."""
        tokens = raw.get("tokens")
        return cls(
            role=str(raw["role"]),
            text=str(raw["text"]),
            tokens=None if tokens is None else int(tokens),
            finish_reason=str(raw.get("finish_reason", "")),
            tool_calls=tuple(
                ToolCallRecord(
                    name=str(c["name"]),
                    call=str(c["call"]),
                    status=str(c["status"]),
                    seconds=float(c["seconds"]),
                    output=str(c["output"]),
                )
                for c in raw.get("tool_calls") or ()
            ),
            scored=bool(raw.get("scored", False)),
        )
