"""Per-sample records and the append-only JSONL file that makes evaluation resumable.

One line per scored completion, keyed by ``(env_id, sample_id, gen_index)``. A run that is killed
mid-write leaves at most one partial last line; ``SampleStore`` cuts it off when it opens the file,
so a rerun appends cleanly and never duplicates a key.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from grpo_envs.types import JSONValue
from grpo_train.episodes.records import CompletionRecord, TurnRecord

logger = logging.getLogger(__name__)

RecordKey = tuple[str, str, int]
"""``(env_id, sample_id, gen_index)``: what identifies one scored completion."""


@dataclass(frozen=True)
class SampleRecord(CompletionRecord):
    """One scored evaluation completion, as written to an eval run's ``samples.jsonl``.

    The fields every logged completion has come from ``CompletionRecord``; the trainer's rows
    are ``grpo_train.collect.samples.TrainingSample``.
    """

    task: str
    """The report row this sample belongs to (suite label)."""
    gen_index: int
    """Which of the ``n`` completions of this prompt (0-based)."""
    num_tokens: int
    truncated: bool
    """The completion hit ``max_tokens`` before EOS."""
    success: bool
    """The outcome counts towards accuracy / pass@k."""
    extracted: str | None
    """The answer (math) or code the scorer extracted, when it says so."""
    strict_correct: bool | None = None
    """Math only: correct under required-format extraction (None: not a math task)."""
    flexible_correct: bool | None = None
    """Math only: correct under flexible extraction (None: not a math task)."""
    score: Mapping[str, JSONValue] | None = None
    """The full ``Score.to_json()``, components and details included."""
    turns: tuple[TurnRecord, ...] | None = None
    """Multi-turn episodes: each model turn (its text, tokens, tool calls and their results,
    ``scored`` on the turn the rubric judged) and each environment reply; None single-turn.
    ``completion`` keeps the flat transcript."""

    @property
    def key(self) -> RecordKey:
        """The resume key ``(env_id, sample_id, gen_index)``."""
        return (self.env_id, self.sample_id, self.gen_index)

    def to_json_line(self) -> str:
        """One JSONL line (with the trailing newline)."""
        return json.dumps(asdict(self), ensure_ascii=False, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, raw: Mapping[str, object]) -> SampleRecord:
        """Rebuild a record from a parsed JSONL line; ``ValueError`` on a malformed one."""
        try:
            return cls(
                task=str(raw["task"]),
                env_id=str(raw["env_id"]),
                sample_id=str(raw["sample_id"]),
                gen_index=int(raw["gen_index"]),  # type: ignore[call-overload]
                prompt=str(raw["prompt"]),
                completion=str(raw["completion"]),
                num_tokens=int(raw["num_tokens"]),  # type: ignore[call-overload]
                truncated=bool(raw["truncated"]),
                reward=float(raw["reward"]),  # type: ignore[arg-type]
                outcome=str(raw["outcome"]),
                success=bool(raw["success"]),
                extracted=None if raw.get("extracted") is None else str(raw["extracted"]),
                strict_correct=_opt_bool(raw.get("strict_correct")),
                flexible_correct=_opt_bool(raw.get("flexible_correct")),
                score=raw.get("score"),  # type: ignore[arg-type]
                turns=_turns(raw.get("turns")),
            )
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"malformed sample record: {err!r}") from err


def _turns(raw: object) -> tuple[TurnRecord, ...] | None:
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise ValueError(f"turns must be a list, got {type(raw).__name__}")
    return tuple(TurnRecord.from_json(t) for t in raw)


def _opt_bool(value: object) -> bool | None:
    return None if value is None else bool(value)


class SampleStore:
    """The append-only ``samples.jsonl`` of one run folder."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._records: dict[RecordKey, SampleRecord] = {}
        self._load()

    def _load(self) -> None:
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        end = data.rfind(b"\n") + 1
        if end < len(data):
            # A killed run can leave a partial last line; drop it so appends start on a fresh line.
            logger.warning(
                "%s: dropping a truncated last line (%d bytes)", self.path, len(data) - end
            )
            with self.path.open("r+b") as fh:
                fh.truncate(end)
            data = data[:end]
        for lineno, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = SampleRecord.from_json(json.loads(line))
            except (json.JSONDecodeError, ValueError) as err:
                logger.warning("%s:%d: skipping unreadable record (%s)", self.path, lineno, err)
                continue
            # First write wins: a duplicate key can only come from a hand-edited file.
            self._records.setdefault(record.key, record)

    def __contains__(self, key: object) -> bool:
        return key in self._records

    def __len__(self) -> int:
        return len(self._records)

    def get(self, key: RecordKey) -> SampleRecord | None:
        """Return the record stored under ``key``, if any."""
        return self._records.get(key)

    def records(self) -> list[SampleRecord]:
        """Every stored record, in file order."""
        return list(self._records.values())

    def append(self, records: Iterable[SampleRecord]) -> int:
        """Append new records (keys already stored are skipped) and fsync; returns how many."""
        fresh = [r for r in records if r.key not in self._records]
        if not fresh:
            return 0
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write("".join(r.to_json_line() for r in fresh))
            fh.flush()
            os.fsync(fh.fileno())
        for r in fresh:
            self._records[r.key] = r
        return len(fresh)
