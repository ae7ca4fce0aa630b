r"""``science/gpqa-diamond-v0``: GPQA-Diamond, 198 four-option questions, the letter graded.

GPQA ("GPQA: A Graduate-Level Google-Proof Q&A Benchmark", Rein et al. 2023, arXiv 2311.12022)
stores each question with its correct answer and three incorrect ones in fixed columns
(``Question``, ``Correct Answer``, ``Incorrect Answer 1..3``, ``Record ID``). The options are
shuffled here by a fixed seed per question (``Random(f"{seed}/{Record ID}")``), so the letter of
the correct option is the same in every run and on every machine, and independent of row order.

Data: hub ``Idavidrein/gpqa`` config ``gpqa_diamond`` (split ``train``; gated: accept its terms
on the hub first), ``$GRPO_GPQA_DIR``, or ``data_path=`` (a file in the hub's columns, e.g. the
``gpqa_diamond.csv`` of the GPQA repository's zip, or a folder).

Grading: the last ``Answer: X`` line (the prompt asks for it), else the last ``\boxed{X}``; the
extracted letter must be the gold letter. Anything else (no letter, two letters) is unparsable.
"""

from __future__ import annotations

import os
import random
import re
from collections.abc import Iterator, Mapping

from grpo_envs.base import SingleTurnEnv
from grpo_envs.envs._common import user_prompt
from grpo_envs.envs.benchmarks import HubSource, first_field, load_benchmark_rows
from grpo_envs.rubric import Judgement, RewardComponent, Rubric, ScoringContext
from grpo_envs.types import Outcome, Sample

GPQA_DIAMOND = HubSource(
    "gpqa_diamond", "Idavidrein/gpqa", "gpqa_diamond", "train", "GRPO_GPQA_DIR"
)
LETTERS = "ABCD"
#: The question, then the options; the model is asked to end with ``Answer: LETTER``.
DEFAULT_TEMPLATE = (
    "Answer the following multiple choice question. The last line of your response should be "
    "of the form 'Answer: LETTER' (without quotes) where LETTER is one of ABCD. Think step by "
    "step before answering.\n\n{question}\n\nA) {A}\nB) {B}\nC) {C}\nD) {D}"
)
#: The tail of a completion searched for the answer: the answer is at the end, and a bound keeps
#: grading linear on megabytes of output.
_TAIL_CHARS = 4000
_ANSWER_LINE = re.compile(
    r"answer\s*(?:is)?\s*[:：]?\s*[*_$\\(\[{ ]*(?:\\text\{)?\s*([A-D])\b(?![A-Za-z])", re.IGNORECASE
)
_BOXED_LETTER = re.compile(r"\\boxed\{\s*(?:\\text(?:bf)?\{)?\s*\(?([A-D])\)?\s*\}?\s*\}")


def extract_choice(completion: str) -> str | None:
    r"""Return the option letter a completion commits to, or None.

    >>> extract_choice("... so the second one.\nAnswer: B")
    'B'
    >>> extract_choice("The answer is (c).")
    'C'
    >>> extract_choice("Thus \\boxed{D}")
    'D'
    >>> extract_choice("A is wrong, C is wrong.") is None
    True
    """
    tail = completion[-_TAIL_CHARS:]
    lines = list(_ANSWER_LINE.finditer(tail))
    if lines:
        return lines[-1].group(1).upper()
    boxes = list(_BOXED_LETTER.finditer(tail))
    if boxes:
        return boxes[-1].group(1).upper()
    return None


def shuffled_options(row: Mapping[str, object], seed: int, where: str) -> tuple[list[str], str]:
    """Return the four options in their seeded order and the letter of the correct one."""
    correct = str(first_field(row, ("Correct Answer",), where)).strip()
    wrong = [str(first_field(row, (f"Incorrect Answer {i}",), where)).strip() for i in (1, 2, 3)]
    key = row.get("Record ID") or row.get("id") or str(first_field(row, ("Question",), where))
    options = [correct, *wrong]
    random.Random(f"{seed}/{key}").shuffle(options)
    return options, LETTERS[options.index(correct)]


def choice_correctness(ctx: ScoringContext) -> Judgement:
    """1 iff the extracted letter is the gold letter."""
    letter = extract_choice(ctx.completion)
    if letter is None:
        return Judgement(0.0, Outcome.UNPARSABLE, {"reason": "no 'Answer: LETTER' found"})
    ok = letter == ctx.sample.answer
    return Judgement(float(ok), Outcome.CORRECT if ok else Outcome.WRONG, {"extracted": letter})


class GPQAEnv(SingleTurnEnv):
    """GPQA multiple choice (``gpqa_diamond`` by default; ``config="gpqa_main"`` etc. work too).

    Args:
        data_path: a data file or folder in the hub's columns; default ``$GRPO_GPQA_DIR``.
        config / revision: the hub config and an optional pinned commit.
        seed: the option-shuffle seed (changing it changes every gold letter).
        template: the prompt, with ``{question}`` and ``{A}``..``{D}``.
        limit: keep only the first ``limit`` questions.
    """

    def __init__(
        self,
        *,
        data_path: str | os.PathLike[str] | None = None,
        config: str = "gpqa_diamond",
        revision: str | None = None,
        seed: int = 0,
        template: str = DEFAULT_TEMPLATE,
        limit: int | None = None,
    ) -> None:
        from dataclasses import replace

        self.source = replace(GPQA_DIAMOND, config=config, revision=revision)
        if config != "gpqa_diamond":
            self.source = replace(self.source, name=config)
        self.data_path, self.seed, self.template, self.limit = data_path, seed, template, limit
        self._where: dict[str, str] = {}
        component = RewardComponent("correct", 1.0, choice_correctness, bounded=True)
        super().__init__(
            rubric=Rubric([component]),
            reference=lambda sample: f"Answer: {sample.answer}",
            splits=("test", "train"),
        )

    def load_split(self, split: str) -> Iterator[Sample]:
        """Yield the questions with their options shuffled (one set under both split names)."""
        rows, self._where[split] = load_benchmark_rows(self.source, split, self.data_path)
        for index, row in enumerate(rows[: self.limit] if self.limit is not None else rows):
            where = f"{self.source.name} row {index}"
            options, gold = shuffled_options(row, self.seed, where)
            question = str(first_field(row, ("Question",), where)).strip()
            text = self.template.format(question=question, **dict(zip(LETTERS, options)))
            meta = {k: str(row[k]) for k in ("Subdomain", "High-level domain") if row.get(k)}
            yield Sample(
                id=f"{self.source.name}/{row.get('Record ID') or index}",
                prompt=user_prompt(text),
                answer=gold,
                metadata=meta,  # type: ignore[arg-type]
            )

    def data_source(self, split: str) -> str:
        """Where the rows of ``split`` came from."""
        self.dataset(split)
        return self._where.get(split, "cached")
