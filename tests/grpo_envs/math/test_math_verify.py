"""Tests for grpo_envs.math: extraction, equivalence, timeouts and the labeled benchmark set."""

from __future__ import annotations

import json
import multiprocessing
import random
import threading
import time
from pathlib import Path

import pytest
from scan_work import assert_linear  # tests/grpo_envs is on sys.path (its conftest)

from grpo_envs.math import MathResult, extract_answer, verify, verify_batch
from grpo_envs.math.pool import get_pool
from grpo_envs.math.verify import _safe_prepare
from grpo_envs.types import Outcome

CASES = Path(__file__).resolve().parents[3] / "benchmarks" / "data" / "math_verify_cases.jsonl"

# --- extraction -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("completion", "strict", "expected"),
    [
        (r"so $\boxed{\frac{1}{2}}$", False, r"\frac{1}{2}"),
        (r"first \boxed{5}, then \boxed{\{1, \{2\}\}}", True, r"\{1, \{2\}\}"),
        (r"The result is \fbox{7}.", True, "7"),
        (r"\boxed 5 is it", True, "5"),
        ("<think>\n2+2\n</think>\n<answer> 4 </answer>", True, "4"),
        ("<answer>\\boxed{12}</answer>", True, "12"),
        ("<answer>3 + 4 = 7\n#### 7</answer>", True, "7"),
        ("<answer>The answer is 2.</answer>", False, "2"),
        ("3 + 4 = 7\n#### 7", True, "7"),
        ("The answer is 12.", True, None),
        ("The answer is 12.", False, "12"),
        ("The final answer is $\\frac{3}{4}$. I hope it is correct.", False, r"\frac{3}{4}"),
        ("Final Answer: The final answer is $8$. I hope it is correct.", False, "8"),
        ("So the answer is \\(10\\).", False, "10"),
        ("The answer is $\\$18.09$ today.", False, r"\$18.09"),
        ("Answer: 15", False, "15"),
        ("she has **15** apples left.", False, "15"),
        ("**Final Answer:** 1,234", False, "1,234"),
        ("<think>\nmaybe \\boxed{3}\n</think>\nThe answer is 4.", False, "4"),
        ("<think>\nlong thoughts\n</think>\n\n42", False, "42"),
        ("6 x 5 = 30 eggs in total.", False, "30"),
        ("6 x 5 = 30 eggs in total.", True, None),
        ("The answer is 5, which is prime.", False, "5"),
        (r"only \boxed{3 unclosed", True, None),
        ("", False, None),
        ("no numbers here", False, None),
    ],
)
def test_extract_answer(completion: str, strict: bool, expected: str | None) -> None:
    assert extract_answer(completion, strict=strict) == expected


def test_extract_prefers_complete_earlier_box_over_truncated_last() -> None:
    assert extract_answer(r"\boxed{2} then \boxed{3", strict=True) == "2"


# --- equivalence ----------------------------------------------------------------------------

EQUAL = [
    ("#### 72", "The answer is 72."),
    ("Janet sells 9 eggs.\n#### 1,000", "She makes $1000 a day.\n#### 1000"),
    ("1000000", r"\boxed{1,000,000}"),
    ("1000", r"\boxed{1\,000}"),
    (r"\frac{3}{4}", r"\boxed{0.75}"),
    (r"\frac{1}{3}", r"\boxed{0.3333333}"),
    (r"2\frac{1}{4}", r"\boxed{2.25}"),
    (r"-\frac{5}{2}", r"\boxed{-2\frac{1}{2}}"),
    (r"10\%", r"\boxed{10}"),
    (r"10\%", r"\boxed{0.1}"),
    (r"\$18.90", r"\boxed{18.9}"),
    (r"45^\circ", r"\boxed{45}"),
    (r"5\text{ cm}", r"\boxed{5}"),
    (r"6\pi", r"\boxed{6\pi\text{ square units}}"),
    (r"2\sqrt{3}", r"\boxed{\sqrt{12}}"),
    (r"4\sqrt{2}", r"\boxed{4\sqrt(2)}"),
    (r"\frac{\sqrt{2}}{2}", r"\boxed{\frac{1}{\sqrt{2}}}"),
    (r"\frac{\pi}{4}", r"\boxed{0.25\pi}"),
    (r"1-\frac{1}{e}", r"\boxed{\frac{e-1}{e}}"),
    ("x^2+2x+1", r"\boxed{(x+1)^2}"),
    ("y=2x+1", r"\boxed{y = 1+2x}"),
    ("y=2x+1", r"\boxed{2x - y + 1 = 0}"),
    (r"x \ge 3", r"\boxed{3 \le x}"),
    ("x=5", r"\boxed{5}"),
    ("5", r"\boxed{x = 5}"),
    (r"\{1,2,3\}", r"\boxed{\{3,2,1\}}"),
    ("-2, 5", r"\boxed{5 \text{ or } -2}"),
    (r"\pm 3", r"\boxed{-3, 3}"),
    ("(1,2)", r"\boxed{\left(1, 2\right)}"),
    ("[2,5)", r"\boxed{[2, 5)}"),
    (r"(-\infty, -1) \cup (1, \infty)", r"\boxed{(1,\infty)\cup(-\infty,-1)}"),
    (
        r"\begin{pmatrix} 1 & 2 \\ 3 & 4 \end{pmatrix}",
        r"\boxed{\begin{bmatrix}1&2\\3&4\end{bmatrix}}",
    ),
    (r"\begin{pmatrix} -1 \\ 2 \end{pmatrix}", r"\boxed{(-1, 2)}"),
    (r"\text{Monday}", "The answer is monday."),
    (r"\text{(C)}", "The answer is (C) 42."),
    ("B", r"\boxed{\textbf{(B)}}"),
    ("E", "The answer is E) 1/2"),
    ("1024", r"\boxed{2^{10}}"),
    ("120", r"\boxed{5!}"),
    (r"\frac{1}{2004!}", r"\boxed{1/2004!}"),
]

# Wrong answers, including cases Math-Verify 0.9 is known to accept wrongly.
NOT_EQUAL = [
    (r"\frac{1}{2004!}", r"\boxed{\frac{1}{2006!}}"),
    ("2021", r"\boxed{\pm 2021}"),
    (r"1-\frac{1}{e}", r"\boxed{1+\frac{1}{e}}"),
    ("4", r"\boxed{4\sqrt(2)}"),
    (r"\frac{1}{3}", "The answer is 0.33."),
    ("1000000", r"\boxed{1000001}"),
    ("1000000", r"\boxed{1000001.0}"),
    ("1.000001", r"\boxed{1}"),
    (r"\sqrt{2}", r"\boxed{1.41}"),
    (r"\pi", "The answer is 3.14."),
    ("(1,2)", r"\boxed{(2,1)}"),
    ("10, 4, -2", r"\boxed{4, 10, -2}"),  # a bare list is an ordered answer
    ("(2,1)", r"\boxed{(3,1)}"),  # both empty intervals to latex2sympy
    (r"\{1,2\}", r"\boxed{(1,2)}"),
    ("(1, 3)", r"\boxed{[1,3]}"),
    ("[2,5)", r"\boxed{[2,5]}"),
    (r"(-\infty, 3]", r"\boxed{(-\infty, 3)}"),
    (r"\text{Monday}", "The answer is Dynamo."),
    ("y=2x+1", r"\boxed{y=2x-1}"),
    (r"x \ge 3", r"\boxed{x > 3}"),
    ("x+1", r"\boxed{x-1}"),
    ("3x-2", r"\boxed{3y-2}"),
    ("2", r"\boxed{2x}"),
    ("B", "The answer is (C) 12."),
    ("0.5", "The answer is 5."),
    (r"\infty", r"\boxed{-\infty}"),
    (
        r"\begin{pmatrix} 1 & 2 \\ 3 & 4 \end{pmatrix}",
        r"\boxed{\begin{pmatrix} 1 & 3 \\ 2 & 4 \end{pmatrix}}",
    ),
    ("16", r"\boxed{2^{2^{3}}}"),
    ("5", r"\boxed{10^{10^{10}}}"),
]


@pytest.mark.parametrize(("gold", "completion"), EQUAL)
def test_equal_answers_are_correct(gold: str, completion: str) -> None:
    result = verify(gold, completion, timeout_s=20)
    assert result.correct, result
    assert result.outcome is Outcome.CORRECT


@pytest.mark.parametrize(("gold", "completion"), NOT_EQUAL)
def test_wrong_answers_are_never_correct(gold: str, completion: str) -> None:
    result = verify(gold, completion, timeout_s=20)
    assert not result.correct, result
    assert result.outcome is Outcome.WRONG


def test_strict_and_flexible_differ() -> None:
    completion = "She has 20 - 5 = 15 apples. The answer is 15."
    assert verify("15", completion).correct
    strict = verify("15", completion, strict=True)
    assert strict.outcome is Outcome.UNPARSABLE and not strict.correct


def test_failures_are_typed_results() -> None:
    assert verify("7", "I don't know.").outcome is Outcome.UNPARSABLE
    empty_gold = verify("   ", r"\boxed{7}")
    assert empty_gold.outcome is Outcome.ERROR and "gold" in empty_gold.detail
    bad_type = verify(7, "7")  # type: ignore[arg-type]
    assert bad_type.outcome is Outcome.ERROR and "str" in bad_type.detail
    assert isinstance(verify("7", r"\boxed{7}"), MathResult)


# --- hostile inputs and timeouts -------------------------------------------------------------

HANGS = (r"\sqrt{2}", r"\boxed{9^{9^{9^9}}}")  # not a plain-number gold: must reach sympy


def _ready_workers(n: int = 1) -> None:
    # Worker start-up (importing sympy) is not charged to any item; make sure it is over so the
    # clock below measures the timeout path only.
    get_pool(n).warm_up()


def test_timeout_returns_within_bound_and_worker_recovers() -> None:
    _ready_workers()
    start = time.monotonic()
    result = verify(*HANGS, timeout_s=1.0)
    elapsed = time.monotonic() - start
    assert result.outcome is Outcome.TIMEOUT and not result.correct
    assert elapsed < 3.0  # 1 s of work + slack on a loaded 2-core machine
    assert verify(r"\sqrt{2}", r"\boxed{\frac{2}{\sqrt{2}}}", timeout_s=20).correct


def test_timeout_works_from_a_non_main_thread() -> None:
    _ready_workers()
    box: list[tuple[MathResult, float]] = []

    def work() -> None:
        start = time.monotonic()
        box.append((verify(*HANGS, timeout_s=1.0), time.monotonic() - start))

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(timeout=30)
    assert not thread.is_alive()
    result, elapsed = box[0]
    assert result.outcome is Outcome.TIMEOUT
    assert elapsed < 3.0


@pytest.mark.parametrize(
    "completion",
    [
        r"$\boxed{" + r"\frac{1}{" * 500 + "2" + "}" * 500 + "}$",
        "The answer is " + "(" * 5000 + "5" + ")" * 5000 + ".",
        r"\boxed{" + "1+" * 20000 + "1}",
    ],
)
def test_hostile_answers_are_wrong_quickly(completion: str) -> None:
    start = time.monotonic()
    result = verify("6", completion, timeout_s=2.0)
    assert not result.correct
    assert result.outcome in (Outcome.WRONG, Outcome.TIMEOUT, Outcome.UNPARSABLE)
    assert time.monotonic() - start < 5.0


@pytest.mark.parametrize(
    "piece",
    [
        "<answer>",  # a lazy <answer>(.*?)</answer> regex is quadratic here
        "\\boxed{",  # so is retrying every unclosed box
        "answer is ",
        "**1",
        "1" + " " * 50,
        "Wait, 3. ",
    ],
)
def test_extraction_is_linear_on_hostile_text(piece: str) -> None:
    def run(text: str) -> None:
        for strict in (False, True):
            extract_answer(text, strict=strict)

    assert_linear(run, lambda n: piece * n, 1_000)


def test_megabyte_completion() -> None:
    completion = "blah 3 " * 150_000 + "\nThe answer is 42."
    assert len(completion) > 1_000_000
    assert verify("42", completion).correct
    assert verify("41", completion).outcome is Outcome.WRONG


def _verify_in_child(args: tuple[str, str]) -> bool:
    return verify(*args, timeout_s=20).correct


def test_works_inside_a_daemonic_pool_worker() -> None:
    # multiprocessing.Pool workers are daemonic and may not start multiprocessing children; our
    # workers are plain subprocesses, so sympy items still verify there.
    with multiprocessing.get_context("fork").Pool(1) as pool:
        got = pool.map(_verify_in_child, [(r"\frac{\sqrt{2}}{2}", r"\boxed{\frac{1}{\sqrt2}}")])
    assert got == [True]


# --- batch ------------------------------------------------------------------------------------


def test_verify_batch_matches_verify() -> None:
    golds = [g for g, _ in EQUAL[:12]] + [g for g, _ in NOT_EQUAL[:12]]
    comps = [c for _, c in EQUAL[:12]] + [c for _, c in NOT_EQUAL[:12]]
    batch = verify_batch(golds, comps, timeout_s=20, workers=2)
    single = [verify(g, c, timeout_s=20) for g, c in zip(golds, comps)]
    assert [r.correct for r in batch] == [r.correct for r in single] == [True] * 12 + [False] * 12


def test_verify_batch_runs_timeouts_in_parallel() -> None:
    _ready_workers(2)
    start = time.monotonic()
    results = verify_batch([HANGS[0]] * 2, [HANGS[1]] * 2, timeout_s=1.5, workers=2)
    elapsed = time.monotonic() - start
    assert [r.outcome for r in results] == [Outcome.TIMEOUT, Outcome.TIMEOUT]
    assert elapsed < 2.9  # one after the other would take >= 3 s


def test_concurrent_callers_share_the_pool() -> None:
    pairs = [(r"\sqrt{2}", rf"\boxed{{\frac{{{2 * k}}}{{{k}\sqrt{{2}}}}}}") for k in range(1, 9)]
    results: dict[int, MathResult] = {}

    def work(i: int) -> None:
        results[i] = verify(*pairs[i], timeout_s=20)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(pairs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert all(results[i].correct for i in range(len(pairs))), results


def test_verify_batch_rejects_misaligned_input() -> None:
    with pytest.raises(ValueError, match="one gold per completion"):
        verify_batch(["1", "2"], ["1"])
    with pytest.raises(ValueError, match="timeout_s"):
        verify("1", "1", timeout_s=0)
    with pytest.raises(ValueError, match="workers"):
        verify_batch(["1"], ["1"], workers=0)


# --- the labeled benchmark set ----------------------------------------------------------------


# Known misses (false negatives) on the labeled set; the benchmark reports the same count.
# heldout-454: "It will be Tuesday." has no answer marker and no number, so flexible extraction
# finds nothing (a rule that took the last word would create false positives elsewhere).
# math-280: gold "-2, 5", answer "5, -2". A bare comma list is graded as an ordered answer
# ("find a, b, c"), as hendrycks MATH, Qwen2.5-Math, rllm and PRM800K do; only lists marked as
# solution sets ("or"/"and", braces, several boxes, tuples, equations) are unordered.
KNOWN_FALSE_NEGATIVES = ["math-280", "heldout-454"]


def test_labeled_set_has_no_false_positives_and_known_errors_only() -> None:
    rows = [json.loads(line) for line in CASES.read_text().splitlines() if line.strip()]
    assert len(rows) >= 300
    results = verify_batch([r["gold"] for r in rows], [r["completion"] for r in rows], timeout_s=20)
    false_pos = [r["id"] for r, res in zip(rows, results) if res.correct and not r["label"]]
    false_neg = [r["id"] for r, res in zip(rows, results) if r["label"] and not res.correct]
    assert false_pos == []
    assert false_neg == KNOWN_FALSE_NEGATIVES


# --- fuzz: random LaTeX-ish token soup never crashes a stage ------------------------------------

_TOKENS = [
    "1", "2", "x", "+", "-", "/", "^", "(", ")", "[", "]", "\\{", "\\}", ",", "=", "<", "\\le",
    "\\frac{", "}{", "}", "\\sqrt{", "\\pi", "\\infty", "\\pm", "\\cup", "%", "\\$", ".", " ",
    "\\text{", "cm", "A", "(B)", "\\begin{pmatrix}", "&", "\\\\", "\\end{pmatrix}", "!", "e",
    "0.5", "1,000", "\\boxed{", "\\left(", "\\right)", "\\approx",
]  # fmt: skip


def _soup(rng: random.Random) -> str:
    return "".join(rng.choice(_TOKENS) for _ in range(rng.randint(1, 8)))


def test_fuzzed_inputs_give_typed_results_not_exceptions() -> None:
    rng = random.Random(0)
    golds = [_soup(rng) for _ in range(2000)]
    comps = [f"The answer is $\\boxed{{{_soup(rng)}}}$." for _ in range(2000)]
    # Only the gold may be rejected (ERROR "the gold ..."); no stage may raise.
    first = verify_batch(golds[:60], comps[:60], timeout_s=10)
    rest = [_safe_prepare(g, c, False) for g, c in zip(golds[60:], comps[60:])]
    for result in first + [r for r in rest if isinstance(r, MathResult)]:
        if result.outcome is Outcome.ERROR:
            assert result.detail.startswith("the gold"), result
        if result.correct:
            assert result.extracted is not None
