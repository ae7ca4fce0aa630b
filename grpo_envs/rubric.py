"""Declarative scoring: a Parser extracts, weighted RewardComponents judge, a Rubric sums.

The split follows verifiers (parsers / rubrics / environments are separate pieces), typed, and
without its silent failure modes: a parser that finds nothing yields ``Outcome.UNPARSABLE`` (not a
quiet 0.0), a component that raises yields ``Outcome.ERROR`` with the reason, and a non-finite
value is refused. Zero-weight components are computed and logged but do not move the reward.

Example:
    >>> from grpo_envs.types import Sample
    >>> rubric = Rubric(
    ...     [RewardComponent("exact", 1.0, lambda ctx: float(ctx.parsed == ctx.sample.answer))],
    ...     parser=StripParser(),
    ... )
    >>> rubric.score(" 42 ", Sample("0", (), "42")).reward
    1.0
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from grpo_envs.types import Component, Outcome, Sample, Scalar, Score


class Parser(Protocol):
    """Extracts the part of a completion that the components judge (None: nothing found)."""

    def parse(self, completion: str) -> str | None:
        """Return the extracted answer text, or None when the completion holds no answer."""
        ...


@dataclass(frozen=True)
class WholeTextParser:
    """Passes the whole completion through (for judges that do their own extraction)."""

    def parse(self, completion: str) -> str | None:
        """Return the completion unchanged."""
        return completion


@dataclass(frozen=True)
class StripParser:
    """The completion with surrounding whitespace removed; None when that leaves nothing."""

    def parse(self, completion: str) -> str | None:
        """Return the stripped completion, or None if it is blank."""
        stripped = completion.strip()
        return stripped or None


@dataclass(frozen=True)
class ScoringContext:
    """What a reward component sees: the raw completion, the parser's output and the sample."""

    completion: str
    parsed: str | None
    sample: Sample


@dataclass(frozen=True)
class Judgement:
    """A component's result when it has more to say than a number.

    Attributes:
        value: the component's raw value (usually in [0, 1]; penalties may be negative).
        outcome: set by the component that decides the score's ``Outcome`` (e.g. correctness);
            None for components that only add reward (format, length).
        details: plain values for logs (extracted answer, reasons).
        metrics: extra numbers the judge measured on the way (e.g. the share of tests passed),
            added to the score as zero-weight (logged) components.
    """

    value: float
    outcome: Outcome | None = None
    details: Mapping[str, Scalar] = field(default_factory=dict)
    metrics: Mapping[str, float] = field(default_factory=dict)


RewardFn = Callable[[ScoringContext], "float | Judgement"]
BatchRewardFn = Callable[[Sequence[ScoringContext]], Sequence["float | Judgement"]]


@dataclass(frozen=True)
class RewardComponent:
    """One weighted sub-reward: ``weight * fn(ctx)``; ``weight == 0`` makes it a logged metric.

    ``batch_fn`` (optional) judges many contexts at once, for judges that parallelise internally
    (``grpo_envs.math.verify_batch``, the sandbox); ``Rubric.score_many`` uses it, ``Rubric.score``
    uses ``fn``. ``bounded``: the judge ends in bounded time on any input by itself (linear work
    on capped text, a verifier or sandbox with its own timeout); when every component of a rubric
    is bounded, ``make`` scores in-process instead of in time-limited worker processes.
    """

    name: str
    weight: float
    fn: RewardFn
    batch_fn: BatchRewardFn | None = None
    bounded: bool = False

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a reward component needs a name (it labels the logged metric)")
        if not math.isfinite(self.weight):
            raise ValueError(f"component {self.name!r}: weight must be finite, got {self.weight}")


class Rubric:
    """An ordered list of weighted components and the parser they share.

    The score's ``outcome`` comes from the first component that returns a ``Judgement`` with an
    outcome. When none does, it is ``UNPARSABLE`` if the parser found nothing, else ``CORRECT`` if
    the first weighted component's value is >= 1 and ``WRONG`` otherwise.
    """

    def __init__(self, components: Sequence[RewardComponent], parser: Parser | None = None) -> None:
        """Build a rubric; component names must be unique (they key the logged metrics)."""
        if not components:
            raise ValueError("a rubric needs at least one reward component")
        names = [c.name for c in components]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"duplicate component names {duplicates}; each name must be unique")
        self.components: tuple[RewardComponent, ...] = tuple(components)
        self.parser: Parser = parser if parser is not None else WholeTextParser()

    @property
    def weights(self) -> dict[str, float]:
        """Component name -> weight."""
        return {c.name: c.weight for c in self.components}

    def score(self, completion: str, sample: Sample) -> Score:
        """Score ``completion`` for ``sample``; a component that raises gives ``Outcome.ERROR``."""
        ctx = self._context(completion, sample)
        if isinstance(ctx, Score):
            return ctx
        results: list[float | Judgement | Exception] = []
        for comp in self.components:
            try:
                results.append(comp.fn(ctx))
            except Exception as exc:
                results.append(exc)
        return self._assemble(ctx, results)

    def score_many(self, completions: Sequence[str], samples: Sequence[Sample]) -> list[Score]:
        """Score aligned lists in this process, using each component's ``batch_fn`` when set."""
        contexts = [self._context(c, s) for c, s in zip(completions, samples, strict=True)]
        live = [c for c in contexts if isinstance(c, ScoringContext)]
        columns: list[list[float | Judgement | Exception]] = []
        for comp in self.components:
            column: list[float | Judgement | Exception] = []
            if comp.batch_fn is not None and live:
                try:
                    column = list(comp.batch_fn(live))
                    if len(column) != len(live):
                        raise ValueError(f"batch_fn returned {len(column)} results for {len(live)}")
                except Exception as exc:
                    column = [exc] * len(live)
            else:
                for ctx in live:
                    try:
                        column.append(comp.fn(ctx))
                    except Exception as exc:
                        column.append(exc)
            columns.append(column)
        scores: list[Score] = []
        position = 0
        for item in contexts:
            if isinstance(item, Score):
                scores.append(item)
                continue
            scores.append(self._assemble(item, [column[position] for column in columns]))
            position += 1
        return scores

    def _context(self, completion: str, sample: Sample) -> ScoringContext | Score:
        try:
            parsed = self.parser.parse(completion)
        except Exception as exc:
            return Score.failure(Outcome.ERROR, f"parser raised {type(exc).__name__}: {exc}")
        return ScoringContext(completion, parsed, sample)

    def _assemble(
        self, ctx: ScoringContext, results: Sequence[float | Judgement | Exception]
    ) -> Score:
        parts: list[Component] = []
        extra: list[Component] = []  # judges' logged metrics, after the declared components
        outcome: Outcome | None = None
        details: dict[str, Scalar] = {}
        for comp, result in zip(self.components, results, strict=True):
            if isinstance(result, Exception):
                return Score.failure(
                    Outcome.ERROR,
                    f"component {comp.name!r} raised {type(result).__name__}: {result}",
                )
            judged = result if isinstance(result, Judgement) else Judgement(float(result))
            value = float(judged.value)
            if not math.isfinite(value):
                return Score.failure(
                    Outcome.ERROR, f"component {comp.name!r} returned a non-finite value {value}"
                )
            parts.append(Component(comp.name, value, comp.weight))
            for name, metric in judged.metrics.items():
                extra.append(Component(name, float(metric), 0.0))
            if outcome is None and judged.outcome is not None:
                outcome = judged.outcome
            for key, val in judged.details.items():
                details.setdefault(key, val)
        if outcome is None:
            outcome = self._default_outcome(ctx.parsed, parts)
        reward = math.fsum(p.weighted for p in parts)
        components = (*parts, *(e for e in extra if math.isfinite(e.value)))
        return Score(reward=reward, outcome=outcome, components=components, details=details)

    @staticmethod
    def _default_outcome(parsed: str | None, parts: Sequence[Component]) -> Outcome:
        if parsed is None:
            return Outcome.UNPARSABLE
        primary = next((p for p in parts if p.weight != 0), parts[0])
        return Outcome.CORRECT if primary.value >= 1.0 else Outcome.WRONG
