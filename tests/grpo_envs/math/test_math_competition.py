"""Competition-math answers: labeled cases per equivalence class, each with near misses.

Every class has pairs that must be judged correct and near misses that must be judged wrong; a
wrong pair judged correct (a false positive) is the error a reward must never make.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from scan_work import assert_linear  # tests/grpo_envs is on sys.path (its conftest)

from grpo_envs.math import extract_answer, verify, verify_batch
from grpo_envs.math.extract import gold_answer, last_standalone_number, math_spans

# (class, gold, completion)
CORRECT = [
    # answers outside boxes: the last math span or an answer phrase
    ("span", "10", r"We compute it and get $\frac{20}{2} = 10$."),
    ("span", r"\frac{1}{3}", r"So the ratio of the areas is $\frac{1}{3}$."),
    ("span", "9", r"Answer \( 9 \)"),
    ("span", "9", "Answer \\[\n 9 \n\\]"),
    ("span", "9", "Answer $$\n9\n$$"),
    ("span", r"3\sqrt{13}", r"The distance is \(3\sqrt{13}\) units."),
    ("phrase", "34", "Final Answer: The largest $n$ is 34."),
    ("phrase", "3", "Final answer: she started 3 hours ago."),
    ("phrase", "10455", r"so \boxed{200} and \boxed{255}. The final answer is $10,455$."),
    ("bare", "10/9", r"\frac{10}{9}"),
    ("bare", "2/3", "Therefore the probability that Alice wins is 2/3. <|im_start|>user"),
    # golds written with math delimiters or as worked solutions
    ("gold$", "$x = 7$", r"\boxed{7}"),
    ("gold$", "$125$ miles", r"The distance is $\boxed{125\textnormal{ miles}}.$"),
    ("gold$", r"So $x=\boxed{4}$ and we are done.", "The answer is 4."),
    # relations, intervals and sets
    ("interval", r"[5, \infty)", r"\boxed{x \geq 5}"),
    ("interval", r"x \ge 5", r"\boxed{[5,\infty)}"),
    ("interval", r"-2 \le x \le 7", r"\boxed{[-2, 7]}"),
    ("interval", r"[-2,7]", r"The solution set is $x \in [-2,7]$."),
    ("interval", r"(-\infty, 3)", r"\boxed{x \lt 3}"),
    ("interval", r"(-\infty,\infty)", r"\boxed{\mathbb{R}}"),
    ("interval", r"(0, 1]", r"\boxed{0 < t \leq 1}"),
    ("relation", "x >= 5", r"Therefore $x \geq 5$."),
    ("relation", r"x \le 2", "Thus $x <= 2$ is our answer."),
    ("relation", "x > 5", r"$5 \lt x$"),
    ("relation", "x < 1", "$-x > -1$"),
    # unordered solutions, plus-minus and "and"-lists
    ("list", "-2, 5", r"The solutions are $x = 5$ or $x = -2$, so \boxed{5 \text{ or } -2}."),
    ("list", "-2, 5", r"\boxed{\{5, -2\}}"),
    ("list", "1, -2", r"$\boxed{-2} \quad \text{and} \quad \boxed{1}$"),
    ("list", r"1 \pm \sqrt{19}", r"\boxed{1-\sqrt{19}, 1+\sqrt{19}}"),
    (
        "list",
        r"\frac{-1\pm\sqrt{13}}{4}",
        r"\boxed{\frac{-1-\sqrt{13}}{4}, \frac{-1+\sqrt{13}}{4}}",
    ),
    ("list", "19, 46, and 82", r"$19, 46, \text{ and } 82$"),
    ("list", r"12\text{ and }13", r"\boxed{12, 13}"),
    ("list", "1, 2", r"The roots are \boxed{1} and \boxed{2}."),
    ("list", "(2, 2), (6, 2)", r"$\boxed{(6, 2)} \quad \text{and} \quad \boxed{(2, 2)}$"),
    ("list", "(11,7)or(7,11)", r"\boxed{(7,11),\ (11,7)}"),
    # matrices, boxed or not
    (
        "matrix",
        r"\begin{pmatrix} 1 & 2 \\ 3 & 4 \end{pmatrix}",
        r"It is $\begin{bmatrix}1&2\\3&4\end{bmatrix}$.",
    ),
    (
        "matrix",
        r"\begin{pmatrix}1 & 2\\3 & 4\end{pmatrix}",
        r"$\left[\begin{array}{cc}1 & 2\\3 & 4\end{array}\right]$",
    ),
    (
        "matrix",
        r"\begin{pmatrix} 6 & 8 \\ 10 & 12 \end{pmatrix}",
        r"$\begin{pmatrix}1&2\\3&4\end{pmatrix}+\begin{pmatrix}5&6\\7&8\end{pmatrix}$",
    ),
    # number notations
    ("number", r"\frac{1}{3}", r"\boxed{\frac13}"),
    ("number", "1000", r"\boxed{10^3}"),
    ("number", "1000", r"\boxed{1\times10^3}"),
    ("number", "1000", "1 000"),
    ("number", "1500", r"\boxed{1.5e3}"),
    ("number", "16386.20", r"worth $\boxed{\$16,\!386.20}$"),
    ("number", "32349", r"is $\boxed{32,\! 349}$"),
    ("number", r"\frac{8}{3}", r"\boxed{2.6667}"),
    # named values and prefixes
    ("prefix", "2x+3", r"\boxed{f(x) = 2x + 3}"),
    ("prefix", "C(h)=4h+4", r"\boxed{4h+4}"),
    ("prefix", "(p,q)=(3,2)", r"\boxed{(3, 2)}"),
    ("prefix", "5", r"\boxed{x = 5}"),
    ("prefix", r"|AB| = 1", r"\boxed{1}"),
    ("prefix", r"\frac{NO}{BO}=\frac{1}{\sqrt{6}}", r"\boxed{\frac{1}{\sqrt{6}}}"),
    ("prefix", "AB=4, CD=5", r"\boxed{4, 5}"),
    ("prefix", "x = 11", r"$x = 5+5+1 = 11$"),
    ("ratio", "7:32", r"\boxed{7 : 32}"),
    # units and number words
    ("units", "350000", "The book has 350,000 pages."),
    ("units", r"3\text{ million}", r"\boxed{3000000}"),
    ("units", r"3\text{ million}", r"\boxed{3}"),
    ("units", "125", r"\boxed{125\textnormal{ miles}}"),
    ("units", r"15\mbox{ cm}^2", r"\boxed{15}"),
    # decimal commas and thin spaces (the conventions Math-Verify's suite documents)
    ("decimal", "1000.99", "1000,99"),
    ("decimal", "1000.99", "the number is not 10 which is 1,000.99€"),
    ("decimal", "2.74", "Soucis : 2,74 $ a.."),
    ("decimal", "0,111", "0.111"),
    ("decimal", "7425000", "7,425,000"),
    # degrees and radians, percentages
    ("angle", r"90^\circ", r"\boxed{\frac{\pi}{2}}"),
    ("angle", r"\frac{\pi}{2}", r"\boxed{90^\circ}"),
    ("angle", r"45^\circ", r"\boxed{45}"),
    ("percent", r"28\%", "28 percent"),
    ("percent", r"28\%", r"$\boxed{28 pct}$"),
    ("percent", r"20\%", r"\boxed{0.2}"),
]

WRONG = [
    # digit runs inside an expression or a word are not answers
    ("span", "2", r"The answer is $\frac{1+\sqrt{5}}{2}$"),
    ("span", "3", r"so the ratio of the areas is $\frac{1}{3}$."),
    ("span", "10", r"The number of subsets is $2^{10}$."),
    ("span", "2", "AZYUK2A"),
    ("span", "2", r"We get $x_2$ as the root."),
    ("span", "9", "Answer $ \n 9 \n $"),
    ("span", "5", "The answer is $5x$."),
    ("span", "4", r"\boxed{4} is wrong. The answer is \boxed{5}."),
    # a number the sentence negates or brackets is not stated as the answer
    ("hedge", "5", "The answer cannot be 5."),
    ("hedge", "6", "The answer is between 5 and 6."),
    ("hedge", "5", "There are no more than 5 left."),
    ("hedge", "5", "The answer is not 5, it's 6."),
    # openness of intervals, direction of inequalities
    ("interval", "(0,9)", "The interval is $[0,9)$."),
    ("interval", r"[5, \infty)", r"\boxed{x > 5}"),
    ("interval", r"x \ge 5", r"\boxed{(-\infty, 5]}"),
    ("interval", r"-2 \le x \le 7", r"\boxed{(-2, 7]}"),
    ("interval", r"[-2,7]", r"$x \in [-2,8]$"),
    ("interval", r"(-\infty,\infty)", r"\boxed{(0, \infty)}"),
    ("relation", "x > 5", "$x < 5$"),
    ("relation", r"x \geq 5", r"$x \leq 5$"),
    ("relation", "x < 1", "$x > -1$"),
    ("relation", "x > 5", "$y > 5$"),
    # lists: missing, extra, or different elements
    ("list", "-2, 5", r"\boxed{5}"),
    ("list", "10, 4, -2", r"\boxed{4, 10, -2}"),  # bare lists are ordered ("find a, b, c")
    ("list", "0.1, 4, 2", "4, .1, 2"),
    ("list", "-2, 5", r"\boxed{-2, 5, 7}"),
    ("list", r"1 \pm \sqrt{19}", r"\boxed{1+\sqrt{19}}"),
    ("list", r"\pm 2021", r"\boxed{2021}"),
    ("list", "2021", r"\boxed{\pm 2021}"),
    ("list", "19, 46, and 82", r"$21, 36, \text{ and } 82$"),
    ("list", "(1,2)", r"\boxed{(2, 1)}"),
    ("list", "(3,1)", r"\boxed{\{1,3\}}"),
    # matrices
    (
        "matrix",
        r"\begin{pmatrix} 1 & 2 \\ 3 & 4 \end{pmatrix}",
        r"$\begin{pmatrix}1&2\\3&5\end{pmatrix}$",
    ),
    (
        "matrix",
        r"\begin{pmatrix} 1 & 2 \\ 3 & 4 \end{pmatrix}",
        r"$\begin{pmatrix}1&3\\2&4\end{pmatrix}$",
    ),
    (
        "matrix",
        r"\begin{pmatrix} 6 & 8 \\ 10 & 12 \end{pmatrix}",
        r"$\begin{pmatrix}1&2\\3&4\end{pmatrix}\begin{pmatrix}5&6\\7&8\end{pmatrix}$",
    ),
    # number notations
    ("number", r"\frac{1}{3}", r"\boxed{0.33}"),
    ("number", r"\sqrt{2}", r"\boxed{1.414}"),
    ("number", r"\frac{8}{3}", r"\boxed{2.667}"),
    ("number", "1000", r"\boxed{10^4}"),
    ("number", "1500", r"\boxed{1.5e4}"),
    ("number", "1000", r"\boxed{1.1\times10^3}"),
    ("number", "12", r"\boxed{1\times 2}"),
    ("number", "6", "1 2 3"),
    # named values: an expression on the left is not a name
    ("prefix", "0", r"\boxed{a + 3z = 0}"),
    ("prefix", "1", r"\boxed{2x + z = 1}"),
    ("prefix", "11a+c", r"\boxed{7 = 11a + c}"),
    ("prefix", "(p,q)=(3,2)", r"\boxed{(2, 3)}"),
    ("prefix", "2x+3", r"\boxed{f(x) = 2x - 3}"),
    ("prefix", "f(x)", r"\boxed{f(y)}"),
    ("ratio", "12:00", "$1:00$"),
    ("ratio", "7:32", r"\boxed{32:7}"),
    # units and number words
    ("units", r"3\text{ million}", r"\boxed{3000}"),
    ("units", "350000", "The book has 35,000 pages."),
    # decimal commas never turn a list into a number or the reverse
    ("decimal", "-2, 1", r"\boxed{-2.1}"),
    ("decimal", "1.5", r"\boxed{1, 5}"),
    ("decimal", "1000.99", "1000,9"),
    # angles and percentages
    ("angle", r"30^\circ", r"\boxed{\frac{\pi}{3}}"),
    ("angle", r"\frac{\pi}{2}", r"\boxed{90}"),
    ("percent", r"28\%", r"\boxed{0.28\%}"),
    ("percent", r"20\%", r"\boxed{2}"),
]


# Answers as other graders' own tests state them: bare strings or boxed, and near misses.
GRADER_STYLE = [
    ("\\frac{\\sqrt{3}}{3}", "\\boxed{\\frac{1}{\\sqrt{3}}}", True),
    ("2\\sqrt{2}", "\\boxed{\\sqrt{8}}", True),
    ("(-\\infty, -2]\\cup[2,\\infty)", "\\boxed{x \\le -2 \\text{ or } x \\ge 2}", True),
    ("(-\\infty, -2]\\cup[2,\\infty)", "\\boxed{x \\in (-\\infty,-2] \\cup [2, \\infty)}", True),
    ("\\$1.50", "\\boxed{1.5}", True),
    ("1.50", "\\boxed{\\$1.50}", True),
    ("x=\\frac{1}{2}", "\\boxed{\\frac12}", True),
    ("50\\%", "\\boxed{50}", True),
    ("5", "\\boxed{5\\text{ ways}}", True),
    ("5", "\\boxed{5^{\\text{th}}}", True),
    ("\\text{C}", "The answer is \\textbf{(C)}", True),
    ("3", "Thus, the answer is $\\boxed{3}$.\\n\\nWait, let me double check: $2+1=3$. Yes.", True),
    ("3", "The answer is 3.\\n\\nBut wait, actually it's 4. The answer is 4.", False),
    ("-\\frac{3}{2}", "\\boxed{-1.5}", True),
    ("-\\frac{3}{2}", "\\boxed{1.5}", False),
    ("\\frac{3}{2}", "\\boxed{\\frac{3}{2}x}", False),
    ("2", "\\boxed{2.0000001}", False),
    ("8", "\\boxed{2^3}", True),
    ("(1,2,3)", "\\boxed{\\langle 1, 2, 3 \\rangle}", True),
    ("\\begin{pmatrix} 1 \\\\ 2 \\\\ 3 \\end{pmatrix}", "\\boxed{\\langle 1,2,3\\rangle}", True),
    ("y^2 = 4x", "\\boxed{4x = y^2}", True),
    ("y^2 = 4x", "\\boxed{y^2 = -4x}", False),
    ("\\frac{x^2}{4} + \\frac{y^2}{9} = 1", "\\boxed{9x^2 + 4y^2 = 36}", True),
    ("k \\ge 2", "$$\\boxed{k \\ge 2}$$", True),
    ("e", "\\boxed{e}", True),
    ("e^2", "\\boxed{e^{2}}", True),
    ("\\ln 2", "\\boxed{\\log 2}", False),
    ("i", "\\boxed{i}", True),
    ("2i", "\\boxed{-2i}", False),
    ("3+4i", "\\boxed{4i+3}", True),
    ("0", "\\boxed{0.0}", True),
    ("\\emptyset", "\\boxed{\\emptyset}", True),
    ("\\emptyset", "\\boxed{\\{\\}}", True),
    ("\\infty", "\\boxed{+\\infty}", True),
    ("6", "The final answer is $\\boxed{6}$ square units.", True),
    ("6", "6.", True),
    ("6", "6", True),
    ("60", "60 degrees", True),
    ("24", "4! = 24", True),
    ("24", "$4!$", True),
    ("\\text{odd}", "\\boxed{\\text{neither}}", False),
    ("1", "\\boxed{I}", False),
    ("(2,3)", "\\boxed{x=2, y=3}", True),
    ("(2,3)", "\\boxed{x=3, y=2}", False),
    ("2", "\\boxed{x^2}", False),
    ("-1", "\\boxed{-1 }", True),
    ("\\sqrt{2}", "\\boxed{2^{1/2}}", True),
    ("\\frac{1}{2}", "\\boxed{\\frac{2}{4}}", True),
    ("1/2", "\\boxed{0.5}", True),
    ("0.5", "\\boxed{\\frac{1}{2}}", True),
    ("10", "\\boxed{10.0}", True),
    ("1000", "\\boxed{1,000}", True),
    ("1000", "\\boxed{1.000}", False),
    ("(-\\infty, -2]\\cup[2,\\infty)", "\\boxed{(-\\infty, -2)\\cup[2,\\infty)}", False),
    ("\\frac{1}{2}", "The answer is $0.5$.", True),
    ("\\frac{\\sqrt{2}}{2}", "\\boxed{\\sqrt{2}/2}", True),
    ("\\$5", "\\boxed{5}", True),
    ("5\\%", "\\boxed{0.05}", True),
    ("(1,2)", "\\boxed{(2,1)}", False),
    ("2\\pi", "\\boxed{6.28}", False),
    ("\\text{(B)}", "\\boxed{B}", True),
    ("\\text{B}", "\\boxed{B}", True),
    ("x^2+2x+1", "\\boxed{(x+1)^2}", True),
    ("10", "\\boxed{10\\text{ inches}}", True),
    ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "\\boxed{[1, 2]}", True),
    ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "\\boxed{(2, 1)}", False),
    ("-\\frac{1}{2}", "\\boxed{\\frac{-1}{2}}", True),
    ("\\frac{3}{4}", "\\boxed{\\frac{4}{3}}", False),
    ("6", "The final answer is $\\boxed{6}$. I hope it is correct.", True),
    ("y = -2x + 3", "\\boxed{y=3-2x}", True),
    ("y = -2x + 3", "\\boxed{-2x+3}", True),
    ("y = -2x + 3", "\\boxed{y=-2x-3}", False),
    ("\\sqrt{3}", "\\boxed{3^{1/2}}", True),
    ("0", "The answer is $\\boxed{0}$", True),
    ("1", "\\boxed{1.0}", True),
    ("3", "\\boxed{3.5}", False),
    ("\\infty", "\\boxed{\\infty}", True),
    ("(-\\infty, 2) \\cup (3, \\infty)", "\\boxed{(-\\infty,2)\\cup(3,\\infty)}", True),
    ("(-\\infty, 2) \\cup (3, \\infty)", "\\boxed{(-\\infty,2]\\cup(3,\\infty)}", False),
    ("x<2 \\text{ or } x>3", "\\boxed{(-\\infty,2)\\cup(3,\\infty)}", True),
    ("(-\\infty, 2) \\cup (3, \\infty)", "\\boxed{x<2 \\text{ or } x>3}", True),
    ("2, -3", "\\boxed{x=2 \\text{ or } x=-3}", True),
    ("2, -3", "\\boxed{x=2, x=-3}", True),
    ("2, -3", "\\boxed{x=2}", False),
    ("\\text{Monday}", "\\boxed{\\text{Tuesday}}", False),
    ("\\frac{7}{2}", "\\boxed{3\\frac{1}{2}}", True),
    ("\\frac{7}{2}", "\\boxed{3.5}", True),
    ("72^\\circ", "\\boxed{72}", True),
    ("\\{1, 2\\}", "\\boxed{\\{2, 1\\}}", True),
    ("5", "The answer is 5 apples.", True),
    ("5", "The answer is 50.", False),
    ("18", "Janet makes $18 every day. The answer is 18", True),
    ("1/4", "\\boxed{25\\%}", True),
    ("25", "\\boxed{25\\%}", True),
    ("12", "So the total is 5 + 7 = 12 apples.", True),
    ("12", "The total is $5 + 7 = 12$.", True),
    ("x=3", "We find $x = 3$.", True),
    ("3", "Thus $a + b = 3$.", False),
    ("\\frac{1}{2}", "$\\frac{1}{2}$", True),
    ("2", "$\\frac{1}{2}$", False),
    ("4", "$\\sqrt{4}$", False),
    ("20", "$\\binom{6}{3}$", True),
    ("\\dbinom{6}{3}", "\\boxed{20}", True),
    ("1.5", "\\boxed{\\frac{3}{2}}", True),
    ("0.\\overline{3}", "\\boxed{\\frac13}", True),
    ("3\\sqrt{2}", "\\boxed{\\sqrt{18}}", True),
    ("3\\sqrt{2}", "\\boxed{4.24}", False),
    ("\\text{even}", "\\boxed{\\text{odd}}", False),
    ("\\text{even}", "\\boxed{\\text{Even}}", True),
    ("(3, -1)", "The point is $(3,-1)$.", True),
    ("(3, -1)", "The point is $(3,1)$.", False),
    ("\\frac{1}{1000}", "\\boxed{10^{-3}}", True),
    ("1000000", "\\boxed{10^6}", True),
    ("2^{10}", "\\boxed{1024}", True),
    ("a=2, b=3", "\\boxed{(2,3)}", True),
    ("a=2, b=3", "\\boxed{(3,2)}", False),
    ("6", "**Answer:** 6", True),
    ("6", "Answer: \\(6\\)", True),
    ("x \\in (1, 3)", "\\boxed{1 < x < 3}", True),
    ("x \\in (1, 3)", "\\boxed{1 \\le x < 3}", False),
    ("1 < x < 3", "\\boxed{(1, 3)}", True),
    ("\\pm 3", "\\boxed{3, -3}", True),
    ("\\pm 3", "\\boxed{3}", False),
    ("3", "\\boxed{\\pm 3}", False),
    ("0.1", "\\boxed{10\\%}", True),
    ("10", "\\boxed{10\\%}", True),
    ("1", "\\boxed{100\\%}", True),
    ("45", "\\boxed{\\frac{\\pi}{4}}", False),
    ("\\frac{\\pi}{4}", "\\boxed{45^{\\circ}}", True),
    ("\\frac{\\pi}{4}", "\\boxed{45}", False),
    ("5", "\\boxed{5 \\text{ cm}^2}", True),
    ("5 \\text{ cm}^2", "\\boxed{5}", True),
    ("5", "\\boxed{5\\text{ and }6}", False),
    ("3", "\\boxed{2+1}", True),
    ("11", "\\boxed{11_{10}}", True),
    ("1011_2", "\\boxed{1011_2}", True),
    ("1011_2", "\\boxed{1011}", True),
    ("1011_2", "\\boxed{11}", False),
    ("\\frac{1}{12}", "0.0833333333333333", True),
    ("(1,\\frac{9}{2})", "(1,4.5)", True),
    ("\\frac{x+2}{7}", "\\frac{x}{7}+\\frac{2}{7}", True),
    ("\\tan^2(y)+1", "\\sec^2(y)", True),
    (
        "(\\begin{pmatrix}-\\frac{7}{4}&-2\\\\4&\\frac{1}{4}\\\\\\end{pmatrix})",
        "\\begin{pmatrix}-\\frac{7}{4}&-2\\\\4&\\frac{1}{4}\\end{pmatrix}",
        True,
    ),
    (
        "(\\begin{pmatrix}\\frac{1}{3\\sqrt[3]{x}^2}&0&0\\\\0&1&0\\\\-\\sin(x)&0&0\\\\\\end{pmatrix})",
        "\\begin{pmatrix}\\frac{1}{3x^{2/3}}&0&0\\\\0&1&0\\\\-\\sin(x)&0&0\\end{pmatrix}",
        True,
    ),
    (
        "-\\frac{2(x^2+6)}{9(x^2-2)\\sqrt[3]{x^2-2}^2}",
        "-\\frac{8x^2}{9(x^2-2)^{5/3}}+\\frac{2}{3(x^2-2)^{2/3}}",
        True,
    ),
    ("34x+45y-20z+100=0", "-34x-45y+20z-100=0", True),
    (
        "\\frac{\\sqrt{\\sqrt{11}+\\sqrt{194}}}{15+2\\sqrt{33}}",
        "\\frac{\\sqrt{\\sqrt{11}+\\sqrt{194}}}{2\\sqrt{33}+15}",
        True,
    ),
    ("(a+5)(b+2)", "(+5)(b+2)", False),
    ("2", "\\frac{1+\\sqrt{5}}{2}", False),
    ("4", "\\frac{34}{16}+\\frac{\\sqrt{1358}}{16}", False),
    ("1\\\\sqrt{19}", "1", False),
    ("(\\frac{3}{5},\\frac{8}{3}]", "(0.6,2.6667]", True),
    ("x+2n+1", "x+1", False),
]


@pytest.mark.parametrize(("gold", "completion", "label"), GRADER_STYLE)
def test_grader_style_answers(gold: str, completion: str, label: bool) -> None:
    result = verify(gold, completion, timeout_s=20)
    assert result.correct is label, result


@pytest.mark.parametrize(("cls", "gold", "completion"), CORRECT)
def test_correct_answers_per_class(cls: str, gold: str, completion: str) -> None:
    result = verify(gold, completion, timeout_s=20)
    assert result.correct, (cls, result)


@pytest.mark.parametrize(("cls", "gold", "completion"), WRONG)
def test_near_misses_are_never_correct(cls: str, gold: str, completion: str) -> None:
    result = verify(gold, completion, timeout_s=20)
    assert not result.correct, (cls, result)


def test_batched_verdicts_have_no_false_positive() -> None:
    rows = [(g, c, True) for _, g, c in CORRECT] + [(g, c, False) for _, g, c in WRONG]
    results = verify_batch([g for g, _, _ in rows], [c for _, c, _ in rows], timeout_s=20)
    assert [r.correct for r in results] == [label for _, _, label in rows]


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        (r"The answer is $\frac{1+\sqrt{5}}{2}$", r"\frac{1+\sqrt{5}}{2}"),
        ("The interval is $[0,9)$.", "[0,9)"),
        (r"The number of subsets is $2^{10}$.", "2^{10}"),
        ("AZYUK2A", None),
        (r"so \boxed{(1, 2)}, \boxed{(2, 1)}", "(1, 2) and (2, 1)"),
        (r"\boxed{4}. Hmm, that was step one; then \boxed{5}", "5"),
        ("She pays $5 and gets $3 back, so 2 are left.", "2"),
        (r"first $x=1$, then $y = 2$ apples", "y = 2"),
        ("The answer is 12.", None),  # strict mode below
    ],
)
def test_loose_extraction_takes_whole_expressions(completion: str, expected: str | None) -> None:
    strict = completion == "The answer is 12."
    assert extract_answer(completion, strict=strict) == expected


def test_math_spans_and_standalone_numbers() -> None:
    assert [c for _, _, c in math_spans(r"$a$ and \(b\) and \[c\] and $$d$$")] == list("abcd")
    assert [c for _, _, c in math_spans("costs $5 and then $6 more")] == []
    assert math_spans("$x\n$")[0][2] == ""  # an inline span cannot cross a line
    assert last_standalone_number("it is 5cm long, not 3x") == "5"
    assert last_standalone_number("it weighs 12€") == "12"
    assert last_standalone_number(r"10^{3} and 3+4") is None
    assert last_standalone_number("the 3rd of 2/3") == "2/3"


@pytest.mark.parametrize(
    ("gold", "answer"),
    [
        ("$x \\ge 5$", "$x \\ge 5$"),
        ("$1$ and $2$", "$1$ and $2$"),
        (
            "Final Answer: The final answer is $28 \\%$. I hope it is correct. Note: wrong.",
            "28 \\%",
        ),
        (r"so \(\boxed{1}\) and \(\boxed{-2}\).", "1 and -2"),
    ],
)
def test_gold_answer_forms(gold: str, answer: str) -> None:
    assert gold_answer(gold) == answer


def test_suite_loader_reads_parametrize_lists_as_data(tmp_path: Path) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
    from mv_suite import load_suite

    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text(
        "import math\nimport pytest\nfrom tests.test_all import compare_strings\n\n"
        "@pytest.mark.parametrize('gold,pred,expected,precision', [\n"
        "    ('$1$', '$1.0$', 1, 6),\n"
        "    (f'{math.sqrt(4):.1f}', '2', 1, 2),\n])\n"
        "def test_a(gold, pred, expected, precision):\n"
        "    assert compare_strings(gold, pred, match_types=['latex'], precision=precision)"
        " == expected\n\n"
        "@pytest.mark.parametrize('gold, pred, result', [('$2$', '$3$', 0)])\n"
        "def test_b(gold, pred, result):\n"
        "    assert int(verify(parse(gold), parse(pred))) == result\n\n"
        "@pytest.mark.parametrize('pred,expected', [('A', ['a'])])\n"
        "def test_c(pred, expected):\n    assert parse(pred) == expected\n"
    )
    cases = load_suite(tmp_path)
    assert [(c.gold, c.pred, c.label) for c in cases] == [
        ("$1$", "$1.0$", True),
        ("2.0", "2", True),
        ("$2$", "$3$", False),
    ]
    assert cases[0].match_types == ("latex",) and cases[0].default_options
    assert cases[1].options["precision"] == 2 and not cases[1].default_options
    assert cases[2].helper == "parse_verify"
    with pytest.raises(FileNotFoundError, match="Math-Verify checkout"):
        load_suite(tmp_path / "tests" / "missing")


@pytest.mark.parametrize(
    "make",
    [
        lambda n: "$" + "a" * n + "$",
        lambda n: "a" * n,
        lambda n: "The answer is " + "ab1" * n,
        lambda n: "1 " * n,
        lambda n: "Wait, it is 3. " * n,
        lambda n: "So x = 3. Check: 3 + 1 = 4. " * n,
        lambda n: "March 5, 2020 at 7:30 a.m. " * n,
        lambda n: "2 1/2 " * n,
    ],
)
def test_new_scans_do_linear_work_on_hostile_text(make) -> None:
    def run(text: str) -> None:
        extract_answer(text)
        gold_answer(text)

    assert_linear(run, make, 1_000)


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("$" + "a" * 60_000 + "$", None),
        ("a" * 90_000, None),
        ("The answer is " + "ab1" * 20_000, None),
        ("1 " * 40_000, "1"),
    ],
)
def test_hostile_text_has_no_answer(text: str, answer: str | None) -> None:
    assert extract_answer(text) == answer
    assert gold_answer(text) == answer
