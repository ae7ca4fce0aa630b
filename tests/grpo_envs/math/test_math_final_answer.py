"""No credit for an answer the completion did not give: labeled cases per false-positive class.

Each class has right answers (which must stay right: a rule that refuses them hides signal) and
near misses a reward hacker would find (which must never be judged correct). The classes:

* restate: the question's own sum, integral, product, limit or derivative, unevaluated;
* exact: integers and rationals compare exactly; a decimal only as a rounding of its digits;
* sign: the text fallback (no parser reads either side) keeps signs;
* piece: a part of a mixed number, clock time, date, ordinal or amount is not the answer;
* final: loose mode takes the final stated answer (checks, worked cases, retractions, hedges,
  truncated text, an unclosed think block).
"""

from __future__ import annotations

import pytest

from grpo_envs.math import extract_answer, verify, verify_batch
from grpo_envs.math.extract import final_statement, find_last_boxed

# (class, gold, completion)
RIGHT = [
    # restate: closed forms and golds that hold the operator themselves
    ("restate", "55", r"The sum is $1 + 2 + \cdots + 10 = 55$, so \boxed{55}."),
    ("restate", r"\frac{1}{3}", r"$\int_0^1 x^2\,dx = \frac{1}{3}$, hence \boxed{\frac{1}{3}}."),
    ("restate", "1024", r"\boxed{2^{10}}"),
    ("restate", "20", r"\boxed{\binom{6}{3}}"),
    ("restate", "120", r"\boxed{5!}"),
    ("restate", r"\frac{3}{4}", r"\boxed{\frac{6}{8}}"),
    ("restate", r"\sum_{k=1}^{n} k^2", r"\boxed{\sum_{k=1}^{n} k^2}"),
    ("restate", r"\lim_{x \to 0} f(x)", r"\boxed{\lim_{x \to 0} f(x)}"),
    ("restate", "2x", r"The derivative is $\frac{d}{dx} x^2 = 2x$, so \boxed{2x}."),
    # exact: equal values, however written
    ("exact", "2^{100}", r"\boxed{1267650600228229401496703205376}"),
    ("exact", "1267650600228229401496703205376", r"\boxed{2^{100}}"),
    ("exact", r"\frac{1}{3}", r"\boxed{0.33333}"),
    ("exact", r"\frac{1}{3}", r"\boxed{0.3333333333}"),
    ("exact", r"\frac{8}{3}", r"\boxed{2.6667}"),
    ("exact", r"\frac{8}{3}", r"\boxed{2.6666}"),  # truncated to its places
    ("exact", r"\sqrt{2}", r"\boxed{1.41421}"),
    ("exact", r"\pi", r"\boxed{3.14159}"),
    ("exact", r"\pi", r"\boxed{3.1416}"),
    ("exact", r"\pi", r"\boxed{3.1415}"),  # cut to its places
    ("exact", r"-\frac{2}{3}", r"\boxed{-0.66667}"),
    ("exact", r"\sqrt{2} + \sqrt{3}", r"\boxed{\sqrt{5 + 2\sqrt{6}}}"),
    ("exact", "0.5", r"\boxed{\frac{1}{2}}"),
    ("exact", "3^{4^{2}}", r"\boxed{43046721}"),
    ("exact", r"2^{64}", r"\boxed{18446744073709551616}"),
    # sign: an unparsed answer equals only itself
    ("sign", r"\text{Odd}", r"\boxed{\text{odd}}"),
    ("sign", r"\text{non-negative}", r"\boxed{\text{nonnegative}}"),
    ("sign", r"\text{no solution}", r"\boxed{\text{No solution}}"),
    ("sign", r"\text{the } -1 \text{ branch}", r"\boxed{\text{the }-1\text{ branch}}"),
    # piece: whole tokens compare whole
    ("piece", r"2\frac{1}{2}", "She needs 2 1/2 liters."),
    ("piece", r"\frac{5}{2}", "She needs 2 1/2 liters."),
    ("piece", "7:30", "They meet at 7:30 a.m."),
    ("piece", "19:30", "The train leaves at 7:30 p.m."),
    ("piece", "3.50", "It costs $3.50."),
    ("piece", "100", "The 21st term is 100."),
    ("piece", "21", r"The term is the \boxed{21\text{st}} one."),
    # final: the final stated answer
    ("final", "3", "So y = 3. Check: 3(3) - 2 = 7."),
    ("final", "3", "x = 3. Substituting back: 2(3) + 1 = 7, which checks out."),
    ("final", "10", "The result is 10. For a smaller case, n = 3 gives 6."),
    ("final", "6", "So the answer is 5. Wait, I made an error: it is 6."),
    ("final", "11", "The total is 10. Wait, I forgot the tax: it is 11."),
    ("final", "12", "Oops, 13 was wrong. Recounting, there are 12 marbles."),
    ("final", "5", r"Thus \boxed{5}. Wait, let me double-check: 2 + 3 = 5. Yes."),
    ("final", "8", "<think>\nmaybe 7\n</think>\nShe has 8 apples."),
    ("final", "42", "The total is 42. I hope it is correct."),
    ("final", "18", "She makes 9 * 2 = 18 dollars a day."),
    ("final", "8", "We need 3 + 6 = 9... wait, 3 + 5 = 8. So 8."),
    ("final", "7", "So the total is 3 + 4 = 7"),
    ("final", "5", "The answer is 5. Let me verify: 5 * 2 = 10. Correct."),
    ("final", "12", "So she has 12 apples. Double-check: 12 - 3 = 9 remain, as stated."),
    ("final", "4", "The answer is probably 4."),  # one candidate, however hedged, is an answer
    ("final", "72", "She sold 48/2 = 24 clips in May. Altogether she sold 48+24 = 72 clips."),
    ("final", "12", "Now she has 12 dollars left."),
    ("final", "12", "Then she has 12."),
    ("final", "4", "Let me compute 3 + 1 = 4"),  # announced and done
    ("final", "5", "Now we will add 2 + 3 = 5."),
    ("final", "180", "We get j = $20. Substituting this value back into e = 9j, we get e = $180"),
    ("final", "30", "To find the total after the return: 25 oranges + 5 oranges = 30 oranges."),
    ("final", "8", "On the 2nd day half is left, or 16 * 1/2 = 8 bottles"),
    ("final", "60", "That means she saved 210 / 350 = 0.60 or 60% off on the dress."),
    ("final", "65", "This means he picks the 75 - 10 = 65th show."),  # an ordinal computed
    ("final", "6", "So he will ride 150 - 144 = 6 miles on the 13th day."),
    ("final", "30", "Therefore, Reynald bought 145 - 115 = 30 volleyballs,"),
    ("final", "15", "Thus, there are 9 + 6 = 15 liters of water out of the 24 liters."),
    ("final", "9", "So in total, he scored 4+5=9 points in the 40 minutes"),
    ("final", "17", "He needs 1340/80 = 16.75 bags, meaning the family will need to buy 17 bags."),
    ("final", "33", "That is 9 / 27 * 100% = 33.333%, which rounds down to 33%."),
    ("final", "30", "There were 60 zombies / 2 = 30 zombies, which is 20 more than last week."),
    ("piece", "210", "It takes 210 minutes."),
    ("piece", "(3, 4)", "The point is (3, 4)."),
    ("piece", "2.5", "The answer is 2 1/2"),
    ("piece", "25", "She has 25 cents left."),
]

WRONG = [
    # restate: boxing the question's expression is not answering it
    ("restate", "55", r"\boxed{\sum_{k=1}^{10} k}"),
    ("restate", "55", r"The answer is $1 + 2 + \cdots + 10$."),
    ("restate", "2", r"\boxed{\int_0^{2} 1\,dx}"),
    ("restate", r"\frac{1}{3}", r"\boxed{\int_{0}^{1} x^{2} \, dx}"),
    ("restate", "120", r"\boxed{\prod_{k=1}^{5} k}"),
    ("restate", "1", r"\boxed{\lim_{x\to 0} \frac{\sin x}{x}}"),
    ("restate", "1", r"\boxed{\sum_{n=0}^{\infty} \frac{1}{2^{n+1}}}"),
    ("restate", "2", r"\boxed{\frac{d}{dx} x^2 \Big|_{x=1}}"),
    ("restate", "2x", r"\boxed{\frac{d}{dx} x^2}"),
    ("restate", "6", r"\boxed{\left. x^2 + 2x \right|_{0}^{2}}"),
    ("restate", "e", r"\boxed{\lim_{n \to \infty} \left(1 + \frac{1}{n}\right)^n}"),
    ("restate", "x = 55", r"\boxed{x = \sum_{k=1}^{10} k}"),
    # exact: one more, one part in 10^40, or a rounding with too few or wrong digits
    ("exact", "2^{100}", r"\boxed{1267650600228229401496703205377}"),
    ("exact", "1267650600228229401496703205376", r"\boxed{2^{100} + 1}"),
    ("exact", "1", r"\boxed{1+10^{-40}}"),
    ("exact", "1", r"\boxed{\frac{10^{50}+1}{10^{50}}}"),
    ("exact", "2^{3^{4}}", r"\boxed{3^{4^{3}}}"),
    ("exact", r"2^{64}", r"\boxed{18446744073709551617}"),
    ("exact", r"\pi", r"\boxed{\pi + 10^{-45}}"),
    ("exact", r"\sqrt{2}", r"\boxed{\sqrt{2} + \frac{1}{10^{60}}}"),
    ("exact", r"2^{100}\sqrt{2}", r"\boxed{2^{100}\sqrt{2} + 1}"),
    ("exact", r"\frac{1}{3}", r"\boxed{0.33}"),
    ("exact", r"\frac{1}{3}", r"\boxed{0.3334}"),
    ("exact", r"\frac{1}{3}", r"\boxed{0.3333334}"),
    ("exact", r"\frac{8}{3}", r"\boxed{2.6668}"),
    ("exact", r"\sqrt{2}", r"\boxed{1.41422}"),
    ("exact", r"\pi", r"\boxed{3.1414}"),
    ("exact", r"\pi", r"\boxed{3.1417}"),
    ("exact", "0.5", r"\boxed{0.5000001}"),
    ("exact", "1000000", r"\boxed{1000000.1}"),
    (
        "exact",
        r"\frac{1}{3}",
        r"\boxed{\frac{1000000000000000000000000000001}{3000000000000000000000000000000}}",
    ),
    # sign: piecewise and text answers that differ only in a sign or a digit
    (
        "sign",
        r"\begin{cases} x & x > 0 \\ -x & x \le 0 \end{cases}",
        r"\boxed{\begin{cases} x & x > 0 \\ x & x \le 0 \end{cases}}",
    ),
    ("sign", r"f(x) = -x \text{ for } x < 0", r"\boxed{f(x) = x \text{ for } x < 0}"),
    ("sign", r"-\text{foo bar}", r"\boxed{\text{foo bar}}"),
    ("sign", r"\text{decreasing on } (-\infty, -2)", r"\boxed{\text{decreasing on } (-\infty, 2)}"),
    ("sign", r"f^{-1}(x) \text{ does not exist}", r"\boxed{f^{1}(x) \text{ does not exist}}"),
    ("sign", r"\text{the } -1 \text{ branch}", r"\boxed{\text{the } 1 \text{ branch}}"),
    (
        "sign",
        r"y = -2 \text{ when } x \text{ is odd}",
        r"\boxed{y = 2 \text{ when } x \text{ is odd}}",
    ),
    # piece: a fraction, the minutes, an ordinal, a day or the cents are not the answer
    ("piece", r"\frac{1}{2}", "She needs 2 1/2 liters."),
    ("piece", "2", "She needs 2 1/2 liters."),
    ("piece", "2", "The answer is 2 1/2 liters."),
    ("piece", "30", "They meet at 7:30 a.m."),
    ("piece", "7", "They meet at 7:30 a.m."),
    ("piece", "30", r"The answer is $7:30$."),
    ("piece", "7:30", "The train leaves at 7:30 p.m."),
    ("piece", "21", "It is the 21st term."),
    ("piece", "3", "The 3rd term of the sequence."),
    ("piece", "15", "The date is March 15, 2024."),
    ("piece", "2024", "The date is March 15, 2024."),
    ("piece", "15", "They arrive on 15 March 2024."),
    ("piece", "50", "It costs $3.50."),
    ("piece", "12", "Her birthday is 12/25."),
    # final: a number after the answer, a retracted answer, a hedge, no result at all
    ("final", "7", "So y = 3. Check: 3(3) - 2 = 7."),
    ("final", "7", "x = 3. Substituting back: 2(3) + 1 = 7, which checks out."),
    ("final", "6", "The result is 10. For a smaller case, n = 3 gives 6."),
    ("final", "6", "The result is 10. For example, with 3 people we would get 6."),
    ("final", "5", "So the answer is 5. Wait, I made an error: it is 6."),
    ("final", "13", "Oops, 13 was wrong. Recounting, there are 12 marbles."),
    ("final", "5", "The answer is 5. Hmm, that is wrong."),
    ("final", "5", r"\boxed{5}. Oops, I made a mistake."),
    ("final", "4", "It could be 4 or 5."),
    ("final", "5", "It could be 4 or 5."),
    ("final", "7", "Maybe 7, but I am not sure."),
    ("final", "4", "Let me compute 3 + 1 = 4, then multiply by"),
    ("final", "4", "First 3 + 1 = 4. Now we multiply this by the number of"),
    ("final", "12", "So far 3 * 4 = 12. Next we need to add the remaining"),
    ("final", "4", "<think> 2 + 2 = 4 so"),
    ("final", "4", "<think>\nthe total is 4"),
    ("final", "4", r"<think>\nso \boxed{4}"),
    ("final", "4", "She had 4 apples. Now she gets 3 more and"),
    ("final", "4", "So the total is 3 + 4"),  # an operand of an unfinished sum
    ("final", "1", "Let me add 3 and 1."),  # work announced, not done
    ("final", "3", "Now we need to multiply 4 by 3."),
    ("final", "4", "The answer is 4, or possibly 5."),
    ("final", "5", "The answer is 5 (or 6 if we count the endpoints)."),
    ("final", "5", "Answer: 5. Actually, no: it is 6."),
    ("final", "5", "Answer: 5. No, wait, it is 6."),
    ("final", "7", "x = 3. We can verify: 2(3) + 1 = 7."),
    ("final", "7", "x = 3. If we plug in x = 3, we get 7, which is correct."),
    ("final", "7", "x = 3. Substituting back: 2(3) + 1 = 7."),
    ("final", "9", "We need 3 + 6 = 9... wait, 3 + 5 = 8. So 8."),
    ("final", "8", "Either 8 or 9."),
    ("final", "24", "Thus, there are 9 + 6 = 15 liters of water out of the 24 liters."),
    ("final", "30", "6 x 5 = 30 eggs in total, plus 2 spares."),
    (
        "final",
        "16.75",
        "He needs 1340/80 = 16.75 bags, meaning the family will need to buy 17 bags.",
    ),
    ("final", "20", "There were 60 zombies / 2 = 30 zombies, which is 20 more than last week."),
    ("final", "12", "It is probably 12 or 13."),
    ("final", "5", "<think>The answer is 5</think><think>maybe"),
    ("final", "6", r"\boxed{3!}. Hmm wait, that's wrong."),
    ("piece", "30", "It takes 3 hours and 30 minutes."),
    ("piece", "3", "It takes 3 hours and 30 minutes."),
    ("piece", "50", "It costs 2 dollars and 50 cents."),
    ("piece", "3", "The 3rd day she has 10 apples... so on the 3rd day"),
    ("piece", "4", "The point is (3, 4)."),
    ("restate", "10", r"The answer is \boxed{\sum_{i=1}^{4} i}"),
    ("restate", "0", r"\boxed{\lim_{x\to\infty} \frac{1}{x}}"),
    ("restate", "x^3", r"\boxed{\int 3x^2 \, dx}"),
    ("exact", "1", r"\boxed{1.0000001}"),
    ("exact", "1", r"\boxed{0.99999999}"),
    ("exact", "2", r"\boxed{\sqrt{4.0001}}"),
    ("exact", r"\frac{2}{3}", r"\boxed{0.6667}"),  # four significant digits: an approximation
    ("exact", "e", r"\boxed{2.718}"),
]


@pytest.mark.parametrize(("cls", "gold", "completion"), RIGHT)
def test_right_answers_stay_right(cls: str, gold: str, completion: str) -> None:
    result = verify(gold, completion, timeout_s=20)
    assert result.correct, (cls, result)


@pytest.mark.parametrize(("cls", "gold", "completion"), WRONG)
def test_answers_the_completion_did_not_give_get_no_credit(
    cls: str, gold: str, completion: str
) -> None:
    result = verify(gold, completion, timeout_s=20)
    assert not result.correct, (cls, result)


def test_batched_verdicts_agree() -> None:
    rows = [(g, c, True) for _, g, c in RIGHT] + [(g, c, False) for _, g, c in WRONG]
    results = verify_batch([g for g, _, _ in rows], [c for _, c, _ in rows], timeout_s=20)
    assert [r.correct for r in results] == [label for _, _, label in rows]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("So y = 3. Check: 3(3) - 2 = 7.", "3"),
        ("It is 12. Hope this helps!", "12"),
        ("The total is 10. Wait, I forgot the tax: it is 11.", "11"),
        ("x = 5. Wait, let me check: 5 + 1 = 6.", "5"),
        ("It is 5. That is wrong.", None),
        ("It could be 4 or 5.", None),
        ("Either 4 or 5 works.", None),
        ("Then we add 3 and", None),
        ("The sum is 3 +", None),
        ("Let's compute the total now.", None),
        ("", None),
    ],
)
def test_final_statement_rule(text: str, expected: str | None) -> None:
    assert final_statement(text) == expected


@pytest.mark.parametrize(
    ("completion", "strict", "expected"),
    [
        ("<think>\n2 + 2 = 4\n</think>\nThe answer is 4.", False, "4"),
        ("<think>\n2 + 2 = 4, so \\boxed{4}", False, None),
        ("<think>\n2 + 2 = 4, so \\boxed{4}", True, None),
        ("<think>a</think> ok <think> then 5", False, None),
    ],
)
def test_unclosed_think_block_has_no_answer(completion: str, strict: bool, expected: str) -> None:
    assert extract_answer(completion, strict=strict) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"\boxed{1} and \boxed{ 2 }", "2"),
        (r"\boxed{3} and an unclosed \boxed{4", "3"),
        (r"\boxed{\{1, \{2\}\}}", r"\{1, \{2\}\}"),
        (r"\boxed 5 is it", "5"),
        (r"\fbox{7} and \framebox{8}", "8"),
        (r"\boxed{7} then \boxed{}", "7"),
        (r"\boxedx{3}", None),
        ("no box", None),
    ],
)
def test_one_definition_of_the_last_box(text: str, expected: str | None) -> None:
    from grpo_envs.format import last_boxed

    assert find_last_boxed(text) == expected
    assert last_boxed(text) == expected
