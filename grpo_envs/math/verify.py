"""``verify`` / ``verify_batch``: check a completion's final answer against the gold answer.

The pipeline per item: extract the gold answer and the completion's answer (``extract``), parse
both into typed trees (``normalize``), compare in-process with exact number arithmetic
(``FastComparator``), and only when that cannot decide, send the pair to a killable sympy worker
(``pool``) with a timeout. Bad gold or completion values never raise: every failure is an
``Outcome``. Caller bugs (misaligned lists, a non-positive timeout) raise ``ValueError``.

Model text never yields ``Outcome.ERROR``: ERROR means the gold answer or the verifier itself
failed, and the trainer leaves such items out of its baseline and loss. Whatever the completion
holds (huge numbers, deep nesting, invalid Unicode, megabytes of text, expressions sympy cannot
handle), its answer is CORRECT, WRONG (an answer that makes the extraction, the parser or sympy
fail is wrong, the failure kept in ``detail``), UNPARSABLE or TIMEOUT (the comparison ran out of
time: a typed verdict, scored 0 like a wrong answer).
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from grpo_envs.math.answer_tree import AnswerRejected, Choice, Node
from grpo_envs.math.duration import duration_seconds, same_duration
from grpo_envs.math.equivalence import FastComparator, NeedsSymbolic, compare
from grpo_envs.math.extract import extract_answer, gold_answer, listed_options
from grpo_envs.math.normalize import gold_choice, parse_answer
from grpo_envs.math.pool import ReplyStatus, WorkerReply, default_workers, get_pool
from grpo_envs.types import Outcome


@dataclass(frozen=True)
class MathResult:
    """The verdict on one completion.

    ``correct``: the extracted answer equals the gold answer. ``extracted``: the answer found in the
    completion (None when there was none). ``outcome``: CORRECT, WRONG, UNPARSABLE (no answer
    found), TIMEOUT (the comparison ran out of time; counted as not correct) or ERROR (bad gold or
    a failure of the verifier itself, never caused by the completion's text). ``detail``: a short
    reason for logs.
    """

    correct: bool
    extracted: str | None
    outcome: Outcome
    detail: str = ""


@dataclass(frozen=True)
class _Pending:
    """An item the fast path could not decide: goes to a sympy worker."""

    gold: Node
    pred: Node
    extracted: str


_FAST = FastComparator()
_HAS_LETTER = re.compile(r"[A-Za-z]")
_LETTER = re.compile(r"(?<![A-Za-z\\])[A-J](?![A-Za-z])")


@functools.lru_cache(maxsize=8192)
def _gold_node(gold: str) -> Node | str:
    """Parse the gold answer, or return an error message (cached: GRPO reuses each gold)."""
    answer = gold_answer(gold)
    if answer is None:
        return "the gold answer is empty or has no final answer"
    letter = gold_choice(answer)
    if letter is not None:
        return Choice(letter)
    try:
        return parse_answer(answer)
    except AnswerRejected as exc:
        return f"the gold answer cannot be used: {exc}"


@functools.lru_cache(maxsize=8192)
def _gold_duration(gold: str) -> str | None:
    """Return the gold answer when it is a length of time with its unit ("90 minutes")."""
    if not _HAS_LETTER.search(gold):
        return None  # a plain number (most golds) names no unit: skip the extraction
    answer = gold_answer(gold)
    return answer if answer is not None and duration_seconds(answer) is not None else None


def _prepare(gold: str, completion: str, strict: bool) -> MathResult | _Pending:
    """Parse the gold (its failures are ERROR: the data's fault) and judge the completion.

    Whatever the completion holds, its side never yields ERROR: an answer that makes the
    extraction or the parser fail is WRONG, with the failure in ``detail``.
    """
    if not isinstance(gold, str) or not isinstance(completion, str):
        return MathResult(
            False,
            None,
            Outcome.ERROR,
            f"gold and completion must be str, got {type(gold).__name__} and "
            f"{type(completion).__name__}",
        )
    try:
        gold_node = _gold_node(gold)
        duration_gold = _gold_duration(gold)
    except Exception as exc:  # a bug on the gold's side must cost one sample, not the run
        return MathResult(False, None, Outcome.ERROR, _failure("the gold answer", exc))
    if isinstance(gold_node, str):
        return MathResult(False, None, Outcome.ERROR, gold_node)
    try:
        return _judge(gold_node, duration_gold, completion, strict)
    except Exception as exc:
        return MathResult(False, None, Outcome.WRONG, _failure("the answer", exc))


def _failure(what: str, exc: Exception) -> str:
    return f"{what} could not be checked: {type(exc).__name__}: {exc}"[:300]


def _judge(
    gold_node: Node, duration_gold: str | None, completion: str, strict: bool
) -> MathResult | _Pending:
    extracted = extract_answer(completion, strict=strict)
    if extracted is None:
        return MathResult(False, None, Outcome.UNPARSABLE, "no final answer found")
    if duration_gold is not None:
        # 1.5 hours against 1:30 or 90 minutes: compared as lengths of time (``duration``).
        same = same_duration(duration_gold, extracted, completion)
        if same is not None:
            return _verdict(same, extracted, "duration")
    try:
        pred = parse_answer(extracted, choice=isinstance(gold_node, Choice))
        pred = _as_listed_option(gold_node, pred, extracted, completion)
    except AnswerRejected as exc:
        return MathResult(False, extracted, Outcome.WRONG, str(exc))
    except Exception as exc:
        return MathResult(False, extracted, Outcome.WRONG, _failure("the answer", exc))
    try:
        equal = compare(gold_node, pred, _FAST)
    except NeedsSymbolic:
        return _Pending(gold_node, pred, extracted)
    except Exception as exc:
        return MathResult(False, extracted, Outcome.WRONG, _failure("the answer", exc))
    return _verdict(equal, extracted, "exact")


def _as_listed_option(gold: Node, pred: Node, extracted: str, completion: str) -> Node:
    r"""Translate between an option's letter and its value when the completion lists the options.

    A letter gold answered by a value ("(C) 12" listed, ``\boxed{12}`` given) becomes that letter
    when exactly one listed option equals the value exactly; a value gold answered by a letter
    becomes the letter's listed value. Without a listing (or with two matching options) the
    answer is compared as given.
    """
    letter = gold_choice(extracted) if len(extracted) <= 40 and _LETTER.search(extracted) else None
    if isinstance(gold, Choice) == isinstance(pred, Choice) and letter is None:
        return pred
    options = listed_options(completion)
    if not options:
        return pred
    if not isinstance(gold, Choice):
        if letter is None or letter not in options:
            return pred
        return parse_answer(options[letter])
    matches = [k for k, text in options.items() if _exactly_equal(text, pred)]
    return Choice(matches[0]) if len(matches) == 1 else pred


def _exactly_equal(option: str, pred: Node) -> bool:
    try:
        return compare(parse_answer(option), pred, _FAST)
    except (AnswerRejected, NeedsSymbolic):
        return False


def _verdict(equal: bool, extracted: str, how: str) -> MathResult:
    if equal:
        return MathResult(True, extracted, Outcome.CORRECT, how)
    return MathResult(False, extracted, Outcome.WRONG, how)


def _finish(pending: _Pending, reply: WorkerReply) -> MathResult:
    if reply.status is ReplyStatus.OK:
        if not reply.compared:  # sympy failed on this answer: the answer's fault, not ours
            return MathResult(False, pending.extracted, Outcome.WRONG, reply.detail)
        return _verdict(reply.equal, pending.extracted, "sympy")
    outcome = Outcome.TIMEOUT if reply.status is ReplyStatus.TIMEOUT else Outcome.ERROR
    return MathResult(False, pending.extracted, outcome, reply.detail)


def _check_timeout(timeout_s: float) -> None:
    if not (isinstance(timeout_s, int | float) and 0 < timeout_s < math.inf):
        raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")


def _safe_prepare(gold: str, completion: str, strict: bool) -> MathResult | _Pending:
    try:
        return _prepare(gold, completion, strict)
    except Exception as exc:  # a bug here must cost one sample, not the training run
        return MathResult(False, None, Outcome.ERROR, f"{type(exc).__name__}: {exc}"[:300])


def verify(
    gold: str, completion: str, timeout_s: float = 5.0, *, strict: bool = False
) -> MathResult:
    r"""Check the final answer of ``completion`` against ``gold``.

    Args:
        gold: the gold answer: a bare answer (``"72"``, ``"\frac{1}{2}"``), a GSM8K solution
            ending in ``#### 72``, or a solution with a ``\boxed{}`` answer.
        completion: the model's text.
        timeout_s: the most seconds of sympy work this item may use; safe from any thread.
        strict: accept only ``<answer>`` tags, ``\boxed{}`` or ``#### N`` (see ``extract``).

    Returns:
        A ``MathResult``; bad gold/completion values give an ERROR result, not an exception.

    Raises:
        ValueError: ``timeout_s`` is not a positive number (a caller bug).

    >>> verify("#### 1,000", "So the total is $1000.").correct
    True
    >>> verify("0.5", "The answer is 1/3.").outcome.value
    'wrong'
    """
    _check_timeout(timeout_s)
    prepared = _safe_prepare(gold, completion, strict)
    if isinstance(prepared, MathResult):
        return prepared
    return _finish(prepared, get_pool().compare(prepared.gold, prepared.pred, timeout_s))


def verify_batch(
    golds: Sequence[str],
    completions: Sequence[str],
    timeout_s: float = 5.0,
    *,
    strict: bool = False,
    workers: int | None = None,
) -> list[MathResult]:
    """``verify`` over aligned lists, with the sympy items spread over ``workers`` processes.

    Plain-number items are decided in this process (microseconds each); the rest run concurrently
    in the worker pool, each within ``timeout_s``. ``workers`` defaults to the usable CPU count.

    Raises:
        ValueError: ``golds`` and ``completions`` differ in length, or ``timeout_s`` or
            ``workers`` is not positive (caller bugs).
    """
    _check_timeout(timeout_s)
    if len(golds) != len(completions):
        raise ValueError(
            f"verify_batch needs one gold per completion, got {len(golds)} golds and "
            f"{len(completions)} completions"
        )
    n_workers = workers if workers is not None else default_workers()
    if n_workers < 1:
        raise ValueError(f"workers must be >= 1, got {n_workers}")
    results: list[MathResult | None] = []
    pending: list[tuple[int, _Pending]] = []
    for i, (gold, completion) in enumerate(zip(golds, completions)):
        prepared = _safe_prepare(gold, completion, strict)
        if isinstance(prepared, _Pending):
            pending.append((i, prepared))
            results.append(None)
        else:
            results.append(prepared)
    if pending:
        pool = get_pool(n_workers)

        def run(item: tuple[int, _Pending]) -> tuple[int, MathResult]:
            i, p = item
            return i, _finish(p, pool.compare(p.gold, p.pred, timeout_s))

        with ThreadPoolExecutor(max_workers=min(n_workers, len(pending))) as executor:
            for i, result in executor.map(run, pending):
                results[i] = result
    return [
        r if r is not None else MathResult(False, None, Outcome.ERROR, "not scored")
        for r in results
    ]
