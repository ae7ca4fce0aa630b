r"""``rg/<task>-v0``: any reasoning-gym task as an environment (its generator and its scorer).

``make("rg/leg_counting-v0")`` or ``make("rg/reasoning-gym-v0", task="leg_counting", **config)``;
extra keyword arguments go to ``reasoning_gym.create_dataset`` (difficulty settings).

reasoning-gym draws item ``i`` of a dataset from ``Random(seed + i)``, so two seeds closer than the
dataset size share items. The test split therefore uses ``seed + TEST_SEED_OFFSET`` and, in
addition, drops any test item whose question also occurs in the train split.

Its scorers can give partial credit through substring matches (a known hack); by default the
reward is 1 only for a full score (``partial_credit=True`` passes the raw score through). Some task
scorers raise on malformed answers (``int()`` of junk); model text never yields an ``error``
outcome: such an answer is ``wrong``, with the scorer's failure in ``details["reason"]``.

The answer is read from ``<answer>`` tags, else the last ``\boxed{}``. Small chat models answer
in prose ("The GCD of 435 and 335 is 1."): ``answer="loose"`` then takes the final stated answer,
by the same rule as the math environments' ``answer: loose``
(``grpo_envs.envs._common.loose_final_answer``: the number or math span the last concluding
sentence states). It suits tasks whose answers are numbers or expressions; a task answered in
words still needs the tags.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

from grpo_envs.base import SingleTurnEnv
from grpo_envs.envs._common import (
    extra_components,
    loose_final_answer,
    reference_answer,
    user_prompt,
)
from grpo_envs.format import answer_tag, last_boxed
from grpo_envs.rubric import Judgement, RewardComponent, Rubric, ScoringContext
from grpo_envs.types import JSONValue, Outcome, Sample, Scalar

TEST_SEED_OFFSET = 1_000_000_007
RG_INSTRUCTION = "Give only the final answer inside <answer> </answer> tags."
ANSWER_MODES = ("strict", "loose")


def _jsonable(value: Any) -> JSONValue:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


class ReasoningGymEnv(SingleTurnEnv):
    r"""A reasoning-gym task; the answer is read from ``<answer>`` tags (else ``\boxed{}``).

    With ``answer="loose"`` a final answer stated in prose counts too (see the module doc).
    """

    def __init__(
        self,
        task: str = "leg_counting",
        seed: int = 0,
        train_size: int = 1000,
        test_size: int = 200,
        partial_credit: bool = False,
        format: str = "none",
        format_weight: float = 0.0,
        answer: str = "strict",
        **config: Any,
    ) -> None:
        r"""Configure the wrapped task.

        Args:
            task: a reasoning-gym dataset name (``reasoning_gym.factory.DATASETS``).
            seed: train items come from ``seed``, test items from ``seed + TEST_SEED_OFFSET``.
            train_size: rows of the train split.
            test_size: rows of the test split (may lose a few, see the module doc).
            partial_credit: pass reasoning-gym's fractional scores through as the reward.
            format: ``none``, ``boxed`` or ``think_answer`` (adds that format component).
            format_weight: the format component's weight (0: logged only).
            answer: ``strict`` reads only ``<answer>`` tags or a ``\boxed{}``; ``loose`` also
                takes the final stated answer of the text (the math environments' rule).
            **config: the task's own settings, passed to ``create_dataset``.
        """
        super().__init__()
        import reasoning_gym

        known = reasoning_gym.factory.DATASETS
        if task not in known:
            import difflib

            close = difflib.get_close_matches(task, list(known), n=5)
            raise ValueError(f"unknown reasoning-gym task {task!r}; close matches: {close}")
        if train_size >= TEST_SEED_OFFSET:
            raise ValueError(f"train_size must be < {TEST_SEED_OFFSET}")
        if answer not in ANSWER_MODES:
            raise ValueError(f"answer must be one of {ANSWER_MODES}, got {answer!r}")
        self.task, self.partial_credit, self.format = task, partial_credit, format
        self.answer = answer
        self.seeds = {"train": seed, "test": seed + TEST_SEED_OFFSET}
        self.sizes = {"train": train_size, "test": test_size}
        self.config = config
        self._rg: dict[str, Any] = {}
        self.rubric = Rubric(
            [
                RewardComponent("correct", 1.0, self._correctness),
                *extra_components(format, format_weight),
            ]
        )

    def _source(self, split: str) -> Any:
        if split not in self._rg:
            import reasoning_gym

            self._rg[split] = reasoning_gym.create_dataset(
                self.task, seed=self.seeds[split], size=self.sizes[split], **self.config
            )
        return self._rg[split]

    def load_split(self, split: str) -> Iterator[Sample]:
        """Return the task's items for ``split`` (test drops items that occur in train)."""
        seen = {item["question"] for item in self._source("train")} if split != "train" else set()
        suffix = (
            RG_INSTRUCTION
            if self.format != "think_answer"
            else (
                "First think inside <think> </think> tags, then "
                + RG_INSTRUCTION[0].lower()
                + RG_INSTRUCTION[1:]
            )
        )
        for index, item in enumerate(self._source(split)):
            if item["question"] in seen:
                continue
            yield Sample(
                id=f"{split}-{index}",
                prompt=user_prompt(f"{item['question']}\n\n{suffix}"),
                answer=str(item["answer"]),
                metadata={
                    "task": self.task,
                    "split": split,
                    "index": index,
                    "rg": _jsonable(item.get("metadata", {})),
                },
            )

    def _entry(self, sample: Sample) -> Mapping[str, Any]:
        """Return the original reasoning-gym item (regenerated: scorers may need its metadata)."""
        meta = sample.metadata
        split, index = meta.get("split"), meta.get("index")
        if meta.get("task") == self.task and split in self.sizes and isinstance(index, int):
            source = self._source(str(split))
            if 0 <= index < len(source):
                entry: Mapping[str, Any] = source[index]
                if str(entry["answer"]) == sample.answer:
                    return entry
        return {"question": "", "answer": sample.answer, "metadata": meta.get("rg") or {}}

    def _correctness(self, ctx: ScoringContext) -> Judgement:
        extracted = answer_tag(ctx.completion) or last_boxed(ctx.completion)
        if extracted is None and self.answer == "loose":
            extracted = loose_final_answer(ctx.completion)
        if extracted is None:
            reason = "no <answer> or \\boxed{} found"
            if self.answer == "loose":
                reason += ", and no final stated answer"
            return Judgement(0.0, Outcome.UNPARSABLE, {"reason": reason})
        try:
            raw = float(self._source_scorer().score_answer(extracted, self._entry(ctx.sample)))
        except Exception as exc:
            # Task scorers parse the answer themselves and some raise on malformed ones
            # (prime_factorization: int("-"), coin_flip: OverflowError): the answer is wrong.
            reason = f"the task's scorer failed on this answer: {type(exc).__name__}: {exc}"
            return Judgement(
                0.0, Outcome.WRONG, {"extracted": extracted[:200], "reason": reason[:300]}
            )
        if not math.isfinite(raw):
            raw = 0.0  # a scorer's NaN for a malformed answer is no credit, not a broken score
        full = raw >= 1.0 - 1e-9
        value = raw if self.partial_credit else float(full)
        details: dict[str, Scalar] = {"extracted": extracted[:200], "rg_score": raw}
        return Judgement(value, Outcome.CORRECT if full else Outcome.WRONG, details)

    def _source_scorer(self) -> Any:
        return self._source("train")

    def reference_completion(self, sample: Sample) -> str:
        """Return the gold answer in tags."""
        if self.format == "think_answer":
            return reference_answer("think_answer", sample.answer)
        return f"<answer>{sample.answer}</answer>"
