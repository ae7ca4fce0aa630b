"""The answer forms real completions use: labeled right answers and near misses per class.

A refused right answer hides signal; each class also has near misses (a different value in the
same form) that must stay wrong, so that no form is accepted by being read loosely.

Classes: words (number words), sets (set-builder, relations, absolute values, "all reals
except"), box (other framing, an approximation sign or a sentence in the box, chat models' box
tokens), language (final-answer phrases in other languages), identity (what sympy does not prove
by default), piecewise, vector (unit vectors, scalar multiples), everyday (clock times, dates,
currency, cents, a quantity in two units), duration (decimal hours, minutes, clock forms),
choice (a letter against the listed option's value).
"""

from __future__ import annotations

import pytest

from grpo_envs.math import verify
from grpo_envs.math.extract import listed_options
from grpo_envs.math.normalize import number_from_words, unit_vectors_as_tuple

_PW = r"\begin{cases} x^2 & x > 1 \\ 2x - 1 & x \le 1 \end{cases}"
_ABS_CASES = r"\begin{cases} x & x \ge 0 \\ -x & x < 0 \end{cases}"
_TWO_KINKS = r"\begin{cases} -2x & x < -1 \\ 2 & -1 \le x \le 1 \\ 2x & x > 1 \end{cases}"
_OUTSIDE = r"\begin{cases} 1 & x < -1 \text{ or } x > 1 \\ 0 & -1 \le x \le 1 \end{cases}"
_MAX_ABS_ONE = r"\begin{cases} |x| & x < -1 \text{ or } x > 1 \\ 1 & -1 \le x \le 1 \end{cases}"
_OPTIONS = "The options are (A) 10 (B) 11 (C) 12 (D) 13."

# (class, gold, completion)
RIGHT = [
    ("words", "5", "The answer is five."),
    ("words", "21", "The answer is twenty-one."),
    ("words", "120", "The answer is one hundred twenty."),
    ("words", "2005", r"\boxed{\text{two thousand and five}}"),
    ("words", "12", "After lunch she has twelve apples left."),
    ("words", "-3", r"\boxed{\text{minus three}}"),
    ("words", "3", "So there are three."),
    ("sets", r"(-\infty, -1]", r"\boxed{\{y : y \le -1\}}"),
    ("sets", r"(-2, 3)", r"\boxed{\{x \mid -2 < x < 3\}}"),
    ("sets", r"(-3, 3)", r"\boxed{|x| < 3}"),
    ("sets", r"[1, 5]", r"\boxed{|x - 3| \le 2}"),
    ("sets", r"(-\infty, -2) \cup (2, \infty)", r"\boxed{|x| > 2}"),
    ("sets", r"(-\infty, -4] \cup [2, \infty)", r"\boxed{|x + 1| \geq 3}"),
    ("sets", r"(-\infty, 3) \cup (3, \infty)", r"\boxed{x \neq 3}"),
    ("sets", r"(-\infty, 3) \cup (3, \infty)", "The domain is all real numbers except 3."),
    ("sets", r"(-\infty, 1) \cup (1, 2) \cup (2, \infty)", "all real numbers except 1 and 2"),
    ("sets", r"(-\infty, 3) \cup (3, \infty)", r"\boxed{\mathbb{R} \setminus \{3\}}"),
    ("sets", r"x \ne 3", r"\boxed{(-\infty, 3) \cup (3, \infty)}"),
    ("box", "5", r"\boxed{\approx 5}"),
    ("box", "5", r"\boxed{\text{The answer is } 5}"),
    ("box", "5", r"<|begin_of_box|>5<|end_of_box|>"),
    ("box", r"\frac{1}{2}", r"<|begin_of_box|>\frac{1}{2}<|end_of_box|>"),
    ("box", "7", r"\framebox{7}"),
    ("box", "7", r"\fbox{7}"),
    ("language", "5", "La respuesta es 5."),
    ("language", "5", "La réponse est 5."),
    ("language", "5", "Die Antwort ist 5."),
    ("language", "5", "Die endgültige Antwort lautet 5."),
    ("language", "5", "A resposta é 5."),
    ("language", "5", "La risposta è 5."),
    ("language", "5", "Ответ: 5"),
    ("language", "5", "答案是5"),
    ("language", "5", "最终答案：5"),
    ("language", r"\frac{1}{2}", r"所以答案是 $\frac{1}{2}$。"),
    ("identity", "|x|", r"\boxed{\sqrt{x^2}}"),
    ("identity", r"\frac{1}{2} + \frac{\sqrt{3}}{2}i", r"\boxed{e^{i\pi/3}}"),
    ("identity", "3 + i", r"\boxed{(1+i)(2-i)}"),
    ("identity", "-1", r"\boxed{e^{i\pi}}"),
    ("identity", r"\sin 30^\circ", r"\boxed{\cos 60^\circ}"),
    ("identity", r"\frac{1}{2}", r"\boxed{\sin 30^\circ}"),
    ("identity", r"\sqrt{2}\cos\theta", r"\boxed{\sqrt{2}\sin(90^\circ - \theta)}"),
    ("identity", r"\frac{\sqrt{6}}{3}", r"\boxed{\sqrt{\frac{2}{3}}}"),
    ("identity", r"\sqrt{2} + \sqrt{3}", r"\boxed{\sqrt{5 + 2\sqrt{6}}}"),
    ("piecewise", _PW, r"\boxed{\begin{cases} 2x - 1 & x \le 1 \\ x^2 & x > 1 \end{cases}}"),
    (
        "piecewise",
        _PW,
        r"\boxed{\begin{cases} 2x-1 & \text{if } x \leq 1, \\ x^2 & \text{if } x > 1. \end{cases}}",
    ),
    ("piecewise", _PW, r"\boxed{\begin{cases} x^2 & x > 1 \\ 2x-1 & \text{otherwise} \end{cases}}"),
    # cases against a closed form for the same function, in both directions
    ("piecewise", "|x|", rf"\boxed{{{_ABS_CASES}}}"),
    ("piecewise", _ABS_CASES, r"\boxed{|x|}"),
    ("piecewise", "|x|", r"\boxed{\begin{cases} -x & x \le 0 \\ x & x > 0 \end{cases}}"),
    ("piecewise", "|x|", r"\boxed{\begin{cases} x & x > 0 \\ 0 & x = 0 \\ -x & x < 0 \end{cases}}"),
    ("piecewise", "|x|", r"\boxed{\begin{cases} x & x \ge 0 \\ -x & x \le 0 \end{cases}}"),
    ("piecewise", "|x - 2|", r"\boxed{\begin{cases} x - 2 & x \ge 2 \\ 2 - x & x < 2 \end{cases}}"),
    ("piecewise", r"\max(x, 0)", r"\boxed{\begin{cases} x & x \geq 0 \\ 0 & x < 0 \end{cases}}"),
    ("piecewise", r"\begin{cases} x & x \ge 0 \\ 0 & x < 0 \end{cases}", r"\boxed{\max(0, x)}"),
    (
        "piecewise",
        r"\min(x, 0)",
        r"\boxed{\begin{cases} 0 & x \ge 0 \\ x & \text{otherwise} \end{cases}}",
    ),
    (
        "piecewise",
        r"\frac{x + |x|}{2}",
        r"\boxed{\begin{cases} x & x > 0 \\ 0 & x \le 0 \end{cases}}",
    ),
    ("piecewise", "|x - 1| + |x + 1|", rf"\boxed{{{_TWO_KINKS}}}"),
    ("piecewise", r"f(x) = |x|", rf"The function is $f(x) = \boxed{{{_ABS_CASES}}}$."),
    ("piecewise", "|x|", r"\boxed{\begin{cases} x, & x \ge 0 \\ -x, & x < 0 \end{cases}}"),
    (
        "piecewise",
        "|x|",
        r"\boxed{\left\{ \begin{array}{ll} x & x \ge 0 \\ -x & x < 0 \end{array} \right.}",
    ),
    ("piecewise", r"\max\{x, 0\}", r"\boxed{\begin{cases} x & x \ge 0 \\ 0 & x < 0 \end{cases}}"),
    ("piecewise", "x|x|", r"\boxed{\begin{cases} x^2 & x \ge 0 \\ -x^2 & x < 0 \end{cases}}"),
    (
        "piecewise",
        "|2x - 3|",
        r"\boxed{\begin{cases} 2x - 3 & x \ge \frac{3}{2} \\ 3 - 2x & x < \frac{3}{2} \end{cases}}",
    ),
    (
        "piecewise",
        "|x^2 - 1|",
        r"\boxed{\begin{cases} x^2 - 1 & |x| \ge 1 \\ 1 - x^2 & |x| < 1 \end{cases}}",
    ),
    ("piecewise", _OUTSIDE, r"\boxed{\begin{cases} 0 & |x| \le 1 \\ 1 & |x| > 1 \end{cases}}"),
    ("piecewise", r"\max(|x|, 1)", rf"\boxed{{{_MAX_ABS_ONE}}}"),
    # cases split at another point where both values agree (continuous at the boundary)
    ("piecewise", _PW, r"\boxed{\begin{cases} x^2 & x \ge 1 \\ 2x - 1 & x < 1 \end{cases}}"),
    # durations: decimal hours, minutes, two units and clock forms (the gold has a unit of time)
    ("duration", r"1.5 \text{ hours}", r"\boxed{1:30}"),
    ("duration", "1.5 hours", "It takes her 1:30 to finish the course."),
    ("duration", "90 minutes", r"The trip takes \boxed{1.5 \text{ hours}}."),
    ("duration", "1.5 hours", r"The trip takes \boxed{90 \text{ minutes}}."),
    ("duration", "2.25 hours", "It takes 2 hours 15 minutes."),
    ("duration", "2 hours 15 minutes", r"\boxed{2.25 \text{ hours}}"),
    ("duration", "2 hours 15 minutes", r"\boxed{2:15}"),
    ("duration", "135 minutes", r"\boxed{2:15}"),
    ("duration", "45 minutes", r"\boxed{0.75 \text{ hours}}"),
    ("duration", "3 days", r"\boxed{72 \text{ hours}}"),
    ("duration", "1 hour 30 minutes 20 seconds", r"\boxed{1:30:20}"),
    ("duration", "1.5 hours", r"\boxed{1:30 \text{ hours}}"),
    ("duration", "2.5 minutes", r"\boxed{2:30 \text{ min}}"),
    ("duration", "1.5 hours", r"\boxed{1.5}"),
    ("duration", "2 weeks", r"\boxed{14 \text{ days}}"),
    ("vector", r"\begin{pmatrix} 3 \\ 4 \end{pmatrix}", r"\boxed{3\mathbf{i} + 4\mathbf{j}}"),
    ("vector", "(1, -2, 3)", r"\boxed{\hat{i} - 2\hat{j} + 3\hat{k}}"),
    ("vector", "(0, 5, -1)", r"\boxed{5\vec{j} - \vec{k}}"),
    ("vector", r"\begin{pmatrix} 2 & 0 \\ 0 & 2 \end{pmatrix}", r"\boxed{2I}"),
    ("vector", r"\begin{pmatrix} 1 & 0 \\ 0 & 1 \end{pmatrix}", r"\boxed{I}"),
    (
        "vector",
        r"\begin{pmatrix} 2 \\ 4 \end{pmatrix}",
        r"\boxed{2\begin{pmatrix} 1 \\ 2 \end{pmatrix}}",
    ),
    (
        "vector",
        r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}",
        r"\boxed{\frac{1}{2}\begin{pmatrix}2\\4\end{pmatrix}}",
    ),
    ("everyday", "19:30", r"\boxed{7:30 \text{ p.m.}}"),
    ("everyday", "7:30", "They meet at 7:30 a.m."),
    ("everyday", "0:15", r"\boxed{12:15 \text{ AM}}"),
    ("everyday", "12:05", r"\boxed{12:05 \text{ PM}}"),
    ("everyday", "7", r"\boxed{7 \text{ pm}}"),
    ("everyday", "19:00", r"\boxed{7 \text{ pm}}"),
    ("everyday", "3.50", "The answer is 350 cents."),
    ("everyday", "350", "The answer is 350 cents."),
    ("everyday", "12", "It costs €12."),
    ("everyday", "12", r"\boxed{£12}"),
    ("everyday", "12", "The answer is 12 euros."),
    ("everyday", "1.5", r"\boxed{1 \text{ hour } 30 \text{ minutes}}"),
    ("everyday", "90", "It takes 1 hour and 30 minutes."),
    ("everyday", "63", "He is 5 feet 3 inches tall."),
    ("everyday", "5.25", "The answer is 5 feet 3 inches."),
    ("everyday", "2.5", "It costs 2 dollars and 50 cents."),
    ("everyday", "March 15, 2024", "The date is 3/15/2024."),
    ("everyday", "March 15, 2024", r"\boxed{2024-03-15}"),
    ("everyday", "March 15", "It happens on 15 March."),
    ("everyday", "Sept 5", "The answer is September 5th."),
    ("choice", "C", _OPTIONS + r" The answer is \boxed{12}."),
    ("choice", "12", _OPTIONS + " So the answer is (C)."),
    ("choice", "C", "A. 3\nB. 4\nC. $\\frac{1}{2}$\nSo the answer is \\boxed{\\frac{1}{2}}."),
]

WRONG = [
    ("words", "5", "The answer is four."),
    ("words", "21", "The answer is twenty-two."),
    ("words", "120", "The answer is one hundred twelve."),
    ("words", "1", "We pick the last one."),  # "one" alone is a pronoun
    ("words", "12", "It could be twelve or thirteen."),
    ("sets", r"(-\infty, -1]", r"\boxed{\{y : y < -1\}}"),
    ("sets", r"(-\infty, -1]", r"\boxed{\{x : y \le -1\}}"),
    ("sets", r"(-3, 3)", r"\boxed{|x| \le 3}"),
    ("sets", r"(-3, 3)", r"\boxed{|x| > 3}"),
    ("sets", r"[1, 5]", r"\boxed{|x + 3| \le 2}"),
    ("sets", r"(-\infty, -2) \cup (2, \infty)", r"\boxed{|x| \geq 2}"),
    ("sets", r"(-\infty, 3) \cup (3, \infty)", r"\boxed{x \neq -3}"),
    ("sets", r"(-\infty, 3) \cup (3, \infty)", "The domain is all real numbers except 4."),
    ("sets", "3", "The domain is all real numbers except 3."),
    ("sets", r"(-\infty, 1) \cup (1, 2) \cup (2, \infty)", "all real numbers except 1"),
    ("box", "5", r"\boxed{\approx 5.1}"),
    ("box", "5", r"\boxed{\text{The answer is } 6}"),
    ("box", "5", r"<|begin_of_box|>6<|end_of_box|>"),
    ("box", "5", r"\boxed{\approx 50}"),
    ("box", "7", r"\framebox{8}"),
    ("box", "5", r"\boxed{\text{The answer is not } 5}"),
    ("language", "5", "La respuesta es 6."),
    ("language", "5", "Die Antwort ist 6."),
    ("language", "5", "答案是6"),
    ("language", "5", "Ответ: 6"),
    ("language", "5", "La réponse est 6."),
    ("language", "5", "A resposta é 6."),
    ("language", r"\frac{1}{2}", r"最终答案是 $\frac{1}{3}$"),
    ("language", "5", "La respuesta no es 5."),
    ("identity", "|x|", r"\boxed{x}"),
    ("identity", "x", r"\boxed{\sqrt{x^2}}"),
    ("identity", r"\frac{1}{2} + \frac{\sqrt{3}}{2}i", r"\boxed{e^{i\pi/6}}"),
    ("identity", "3 + i", r"\boxed{3 - i}"),
    ("identity", "3 + i", r"\boxed{(1+i)(2+i)}"),
    ("identity", r"\sin 30^\circ", r"\boxed{\cos 30^\circ}"),
    ("identity", r"\frac{1}{2}", r"\boxed{\sin 60^\circ}"),
    ("identity", r"\sqrt{2}\cos\theta", r"\boxed{\sqrt{2}\sin(\theta)}"),
    ("piecewise", _PW, r"\boxed{\begin{cases} 2x - 1 & x > 1 \\ x^2 & x \le 1 \end{cases}}"),
    ("piecewise", _PW, r"\boxed{\begin{cases} x^2 & x < 1 \\ 2x - 1 & x \ge 1 \end{cases}}"),
    ("piecewise", _PW, r"\boxed{\begin{cases} x^2 & x > 1 \\ 2x+1 & \text{otherwise} \end{cases}}"),
    ("piecewise", _PW, r"\boxed{\begin{cases} x^2 & x > 2 \\ 2x - 1 & x \le 1 \end{cases}}"),
    ("piecewise", _PW, r"\boxed{\begin{cases} x^2 & x > 1 \end{cases}}"),
    # near misses of a closed form: a sign, a boundary, a missing point, a boundary value
    ("piecewise", "|x|", r"\boxed{\begin{cases} x & x \ge 0 \\ x & x < 0 \end{cases}}"),
    ("piecewise", "|x|", r"\boxed{\begin{cases} -x & x \ge 0 \\ x & x < 0 \end{cases}}"),
    ("piecewise", "|x|", r"\boxed{\begin{cases} x & x \ge 1 \\ -x & x < 1 \end{cases}}"),
    ("piecewise", "|x|", r"\boxed{\begin{cases} x & x > 0 \\ -x & x < 0 \end{cases}}"),
    ("piecewise", "|x|", r"\boxed{\begin{cases} x & x > 0 \\ 1 & x = 0 \\ -x & x < 0 \end{cases}}"),
    ("piecewise", "|x|", r"\boxed{\begin{cases} x & x \ge 0 \end{cases}}"),
    ("piecewise", "|x|", r"\boxed{\begin{cases} y & y \ge 0 \\ -y & y < 0 \end{cases}}"),
    ("piecewise", _ABS_CASES, r"\boxed{|x - 1|}"),
    ("piecewise", _ABS_CASES, r"\boxed{-|x|}"),
    ("piecewise", "|x - 2|", r"\boxed{\begin{cases} x - 2 & x \ge 1 \\ 2 - x & x < 1 \end{cases}}"),
    ("piecewise", r"\max(x, 0)", rf"\boxed{{{_ABS_CASES}}}"),
    ("piecewise", r"\max(x, 0)", r"\boxed{\min(x, 0)}"),
    ("piecewise", r"\min(x, 0)", r"\boxed{\begin{cases} x & x \ge 0 \\ 0 & x < 0 \end{cases}}"),
    (
        "piecewise",
        "|x - 1| + |x + 1|",
        rf"\boxed{{{_TWO_KINKS.replace('2x & x > 1', '2x & x > 2')}}}",
    ),
    ("piecewise", "|x - 1| + |x + 1|", rf"\boxed{{{_TWO_KINKS.replace('2 &', '3 &')}}}"),
    ("piecewise", "|x|", r"\boxed{\begin{cases} x, & x \ge 0 \\ x, & x < 0 \end{cases}}"),
    (
        "piecewise",
        "|x|",
        r"\boxed{\left\{ \begin{array}{ll} x & x \ge 1 \\ -x & x < 1 \end{array} \right.}",
    ),
    ("piecewise", "x|x|", r"\boxed{\begin{cases} x^2 & x \ge 0 \\ x^2 & x < 0 \end{cases}}"),
    (
        "piecewise",
        "|2x - 3|",
        r"\boxed{\begin{cases} 2x - 3 & x \ge \frac{2}{3} \\ 3 - 2x & x < \frac{2}{3} \end{cases}}",
    ),
    (
        "piecewise",
        "|x|",
        r"\boxed{\begin{cases} x & x \ge 0 \\ -x & x < 0 \\ 5 & x > 10 \end{cases}}",
    ),  # overlapping cases that disagree
    ("piecewise", _OUTSIDE, r"\boxed{\begin{cases} 0 & |x| < 1 \\ 1 & |x| \ge 1 \end{cases}}"),
    ("piecewise", _OUTSIDE, rf"\boxed{{{_OUTSIDE.replace('x > 1', 'x > 2')}}}"),
    ("piecewise", r"\max(|x|, 1)", rf"\boxed{{{_MAX_ABS_ONE.replace('|x| &', 'x &')}}}"),
    ("piecewise", r"\max(|x|, 1)", rf"\boxed{{{_MAX_ABS_ONE.replace('1 & -1', '0 & -1')}}}"),
    # a jump: moving the boundary point to the other case is another function
    (
        "piecewise",
        r"\begin{cases} 1 & x \ge 0 \\ 0 & x < 0 \end{cases}",
        r"\boxed{\begin{cases} 1 & x > 0 \\ 0 & x \le 0 \end{cases}}",
    ),
    ("piecewise", _PW, r"\boxed{x^2}"),
    ("piecewise", _PW, r"\boxed{5}"),
    ("vector", r"\begin{pmatrix} 3 \\ 4 \end{pmatrix}", r"\boxed{4\mathbf{i} + 3\mathbf{j}}"),
    ("vector", "(3, 4)", r"\boxed{3\hat{i} - 4\hat{j}}"),
    ("vector", "(1, -2, 3)", r"\boxed{\hat{i} - 2\hat{j}}"),
    ("vector", r"\begin{pmatrix} 2 & 0 \\ 0 & 2 \end{pmatrix}", r"\boxed{3I}"),
    ("vector", r"\begin{pmatrix} 2 & 1 \\ 0 & 2 \end{pmatrix}", r"\boxed{2I}"),
    (
        "vector",
        r"\begin{pmatrix} 2 \\ 4 \end{pmatrix}",
        r"\boxed{2\begin{pmatrix} 1 \\ 3 \end{pmatrix}}",
    ),
    (
        "vector",
        r"\begin{pmatrix} 2 \\ 4 \end{pmatrix}",
        r"\boxed{3\begin{pmatrix} 1 \\ 2 \end{pmatrix}}",
    ),
    ("everyday", "7:30", r"\boxed{7:30 \text{ p.m.}}"),
    ("everyday", "19:30", r"\boxed{7:30 \text{ a.m.}}"),
    ("everyday", "12:15", r"\boxed{12:15 \text{ AM}}"),
    ("everyday", "19:00", r"\boxed{7 \text{ am}}"),
    ("everyday", "8", r"\boxed{7 \text{ pm}}"),
    ("everyday", "3.50", "The answer is 305 cents."),
    ("everyday", "35", "The answer is 350 cents."),
    ("everyday", "12", "It costs €13."),
    ("everyday", "30", "It takes 1 hour and 30 minutes."),
    ("everyday", "1", "It takes 1 hour and 30 minutes."),
    ("everyday", "1.5", "It takes 1 hour 50 minutes."),
    ("everyday", "50", "It costs 2 dollars and 50 cents."),
    ("everyday", "March 15, 2024", "The date is March 16, 2024."),
    ("everyday", "March 15, 2024", "The date is March 15, 2025."),
    ("everyday", "March 15, 2024", "The date is 15/3/2024."),  # month 15: no date
    ("everyday", "15", "The date is March 15, 2024."),
    ("everyday", "Mayday 5", "The answer is May 5th."),
    # a duration near miss: another length, a time of day, a gold with no unit of time
    ("duration", "1.5 hours", r"\boxed{1:50}"),
    ("duration", "1.3 hours", r"\boxed{1:30}"),
    ("duration", "1.5 hours", r"\boxed{1.3 \text{ hours}}"),
    ("duration", "90 minutes", r"\boxed{90 \text{ hours}}"),
    ("duration", "90 minutes", r"\boxed{1.5 \text{ minutes}}"),
    ("duration", "1.5 hours", "They meet at 1:30."),
    ("duration", "1.5 hours", r"The train leaves at \boxed{1:30}."),
    ("duration", "1.5 hours", r"\boxed{1:30 \text{ p.m.}}"),
    ("duration", "0.33 hours", r"\boxed{20 \text{ minutes}}"),
    ("duration", "2 hours 15 minutes", r"\boxed{2:25}"),
    ("duration", "2 hours 15 minutes", r"\boxed{2.15 \text{ hours}}"),
    ("duration", "1.5 hours", r"\boxed{1:30:01}"),
    ("duration", "3 days", r"\boxed{3 \text{ hours}}"),
    ("duration", "1.5", r"\boxed{1:30}"),  # no unit of time in the gold: no duration context
    ("duration", "1:30", r"\boxed{1.5 \text{ hours}}"),  # the gold may be a time of day
    ("duration", "4 minutes 5 seconds", r"\boxed{4:05}"),  # a clock form is hours:minutes
    ("choice", "B", _OPTIONS + r" The answer is \boxed{12}."),
    ("choice", "C", r"The answer is \boxed{12}."),  # no options listed: a value is no letter
    ("choice", "C", r"(A) 12 (B) 12 (C) 12. So \boxed{12}."),  # the value names no one option
    ("choice", "11", _OPTIONS + " So the answer is (C)."),
    ("choice", "C", _OPTIONS + " It is (A) or (C)."),
]


@pytest.mark.parametrize(("cls", "gold", "completion"), RIGHT)
def test_answer_forms_are_right(cls: str, gold: str, completion: str) -> None:
    result = verify(gold, completion, timeout_s=20)
    assert result.correct, (cls, result)


@pytest.mark.parametrize(("cls", "gold", "completion"), WRONG)
def test_near_misses_in_each_form_are_wrong(cls: str, gold: str, completion: str) -> None:
    result = verify(gold, completion, timeout_s=20)
    assert not result.correct, (cls, result)


@pytest.mark.parametrize(
    ("words", "value"),
    [
        ("seven", 7),
        ("Forty-two", 42),
        ("nine hundred ninety-nine", 999),
        ("one million two hundred thousand", 1_200_000),
        ("negative twelve", -12),
        ("twelve apples", None),
        ("one two three", None),  # three numbers, not 6
        ("five twenty", None),
        ("twelve hundred", 1200),
        ("and", None),
        ("", None),
    ],
)
def test_number_words(words: str, value: int | None) -> None:
    assert number_from_words(words) == value


def test_unit_vectors_and_listed_options() -> None:
    assert unit_vectors_as_tuple(r"2\hat{i} + \hat{k}") == "(2, 0, 1)"
    assert unit_vectors_as_tuple(r"3\vec{i}4\vec{j}") == r"3\vec{i}4\vec{j}"  # no sign: not a sum
    assert unit_vectors_as_tuple("3 + 4i") == "3 + 4i"  # a bare i is the imaginary unit
    assert listed_options("(A) 1 (B) 2 (D) 4") == {"A": "1", "B": "2"}
    assert listed_options("so (C) it is") == {}
