r"""``math/gsm8k-v0`` and ``math/math500-v0``: fixed benchmark sets scored by ``grpo_envs.math``.

Data sources, in order: the ``data_path=`` argument, the environment variable (``GRPO_GSM8K_DIR``,
``GRPO_MATH500_DIR``), else the Hugging Face hub (``openai/gsm8k`` config ``main``,
``HuggingFaceH4/MATH-500``). A local source is a folder holding ``{split}.jsonl`` with the hub's
columns (GSM8K: ``question``, ``answer`` ending in ``#### N``; MATH-500: ``problem``, ``answer``,
optional ``subject``, ``level``, ``unique_id``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from grpo_envs.base import SingleTurnEnv
from grpo_envs.envs._common import (
    extra_components,
    instruction,
    load_records,
    math_correctness,
    reference_answer,
    user_prompt,
)
from grpo_envs.rubric import Rubric
from grpo_envs.types import Sample

MATH_INSTRUCTION = "Put your final answer within \\boxed{}."


def gsm8k_gold(solution: str) -> str:
    """Return a GSM8K solution's final answer: the text after ``####``, without commas."""
    if "####" not in solution:
        raise ValueError(f"GSM8K solution has no '#### answer' line: {solution[-80:]!r}")
    return solution.rsplit("####", 1)[1].strip().replace(",", "")


class _MathDatasetEnv(SingleTurnEnv):
    """Shared constructor: data source, answer format, verifier options."""

    hub_id: str = ""
    hub_config: str | None = None
    env_var: str = ""

    def __init__(
        self,
        data_path: str | os.PathLike[str] | None = None,
        format: str = "none",
        format_weight: float = 0.0,
        timeout_s: float = 5.0,
        strict: bool = False,
        limit: int | None = None,
    ) -> None:
        """Configure the environment.

        Args:
            data_path: a folder with ``{split}.jsonl``; default ``$env_var``, else the hub.
            format: ``none``, ``boxed`` or ``think_answer`` (prompt instruction + format component).
            format_weight: the format component's weight (0: logged only).
            timeout_s: per-answer bound passed to ``grpo_envs.math.verify``.
            strict: ``verify``'s strict mode.
            limit: keep only the first ``limit`` rows of each split (quick runs).
        """
        super().__init__()
        self.data_path, self.format, self.limit = data_path, format, limit
        self.rubric = Rubric(
            [math_correctness(timeout_s, strict), *extra_components(format, format_weight)]
        )

    def _records(self, split: str) -> list[dict[str, object]]:
        records = load_records(
            data_path=self.data_path,
            env_var=self.env_var,
            hub_id=self.hub_id,
            hub_config=self.hub_config,
            split=split,
        )
        return records[: self.limit] if self.limit is not None else records

    def reference_completion(self, sample: Sample) -> str:
        """Return the gold answer in the requested format."""
        return reference_answer(self.format, sample.answer)


class GSM8KEnv(_MathDatasetEnv):
    """Grade-school math word problems (Cobbe et al. 2021), integer answers."""

    hub_id, hub_config, env_var = "openai/gsm8k", "main", "GRPO_GSM8K_DIR"

    def load_split(self, split: str) -> Iterator[Sample]:
        """Rows of the GSM8K ``split``."""
        suffix = instruction(self.format, MATH_INSTRUCTION)
        for index, record in enumerate(self._records(split)):
            solution = str(record["answer"])
            yield Sample(
                id=f"{split}-{index}",
                prompt=user_prompt(f"{record['question']}\n\n{suffix}"),
                answer=gsm8k_gold(solution),
                metadata={"solution": solution},
            )


class MATH500Env(_MathDatasetEnv):
    """The 500-problem MATH subset of "Let's Verify Step by Step" (Lightman et al. 2023)."""

    hub_id, env_var = "HuggingFaceH4/MATH-500", "GRPO_MATH500_DIR"
    splits = ("test",)

    def load_split(self, split: str) -> Iterator[Sample]:
        """Rows of MATH-500 (one ``test`` split)."""
        suffix = instruction(self.format, MATH_INSTRUCTION)
        for index, record in enumerate(self._records(split)):
            meta = {k: record[k] for k in ("subject", "level") if k in record}
            yield Sample(
                id=str(record.get("unique_id") or f"{split}-{index}"),
                prompt=user_prompt(f"{record['problem']}\n\n{suffix}"),
                answer=str(record["answer"]),
                metadata=meta,  # type: ignore[arg-type]
            )
