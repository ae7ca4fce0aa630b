"""Pieces shared by the built-in environments: prompts, held-out splits, answers, data files."""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import socket
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from grpo_envs.format import answer_tag, format_components, last_boxed
from grpo_envs.math.extract import MAX_SCAN_CHARS
from grpo_envs.math.statements import final_statement, settle_marked_answer
from grpo_envs.rubric import Judgement, RewardComponent, ScoringContext
from grpo_envs.types import DataUnavailableError, JSONValue, Message, Outcome, Sample

if TYPE_CHECKING:
    from grpo_envs.math import MathResult

# --- prompts ----------------------------------------------------------------------------------

BOXED_INSTRUCTION = "Give the final answer as \\boxed{N}."
THINK_ANSWER_INSTRUCTION = (
    "First think step by step inside <think> </think> tags, then give only the final answer "
    "inside <answer> </answer> tags."
)


def instruction(format_style: str, default: str = BOXED_INSTRUCTION) -> str:
    """Return the answer-format instruction that matches an environment's ``format`` option."""
    return THINK_ANSWER_INSTRUCTION if format_style == "think_answer" else default


def user_prompt(text: str) -> tuple[Message, ...]:
    """Return a one-message chat prompt."""
    return (Message("user", text),)


def reference_answer(format_style: str, answer: str) -> str:
    """Return a well-formed completion carrying ``answer`` in the style the prompt asks for."""
    if format_style == "think_answer":
        return f"<think>I know this.</think>\n<answer>{answer}</answer>"
    return f"The final answer is \\boxed{{{answer}}}."


def extra_components(format_style: str, format_weight: float) -> list[RewardComponent]:
    """Format components for the ``format``/``format_weight`` options every built-in env takes."""
    return format_components(format_style, format_weight)


# --- procedural splits ------------------------------------------------------------------------


@dataclass(frozen=True)
class Problem:
    """One generated problem: question text, gold answer, metadata."""

    question: str
    answer: str
    metadata: Mapping[str, JSONValue] = field(default_factory=dict)


#: One question in ``HELD_OUT_BUCKETS`` of 10 (by a hash of its text) belongs to the test split.
HELD_OUT_BUCKETS = 10


def is_held_out(question: str) -> bool:
    """Whether ``question`` belongs to the held-out (test) part of the question space.

    Partitioning the *question space* by a content hash makes train and test disjoint for any
    sizes and seeds, which a different seed stream alone does not (small spaces repeat).
    """
    digest = hashlib.sha256(question.encode("utf-8")).digest()
    return int.from_bytes(digest[:4], "big") % HELD_OUT_BUCKETS == 0


def procedural_split(
    generate: Callable[[random.Random], Problem],
    *,
    seed: int,
    split: str,
    size: int,
    max_tries: int = 10_000,
) -> Iterator[tuple[int, Problem]]:
    """``size`` problems for ``split``, deterministic per (seed, split, index).

    Problem ``i`` comes from ``Random(f"{seed}/{split}/{i}/{attempt}")`` (string seeds are hashed
    with SHA-512 by ``random``, stable across runs and platforms); attempts that land on the wrong
    side of ``is_held_out`` are redrawn, so test questions never occur in train.
    """
    if size <= 0:
        raise ValueError(f"split size must be positive, got {size}")
    want_held_out = split != "train"
    for index in range(size):
        for attempt in range(max_tries):
            problem = generate(random.Random(f"{seed}/{split}/{index}/{attempt}"))
            if is_held_out(problem.question) == want_held_out:
                yield index, problem
                break
        else:
            raise RuntimeError(
                f"could not draw a {split} problem in {max_tries} tries; the question space of "
                "this setting is too small (raise the difficulty)"
            )


def problem_sample(split: str, index: int, problem: Problem, prompt_suffix: str) -> Sample:
    """Return the ``Sample`` of a generated problem."""
    return Sample(
        id=f"{split}-{index}",
        prompt=user_prompt(f"{problem.question} {prompt_suffix}".strip()),
        answer=problem.answer,
        metadata=dict(problem.metadata),
    )


# --- answers ----------------------------------------------------------------------------------

_INTEGER = re.compile(r"[+-]?\d+(?:\.0+)?")


def final_answer(completion: str) -> str | None:
    r"""Return the final answer a completion commits to, or None.

    The last ``\boxed{}``, else the last ``<answer>`` block; no guessing from loose numbers.
    """
    return last_boxed(completion) or answer_tag(completion)


def parse_integer(text: str) -> int | None:
    """``text`` as an integer, tolerating ``$``, spaces, thousands commas and ``.0``; else None."""
    cleaned = text.strip().strip("$").replace(",", "").replace(" ", "").rstrip(".")
    cleaned = cleaned.removeprefix("\\$")
    if len(cleaned) > 100 or not _INTEGER.fullmatch(cleaned):
        return None
    return int(cleaned.split(".", 1)[0])


def loose_final_answer(completion: str) -> str | None:
    r"""Return the committed final answer (``final_answer``), else the final stated number.

    For models that state their answer in prose ("3 + 2 = 5"). Both follow the math verifier's
    loose precedence (``grpo_envs.math.extract``'s docstring, the one statement of it): a box is
    settled by what follows it (a correction replaces it, a refuted guess or a hedge leaves no
    answer), and without one the final stated answer (``final_statement``) counts, so listing
    many numbers, checking a result afterwards, hedging between two or stopping mid-correction
    earns nothing.
    """
    text = completion[-MAX_SCAN_CHARS:]
    committed = final_answer(completion)
    if committed is not None:
        # A box that is only a guess, or that a correction after it replaces, is settled by the
        # same precedence as the verifier's (``grpo_envs.math.extract``).
        return settle_marked_answer(text, committed)
    return final_statement(text)


def _judge_integer(extracted: str | None, gold_text: str) -> Judgement:
    if extracted is None:
        return Judgement(0.0, Outcome.UNPARSABLE, {"reason": "no final answer found"})
    value = parse_integer(extracted)
    gold = parse_integer(gold_text)
    if gold is None:
        raise ValueError(f"gold answer {gold_text!r} is not an integer")
    details = {"extracted": extracted[:200]}
    if value is None:
        return Judgement(0.0, Outcome.WRONG, {**details, "reason": "answer is not an integer"})
    return Judgement(
        float(value == gold), Outcome.CORRECT if value == gold else Outcome.WRONG, details
    )


def integer_correctness(ctx: ScoringContext) -> Judgement:
    """1.0 iff the committed final answer (boxed / ``<answer>``) is the gold integer.

    Integer answers need no symbolic equivalence, so this avoids sympy entirely: fast, and no
    false positive is possible beyond formatting (commas, ``$``, ``.0``).
    """
    return _judge_integer(final_answer(ctx.completion), ctx.sample.answer)


def loose_integer_correctness(ctx: ScoringContext) -> Judgement:
    """Like ``integer_correctness``, but a final answer stated in prose counts too."""
    return _judge_integer(loose_final_answer(ctx.completion), ctx.sample.answer)


def math_correctness(timeout_s: float, strict: bool) -> RewardComponent:
    """Return a ``correct`` component judged by ``grpo_envs.math.verify`` (imported lazily)."""

    def judge(result: MathResult) -> Judgement:
        details = {
            "extracted": None if result.extracted is None else result.extracted[:200],
            "detail": result.detail[:200],
        }
        return Judgement(1.0 if result.correct else 0.0, result.outcome, details)

    def fn(ctx: ScoringContext) -> Judgement:
        from grpo_envs.math import verify

        if ctx.parsed is None:
            return Judgement(0.0, Outcome.UNPARSABLE, {"reason": "nothing to verify"})
        return judge(verify(ctx.sample.answer, ctx.parsed, timeout_s=timeout_s, strict=strict))

    def batch_fn(contexts: Sequence[ScoringContext]) -> list[Judgement]:
        from grpo_envs.math import verify_batch

        results = verify_batch(
            [c.sample.answer for c in contexts],
            [c.parsed or "" for c in contexts],
            timeout_s=timeout_s,
            strict=strict,
        )
        return [judge(r) for r in results]

    # verify bounds each item (killable sympy workers): no extra time limit needed.
    return RewardComponent("correct", 1.0, fn, batch_fn, bounded=True)


# --- data files -------------------------------------------------------------------------------


def hub_reachable(timeout: float = 3.0) -> bool:
    """Return whether the Hugging Face hub answers a TCP connection within ``timeout`` seconds.

    False when offline mode is already set (``HF_HUB_OFFLINE``); True when a proxy is configured
    (a direct connection would prove nothing).
    """
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0") or os.environ.get(
        "HF_DATASETS_OFFLINE", "0"
    ) not in ("", "0"):
        return False
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True
    endpoint = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    host, port = endpoint.hostname or "huggingface.co", endpoint.port or 443
    answer: list[bool] = []

    def probe() -> None:  # in a thread: name resolution has no timeout of its own
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            answer.append(True)
        except OSError:
            answer.append(False)

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout)
    return bool(answer and answer[0])


def _set_hub_offline() -> None:
    """Switch huggingface_hub and datasets to their cache-only mode, imported or not."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    for module, name in (
        ("huggingface_hub.constants", "HF_HUB_OFFLINE"),
        ("datasets.config", "HF_HUB_OFFLINE"),
        ("datasets.config", "HF_DATASETS_OFFLINE"),
    ):
        loaded = sys.modules.get(module)
        if loaded is not None and hasattr(loaded, name):
            setattr(loaded, name, True)


def load_records(
    *,
    data_path: str | os.PathLike[str] | None,
    env_var: str,
    hub_id: str,
    hub_config: str | None,
    split: str,
) -> list[dict[str, object]]:
    """Return the raw records of ``split``: ``data_path``, else ``$env_var``, else the HF hub.

    A local source is a folder holding ``{split}.jsonl`` (or ``.json`` lines / ``.parquet``).
    """
    source = data_path if data_path is not None else os.environ.get(env_var)
    if source:
        folder = Path(source)
        if not folder.is_dir():
            raise FileNotFoundError(f"{folder} is not a folder (expected {split}.jsonl inside it)")
        for suffix in (".jsonl", ".json"):
            path = folder / f"{split}{suffix}"
            if path.is_file():
                with path.open(encoding="utf-8") as fh:
                    return [json.loads(line) for line in fh if line.strip()]
        parquet = folder / f"{split}.parquet"
        if parquet.is_file():
            import datasets

            return list(datasets.Dataset.from_parquet(str(parquet)))  # type: ignore[arg-type]
        raise FileNotFoundError(f"no {split}.jsonl or {split}.parquet in {folder}")
    offline = not hub_reachable()
    if offline:
        # No route to the hub: use the local datasets cache only, at once, instead of letting
        # every request retry for tens of seconds before the same error.
        _set_hub_offline()
    import datasets

    try:
        loaded = datasets.load_dataset(hub_id, hub_config, split=split)
    except Exception as exc:
        if offline:
            raise DataUnavailableError(
                f"the Hugging Face hub is not reachable (offline?) and {hub_id!r} split "
                f"{split!r} is not in the local cache; point ${env_var} or data_path= at a "
                f"folder holding {split}.jsonl"
            ) from None
        raise DataUnavailableError(
            f"could not load {hub_id!r} split {split!r} from the Hugging Face hub "
            f"({type(exc).__name__}: {exc}); offline, point ${env_var} or data_path= at a folder "
            f"holding {split}.jsonl"
        ) from exc
    return list(loaded)  # type: ignore[arg-type]
