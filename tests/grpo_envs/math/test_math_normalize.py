"""Unit tests for the pure-Python parts of grpo_envs.math: parsing and exact number comparison."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from grpo_envs.math.equivalence import FastComparator, NeedsSymbolic, compare
from grpo_envs.math.extract import find_last_boxed, gold_answer
from grpo_envs.math.normalize import (
    AnswerTooComplex,
    Choice,
    Matrix,
    Number,
    Relation,
    Scalar,
    Seq,
    Union,
    clean,
    numbers_equal,
    parse_answer,
    parse_number,
    strip_units,
    tower_log10,
)


@pytest.mark.parametrize(
    ("text", "value", "decimal"),
    [
        ("72", Fraction(72), False),
        ("-3", Fraction(-3), False),
        ("1,234,567", Fraction(1234567), False),
        ("1,234.5", Fraction(2469, 2), True),
        (".5", Fraction(1, 2), True),
        ("3/4", Fraction(3, 4), False),
        (r"\frac{3}{4}", Fraction(3, 4), False),
        (r"\frac34", Fraction(3, 4), False),
        (r"-\frac{5}{2}", Fraction(-5, 2), False),
        (r"\frac{-5}{2}", Fraction(-5, 2), False),
        (r"2\frac{1}{4}", Fraction(9, 4), False),
        (r"-2\frac{1}{2}", Fraction(-5, 2), False),
        ("3 1/2", Fraction(7, 2), False),
        (r"1.5\times 10^{3}", Fraction(1500), True),
    ],
)
def test_parse_number(text: str, value: Fraction, decimal: bool) -> None:
    number = parse_number(text)
    assert number is not None
    assert (number.value, number.decimal) == (value, decimal)


@pytest.mark.parametrize(
    "text", ["x", "1/0", r"\frac{1}{0}", "3 5/2", r"\sqrt{2}", "10^{10^{10}}", ""]
)
def test_parse_number_declines(text: str) -> None:
    assert parse_number(text) is None


def test_numbers_equal_tolerance_only_for_decimals_against_non_terminating() -> None:
    third = Number(Fraction(1, 3), False)
    assert numbers_equal(Number(Fraction("0.3333333"), True, 7), third)
    assert numbers_equal(Number(Fraction("0.333333"), True, 6), third)  # rounded to its places
    assert not numbers_equal(
        Number(Fraction("0.3333334"), True, 7), third
    )  # neither rounded nor cut
    assert not numbers_equal(Number(Fraction("0.33"), True), third)
    # Both sides have finite decimal expansions: exact comparison, however close.
    assert not numbers_equal(Number(Fraction("1000001.0"), True), Number(Fraction(1000000), False))
    assert numbers_equal(Number(Fraction("0.50"), True), Number(Fraction(1, 2), False))


def test_tower_log10() -> None:
    assert tower_log10("9^{9^{9^9}}") == math.inf
    assert tower_log10("10^{10^{10}}") == pytest.approx(1e10)
    assert tower_log10("2^{10}") == pytest.approx(10 * math.log10(2))
    assert tower_log10("x^2") is None
    assert tower_log10("1^{10^{10}}") is None


@pytest.mark.parametrize(
    ("raw", "cleaned"),
    [
        (r"$\dfrac{1}{2}$", r"\frac{1}{2}"),
        (r"\left( 1, 2 \right)", "( 1, 2 )"),
        (r"30^{\circ}", "30°"),
        (r"\$1,000.", "1,000"),
        (r"1\,000", "1000"),
        (r"4\sqrt(2)", r"4\sqrt{2}"),
        ("sqrt(2) + pi", r"\sqrt{2} + \pi"),
        ("{{5}}", "5"),
    ],
)
def test_clean(raw: str, cleaned: str) -> None:
    assert clean(raw) == cleaned


@pytest.mark.parametrize(
    ("raw", "stripped"),
    [
        ("12 dollars", "12"),
        ("5 cm^2", "5"),
        (r"6\pi square units", r"6\pi"),
        ("5cm", "5"),
        ("no solution", "no solution"),
        ("2 x", "2 x"),
        ("5 xy", "5 xy"),
        ("4h", "4h"),
    ],
)
def test_strip_units(raw: str, stripped: str) -> None:
    assert strip_units(raw) == stripped


def test_parse_structures() -> None:
    assert parse_answer(r"\{1, 2\}") == Seq("set", (Scalar("1"), Scalar("2")))
    assert parse_answer("(1, 2]") == Seq("tuple", (Scalar("1"), Scalar("2")), "(", "]")
    assert parse_answer("1, 2") == Seq("ordered", (Scalar("1"), Scalar("2")))
    assert parse_answer("2 or 3") == Seq("list", (Scalar("2"), Scalar("3")))
    assert parse_answer("1,000") == Scalar("1,000")
    assert parse_answer(r"\pm 2") == Seq("set", (Scalar("2"), Scalar("-2")))
    assert parse_answer(r"x \geq 3") == Relation(">=", Scalar("x"), Scalar("3"))
    assert parse_answer(r"\left(3\right)") == Scalar("3")
    assert parse_answer("50%") == Scalar("50", percent=True)
    assert parse_answer(r"\frac{1}{6} \approx 0.167") == Scalar(r"\frac{1}{6}")
    assert isinstance(parse_answer(r"(0,1)\cup(2,3)"), Union)
    matrix = parse_answer(r"\begin{pmatrix} 1 & 2 \\ 3 & 4 \end{pmatrix}")
    assert isinstance(matrix, Matrix) and len(matrix.rows) == 2 and len(matrix.rows[0]) == 2


def test_parse_choice() -> None:
    assert parse_answer("(B) 12", choice=True) == Choice("B")
    assert parse_answer(r"\textbf{C}", choice=True) == Choice("C")
    assert not isinstance(parse_answer("A and B", choice=True), Choice)
    assert not isinstance(parse_answer("(A) or (C)", choice=True), Choice)
    assert not isinstance(parse_answer("Bob", choice=True), Choice)


def test_parse_rejects_deep_nesting() -> None:
    with pytest.raises(AnswerTooComplex):
        parse_answer("(" * 100 + "1" + ")" * 100)


def test_fast_comparator_defers_to_sympy_when_unsure() -> None:
    fast = FastComparator()
    assert compare(parse_answer("1,000"), parse_answer("1000.0"), fast)
    assert not compare(parse_answer("(1, 2)"), parse_answer("(2, 1)"), fast)
    assert not compare(parse_answer(r"\{1, 2\}"), parse_answer("(1, 2)"), fast)
    assert compare(parse_answer("x = 5"), parse_answer("5"), fast)
    with pytest.raises(NeedsSymbolic):
        compare(parse_answer(r"\sqrt{2}"), parse_answer(r"\frac{2}{\sqrt{2}}"), fast)


def test_gold_answer_forms() -> None:
    assert gold_answer("Janet sells 9 eggs.\n#### 1,000") == "1,000"
    assert gold_answer(r"So the answer is $\boxed{\frac{1}{2}}$.") == r"\frac{1}{2}"
    assert gold_answer("<answer>7</answer>") == "7"
    assert gold_answer("  42 ") == "42"
    assert gold_answer("") is None


def test_find_last_boxed_nested_and_escaped_braces() -> None:
    assert find_last_boxed(r"\boxed{\{1, \frac{1}{2}\}}") == r"\{1, \frac{1}{2}\}"
    assert find_last_boxed("no box") is None
