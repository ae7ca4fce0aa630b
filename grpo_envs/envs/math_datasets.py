r"""``math/gsm8k-v0`` and ``math/math500-v0``: fixed benchmark sets scored by ``grpo_envs.math``.

Data sources, in order: the ``data_path=`` argument, the environment variable (``GRPO_GSM8K_DIR``,
``GRPO_MATH500_DIR``), else the Hugging Face hub (``openai/gsm8k`` config ``main``,
``HuggingFaceH4/MATH-500``). A local source is a folder holding ``{split}.jsonl`` with the hub's
columns (GSM8K: ``question``, ``answer`` ending in ``#### N``; MATH-500: ``problem``, ``answer``,
optional ``subject``, ``level``, ``unique_id``). Both are compositions (``SingleTurnEnv`` of
records and the ``verify`` rubric), not subclasses.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping

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


def _math_env(
    *,
    hub_id: str,
    hub_config: str | None,
    env_var: str,
    splits: tuple[str, ...],
    sample_of: Callable[[str, int, Mapping[str, object], str], Sample],
    data_path: str | os.PathLike[str] | None,
    format: str,
    format_weight: float,
    timeout_s: float,
    strict: bool,
    limit: int | None,
) -> SingleTurnEnv:
    """Compose a benchmark's ``SingleTurnEnv``: records per split, the verify rubric."""
    suffix = instruction(format, MATH_INSTRUCTION)

    def source(split: str) -> Callable[[], Iterator[Sample]]:
        def samples() -> Iterator[Sample]:
            records = load_records(
                data_path=data_path,
                env_var=env_var,
                hub_id=hub_id,
                hub_config=hub_config,
                split=split,
            )
            for index, record in enumerate(records[:limit] if limit is not None else records):
                yield sample_of(split, index, record, suffix)

        return samples

    return SingleTurnEnv(
        {split: source(split) for split in splits},
        Rubric([math_correctness(timeout_s, strict), *extra_components(format, format_weight)]),
        reference=lambda sample: reference_answer(format, sample.answer),
    )


def _gsm8k_sample(split: str, index: int, record: Mapping[str, object], suffix: str) -> Sample:
    solution = str(record["answer"])
    return Sample(
        id=f"{split}-{index}",
        prompt=user_prompt(f"{record['question']}\n\n{suffix}"),
        answer=gsm8k_gold(solution),
        metadata={"solution": solution},
    )


def _math500_sample(split: str, index: int, record: Mapping[str, object], suffix: str) -> Sample:
    meta = {k: record[k] for k in ("subject", "level") if k in record}
    return Sample(
        id=str(record.get("unique_id") or f"{split}-{index}"),
        prompt=user_prompt(f"{record['problem']}\n\n{suffix}"),
        answer=str(record["answer"]),
        metadata=meta,  # type: ignore[arg-type]
    )


def gsm8k_env(
    data_path: str | os.PathLike[str] | None = None,
    format: str = "none",
    format_weight: float = 0.0,
    timeout_s: float = 5.0,
    strict: bool = False,
    limit: int | None = None,
) -> SingleTurnEnv:
    """Build GSM8K, grade-school math word problems (Cobbe et al. 2021), integer answers.

    Args:
        data_path: a folder with ``{split}.jsonl``; default ``$GRPO_GSM8K_DIR``, else the hub.
        format: ``none``, ``boxed`` or ``think_answer`` (prompt instruction + format component).
        format_weight: the format component's weight (0: logged only).
        timeout_s: per-answer bound passed to ``grpo_envs.math.verify``.
        strict: ``verify``'s strict mode.
        limit: keep only the first ``limit`` rows of each split (quick runs).
    """
    return _math_env(
        hub_id="openai/gsm8k",
        hub_config="main",
        env_var="GRPO_GSM8K_DIR",
        splits=("train", "test"),
        sample_of=_gsm8k_sample,
        data_path=data_path,
        format=format,
        format_weight=format_weight,
        timeout_s=timeout_s,
        strict=strict,
        limit=limit,
    )


def math500_env(
    data_path: str | os.PathLike[str] | None = None,
    format: str = "none",
    format_weight: float = 0.0,
    timeout_s: float = 5.0,
    strict: bool = False,
    limit: int | None = None,
) -> SingleTurnEnv:
    """Build MATH-500, the MATH subset of "Let's Verify Step by Step" (Lightman et al. 2023).

    One ``test`` split; the arguments are ``gsm8k_env``'s (``$GRPO_MATH500_DIR``).
    """
    return _math_env(
        hub_id="HuggingFaceH4/MATH-500",
        hub_config=None,
        env_var="GRPO_MATH500_DIR",
        splits=("test",),
        sample_of=_math500_sample,
        data_path=data_path,
        format=format,
        format_weight=format_weight,
        timeout_s=timeout_s,
        strict=strict,
        limit=limit,
    )
