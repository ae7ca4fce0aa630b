r"""The environment interface: a dataset of prompts plus a deterministic scorer.

The trainer and evaluation code only rely on the methods declared on ``Environment``: ``dataset``,
``splits``, ``score``, ``score_batch``. Everything cross-cutting lives outside environments:
``grpo_envs.make`` wraps each one (``grpo_envs.wrappers``: a time bound for scorers that cannot
bound themselves, and a passive checker that turns any failure into a typed ``Score``), and the
TRL / verl adapters are free functions over any environment (``grpo_envs.adapters``).

``SingleTurnEnv`` builds an environment by composition, without subclassing::

    env = SingleTurnEnv(
        {"train": rows, "test": held_out},  # Samples, or rows with question/answer (+ id)
        Rubric([RewardComponent("correct", 1.0, integer_correctness)]),
        system_prompt="You are a careful calculator.",
        prompt_template="{question} Give the final answer as \\boxed{N}.",
    )

A subclass stays possible (procedural data: override ``load_split``).
"""

from __future__ import annotations

import re
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, TypeAlias

from grpo_envs.rubric import Rubric
from grpo_envs.types import JSONValue, Message, Outcome, Sample, Score

if TYPE_CHECKING:
    import datasets

    from grpo_envs.env_spec import EnvSpec

#: What ``score`` accepts as a completion: text, or chat messages (TRL's conversational format).
CompletionLike = str | Sequence[Mapping[str, object]] | Mapping[str, object] | None


def completion_text(completion: object) -> str | None:
    """Return the text of a completion given as a string, a message dict or a list of message dicts.

    For a list of messages the assistant contents are joined (TRL passes ``[{"role": "assistant",
    "content": ...}]``). Returns None for anything else (None, numbers, malformed messages).
    """
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Mapping):
        content = completion.get("content")
        return content if isinstance(content, str) else None
    if isinstance(completion, Sequence) and not isinstance(completion, bytes | bytearray):
        texts = []
        for message in completion:
            if not isinstance(message, Mapping) or not isinstance(message.get("content"), str):
                return None
            if message.get("role", "assistant") == "assistant":
                texts.append(str(message["content"]))
        return "".join(texts)
    return None


class Environment(ABC):
    """Base class for every environment.

    Subclasses set ``splits`` and implement ``dataset`` and ``score`` (or derive from
    ``SingleTurnEnv``, which implements both). ``env_id`` and ``spec`` are filled in by
    ``grpo_envs.make``.
    """

    env_id: str = ""
    spec: EnvSpec | None = None
    splits: tuple[str, ...] = ("train", "test")
    #: Per-item wall-clock bound (seconds) of the ``TimeLimit`` wrapper ``make`` adds.
    score_timeout_s: float = 30.0
    #: Worker processes of that wrapper: None -> min(items, CPUs); 0 -> score in-process (no
    #: time bound beyond the scorer's own; for debugging or scorers that cannot run elsewhere).
    score_workers: int | None = None

    @abstractmethod
    def dataset(self, split: str = "train") -> datasets.Dataset:
        """Return the rows of ``split`` (id, prompt, answer, env_id, metadata; see ``Sample``)."""

    @abstractmethod
    def score(self, completion: str, sample: Sample | Mapping[str, object]) -> Score:
        """Score one completion (the model's text only, without the prompt) for ``sample``."""

    def reference_completion(self, sample: Sample) -> str | None:
        """Return a completion that must score as a success for ``sample``, or None.

        ``check_env`` scores it and expects a success; None when the environment has no such answer.
        """
        return None

    def score_batch(
        self,
        completions: Sequence[str],
        samples: Sequence[Sample | Mapping[str, object]],
        *,
        workers: int | None = None,
        timeout_s: float | None = None,
    ) -> list[Score]:
        """Score many completions; results in input order.

        This default scores one by one in this process; environments whose judges work in batches
        override it (``SingleTurnEnv`` hands the batch to its ``Rubric``). ``workers`` and
        ``timeout_s`` are read by the ``TimeLimit`` wrapper that ``make`` adds (each item's
        wall-clock bound, default ``score_timeout_s``); an environment may ignore them.
        """
        _check_aligned(completions, samples)
        return [self.score(c, s) for c, s in zip(completions, samples)]  # type: ignore[arg-type]

    def scoring_is_bounded(self) -> bool:
        """Whether ``score_batch`` ends in bounded time on any input without help.

        True for scorers that run in killable workers or a sandbox, or only do linear work on
        capped text; ``make`` then adds no ``TimeLimit`` wrapper (no worker processes).
        """
        return False

    @property
    def unwrapped(self) -> Environment:
        """The environment itself, under any wrappers ``make`` put around it."""
        return self


def easier_versions(env: Environment) -> list[Environment]:
    """Return easier versions of ``env`` for a curriculum, easiest first; [] when it has none.

    An environment offers them by defining ``easier_versions()`` (procedural ones can: fewer
    digits, fewer steps). They must score like ``env`` and draw from the same question space's
    train side, so that ``env``'s held-out split stays unseen (``ArithmeticEnv`` does).
    """
    make_versions = getattr(env, "easier_versions", None)
    if make_versions is None:
        return []
    versions = list(make_versions())
    if not all(isinstance(v, Environment) for v in versions):
        raise TypeError(f"{type(env).__name__}.easier_versions() must return Environments")
    return versions


def _check_aligned(completions: Sequence[object], samples: Sequence[object]) -> None:
    if len(completions) != len(samples):
        raise ValueError(
            f"score_batch got {len(completions)} completions for {len(samples)} samples; pass one "
            "sample per completion (repeat a sample for several completions of one prompt)"
        )


# --- the single-turn environment --------------------------------------------------------------

#: One item of a split: a ``Sample``, or a row with ``prompt`` (text or chat messages) or
#: ``question``, plus ``answer`` and optionally ``id`` and ``metadata``.
SampleLike: TypeAlias = Sample | Mapping[str, object]
#: A split's items: an iterable, a ``datasets.Dataset``, or a function returning them (called on
#: first use, so that building the environment loads no data).
SplitSource: TypeAlias = Iterable[SampleLike] | Callable[[], Iterable[SampleLike]]
#: ``{split: source}``; a bare source is the ``train`` split.
SampleSource: TypeAlias = Mapping[str, SplitSource] | SplitSource

_FIELD = re.compile(r"\{(\w+)\}")


def render_template(template: str, fields: Mapping[str, object]) -> str:
    r"""Fill ``{name}`` with ``fields[name]``; braces that name no field stay as they are.

    So ``\boxed{}`` and ``\boxed{N}`` need no escaping, unlike ``str.format``.

    >>> render_template(r"{question} Answer in \boxed{N}.", {"question": "1+1?"})
    '1+1? Answer in \\boxed{N}.'
    """
    return _FIELD.sub(lambda m: str(fields[m[1]]) if m[1] in fields else m[0], template)


class SingleTurnEnv(Environment):
    r"""A prompt in, one completion out, scored by a ``Rubric``.

    Built by composition::

        env = SingleTurnEnv(
            {"train": [{"question": "What is 2 * 21?", "answer": "42"}], "test": [...]},
            Rubric([RewardComponent("correct", 1.0, integer_correctness), boxed_component(0.0)]),
            prompt_template=r"{question} Answer in \boxed{}.",
        )
        register("demo/double-v0", lambda: env)  # or a factory function building it

    or by subclassing, for procedural data: call ``super().__init__(rubric=...)`` and override
    ``load_split(split) -> Iterable[Sample]`` (ids unique within the split, deterministic for the
    constructor arguments). ``tests/grpo_envs/test_base.py`` runs both forms through
    ``check_env``.

    Args:
        samples: the items of each split (see ``SampleSource``); None for a subclass that
            overrides ``load_split``.
        rubric: how a completion is scored (a subclass may set ``self.rubric`` instead).
        system_prompt: prepended as a system message to every prompt.
        prompt_template: the user message of rows given as ``question``: ``{question}`` and any
            other ``{column}`` of the row are filled in (default ``"{question}"``).
        reference: returns a completion that must score as a success for a sample (or None);
            ``check_env`` scores it.
        splits: the split names (default: the keys of ``samples``, else ``("train", "test")``).
    """

    rubric: Rubric
    #: Prepended as a system message to every prompt when set.
    system_prompt: str | None = None
    prompt_template: str = "{question}"

    def __init__(
        self,
        samples: SampleSource | None = None,
        rubric: Rubric | None = None,
        *,
        system_prompt: str | None = None,
        prompt_template: str | None = None,
        reference: Callable[[Sample], str | None] | None = None,
        splits: Sequence[str] | None = None,
    ) -> None:
        """Compose an environment (see the class docstring)."""
        self._cache: dict[str, datasets.Dataset] = {}
        if samples is None:
            self._sources: dict[str, SplitSource] = {}
        elif isinstance(samples, Mapping) and not _is_dataset(samples):
            self._sources = {str(k): v for k, v in samples.items()}
        else:
            self._sources = {"train": samples}  # type: ignore[dict-item]
        if splits is not None:
            self.splits = tuple(splits)
        elif self._sources:
            self.splits = tuple(self._sources)
        if rubric is not None:
            self.rubric = rubric
        if system_prompt is not None:
            self.system_prompt = system_prompt
        if prompt_template is not None:
            self.prompt_template = prompt_template
        self._reference = reference

    def load_split(self, split: str) -> Iterable[SampleLike]:
        """Return the items of ``split`` (a subclass may override this instead of passing data)."""
        if split not in self._sources:
            raise ValueError(
                f"{self.env_id or type(self).__name__}: no samples given for split {split!r}; "
                f"pass SingleTurnEnv({{{split!r}: [...]}}, rubric) or override load_split"
            )
        source = self._sources[split]
        return source() if callable(source) else source

    def dataset(self, split: str = "train") -> datasets.Dataset:
        """Return the rows of ``split`` as a ``datasets.Dataset`` (built once, then cached)."""
        if split not in self.splits:
            raise ValueError(
                f"{self.env_id or type(self).__name__} has no split {split!r}; "
                f"splits: {list(self.splits)}"
            )
        if not hasattr(self, "_cache"):  # a subclass that forgot super().__init__()
            self._cache = {}
        if split not in self._cache:
            rows = [
                self._stamp(self._as_sample(item, split, i)).to_row()
                for i, item in enumerate(self.load_split(split))
            ]
            if not rows:
                raise ValueError(f"{self.env_id or type(self).__name__}: split {split!r} is empty")
            import datasets  # here, not at import: a trainer-only machine may lack it

            self._cache[split] = datasets.Dataset.from_list(rows)
        return self._cache[split]

    def _as_sample(self, item: SampleLike, split: str, index: int) -> Sample:
        if isinstance(item, Sample):
            return item
        if not isinstance(item, Mapping):
            raise TypeError(
                f"split {split!r} item {index}: expected a Sample or a mapping, "
                f"got {type(item).__name__}"
            )
        if "answer" not in item:
            raise ValueError(f"split {split!r} item {index} has no 'answer' (keys: {sorted(item)})")
        if "prompt" in item and item["prompt"] is not None:
            row = dict(item)
        elif "question" in item:
            text = render_template(self.prompt_template, {**item, "question": item["question"]})
            row = {**item, "prompt": [{"role": "user", "content": text}]}
        else:
            raise ValueError(
                f"split {split!r} item {index} has neither 'prompt' nor 'question' "
                f"(keys: {sorted(item)})"
            )
        meta = row.get("metadata")
        if isinstance(meta, Mapping):
            row["metadata"] = {str(k): v for k, v in meta.items()}
        row.setdefault("id", f"{split}-{index}")
        if row["id"] is None or row["id"] == "":
            row["id"] = f"{split}-{index}"
        return Sample.from_row(row)

    def _stamp(self, sample: Sample) -> Sample:
        prompt = sample.prompt
        if self.system_prompt and not (prompt and prompt[0].role == "system"):
            prompt = (Message("system", self.system_prompt), *prompt)
        return Sample(sample.id, prompt, sample.answer, self.env_id, sample.metadata)

    def reference_completion(self, sample: Sample) -> str | None:
        """Apply the ``reference`` given to the constructor to ``sample`` (None without one)."""
        return self._reference(sample) if getattr(self, "_reference", None) else None  # type: ignore[misc]

    def scoring_is_bounded(self) -> bool:
        """Return True when every component of the rubric declares ``bounded``."""
        return all(c.bounded for c in self.rubric.components)

    @staticmethod
    def _prepare(completion: object, sample: SampleLike) -> tuple[str, Sample] | Score:
        text = completion_text(completion)
        if text is None:
            return Score.failure(
                Outcome.UNPARSABLE, f"completion is not text (got {type(completion).__name__})"
            )
        try:
            return text, Sample.from_row(sample)
        except (ValueError, TypeError, KeyError) as exc:
            return Score.failure(Outcome.ERROR, f"bad sample: {exc}")

    def score(self, completion: CompletionLike, sample: SampleLike) -> Score:  # type: ignore[override]
        """Score a completion (text or chat messages) with ``self.rubric``."""
        prepared = self._prepare(completion, sample)
        if isinstance(prepared, Score):
            return prepared
        return self.rubric.score(*prepared)

    def score_batch(
        self,
        completions: Sequence[str],
        samples: Sequence[SampleLike],
        *,
        workers: int | None = None,
        timeout_s: float | None = None,
    ) -> list[Score]:
        """Score many completions with ``self.rubric.score_many`` (batch judges see them all)."""
        _check_aligned(completions, samples)
        results: list[Score | None] = [None] * len(completions)
        live: list[tuple[int, str, Sample]] = []
        for i, (completion, sample) in enumerate(zip(completions, samples)):
            prepared = self._prepare(completion, sample)
            if isinstance(prepared, Score):
                results[i] = prepared
            else:
                live.append((i, *prepared))
        scored = self.rubric.score_many([t for _, t, _ in live], [s for _, _, s in live])
        for (i, _, _), score in zip(live, scored, strict=True):
            results[i] = score
        return [r if r is not None else Score.failure(Outcome.ERROR, "not scored") for r in results]


__all__ = [
    "CompletionLike",
    "Environment",
    "JSONValue",
    "SampleLike",
    "SampleSource",
    "SingleTurnEnv",
    "completion_text",
    "render_template",
]


def _is_dataset(value: object) -> bool:
    """Whether ``value`` is a ``datasets.Dataset``; only one if the datasets package is loaded."""
    module = sys.modules.get("datasets")
    return module is not None and isinstance(value, module.Dataset)
