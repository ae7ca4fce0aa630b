"""Loose mode's precedence of statements: labeled pairs per class, through both loose readers.

Each class has completions that give one final answer (which must keep scoring) and near misses
whose other numbers must not score. Both loose readers are held to the same labels: the
verifier (``verify``, strict=False) and the integer environments' ``loose_final_answer``. The
classes (the rule itself is in ``grpo_envs.math.extract``'s docstring):

* correction: a second thought after a stated answer replaces it when it states a new value;
* check: a check, a verification or a smaller case after the answer does not replace it;
* guess: a supposed answer ("Suppose the answer is 5") is no answer unless the text confirms it;
* hedge: several candidate values are no single answer, unless a later sentence picks one;
* truncated: a text cut off while correcting its last stated value has no answer.
"""

from __future__ import annotations

import pytest

from grpo_envs.envs._common import loose_final_answer
from grpo_envs.math import extract_answer, verify

# (class, gold, completion): the completion's final answer is the gold.
RIGHT = [
    (
        "correction",
        "11",
        "The answer is 12. Hmm, but the corner tile was counted twice, so the total is 11.",
    ),
    (
        "correction",
        "11",
        r"So \boxed{12}. Wait, I double counted the corner; subtracting it "
        "gives 12 - 1 = 11.",
    ),
    ("correction", "30", "Total: 28 pencils. Actually, I forgot the 2 in the drawer: 28 + 2 = 30."),
    ("correction", "9", "The answer is 8. Let me recount: red 4, blue 5, so there are 9 marbles."),
    (
        "correction",
        "45",
        "Answer: 40. I made a small error in step two; recalculating, 9 * 5 = 45.",
    ),
    ("correction", "18", "The answer is 18. Hmm, let me make sure: 6 * 3 = 18. Yes."),  # confirms
    ("correction", "18", r"\boxed{18}. But wait, is that right? 6 groups of 3 are 18, so yes."),
    (
        "correction",
        "24",
        "So the answer is 24. But the question asks for the total, which is what we found.",
    ),
    (
        "check",
        "120",
        "There are 5! = 120 arrangements. Sanity check with a smaller case: 3 "
        "people give 3! = 6 arrangements",
    ),
    (
        "check",
        "120",
        "So there are 120 orderings. To double-check, for 3 people the formula "
        "gives 3! = 6, and listing them gives 6 as well.",
    ),
    ("check", "4", "So x = 4. Plugging back: 3(4) - 5 = 7, which matches."),
    ("check", "4", "Thus x = 4. Check: 3 * 4 - 5 = 7. Both sides agree."),
    ("check", "35", "The total is 35 dollars. As a check, 5 shirts cost 5 * 7 = 35."),
    ("check", "7", r"Hence $n = 7$. Let's verify with $n = 2$: the sum is $2^2 = 4$."),
    ("check", "64", "The answer is 64. Verification: 4^3 = 64 and 8^2 = 64. So the answer is 64."),
    (
        "guess",
        "4",
        r"Suppose the answer is \boxed{5}. Then 5 * 3 = 15, not 12, a contradiction. "
        r"So the answer is \boxed{4}.",
    ),
    ("guess", "4", "Let's try 4: 4 * 3 = 12, which works."),
    ("guess", "4", "Suppose the number is 5. Then 5 * 3 = 15 != 12. Therefore the number is 4."),
    ("guess", "60", "Assuming each box holds 12, the total is 5 * 12 = 60."),  # a premise
    ("guess", "7", "If x = 3, then 2x + 1 = 7."),  # an evaluation, not a guess
    (
        "guess",
        "12000",
        "Let's assume a crate holds 4,000 pounds. Then 3 crates hold 12,000 pounds.",
    ),
    ("guess", "12", "I'd say 12 apples."),
    (
        "hedge",
        "12",
        "The possible values are 10, 11, or 12; since it must be even and above 10, "
        "the answer is 12.",
    ),
    ("hedge", "12", "It is either 11 or 12. Only 12 is even, so it is 12."),
    ("hedge", "60", "That means she saved 210 / 350 = 0.60 or 60% off."),  # one value, two forms
    ("hedge", "5", "The answer is 5."),
    (
        "truncated",
        "210",
        r"The number of paths is \binom{10}{4} = 210. So the answer is 210. Now "
        "let me also describe the",
    ),
    ("truncated", "210", "The number of paths is 210."),
    ("truncated", "57", "23 + 34 = 57. The answer is 57. Now let's"),  # a plan, no correction
    ("guess", "4", "Try x = 5: 5 * 3 = 15, too big. Try x = 4: 4 * 3 = 12, which works."),
    ("hedge", "x \\neq 3", "We find that $x \\neq 3$."),  # a relation answer, not a refutation
    ("truncated", "9", "So in total, he scored 4+5=9 points in the 40 minutes"),
]

# (class, wrong value, completion): the completion never gives this value as its answer.
WRONG = [
    (
        "correction",
        "12",
        "The answer is 12. Hmm, but the corner tile was counted twice, so the total is 11.",
    ),
    (
        "correction",
        "12",
        r"So \boxed{12}. Wait, I double counted the corner; subtracting it "
        "gives 12 - 1 = 11.",
    ),
    ("correction", "28", "Total: 28 pencils. Actually, I forgot the 2 in the drawer: 28 + 2 = 30."),
    ("correction", "8", "The answer is 8. Let me recount: red 4, blue 5, so there are 9 marbles."),
    (
        "correction",
        "40",
        "Answer: 40. I made a small error in step two; recalculating, 9 * 5 = 45.",
    ),
    (
        "correction",
        "12",
        "The answer is 12. Hmm, wait, the corner was counted twice, so we subtract one",
    ),
    ("correction", "20", "The answer is 20. That is wrong."),
    ("correction", "12", "The answer is 12. No, it's 11 because the corner repeats."),
    (
        "check",
        "6",
        "There are 5! = 120 arrangements. Sanity check with a smaller case: 3 people "
        "give 3! = 6 arrangements",
    ),
    (
        "check",
        "6",
        "So there are 120 orderings. To double-check, for 3 people the formula gives "
        "3! = 6, and listing them gives 6 as well.",
    ),
    ("check", "7", "So x = 4. Plugging back: 3(4) - 5 = 7, which matches."),
    ("check", "7", "Thus x = 4. Check: 3 * 4 - 5 = 7. Both sides agree."),
    ("check", "4", r"Hence $n = 7$. Let's verify with $n = 2$: the sum is $2^2 = 4$."),
    ("check", "5", "The answer is 35 dollars. As a check, 5 shirts cost 5 * 7 = 35."),
    ("guess", "5", r"Suppose the answer is \boxed{5}. Then 5 x 3 = 15 != 12, a contradiction. So"),
    (
        "guess",
        "5",
        r"Suppose the answer is \boxed{5}. Then 5 * 3 = 15, not 12, a contradiction. "
        r"So the answer is \boxed{4}.",
    ),
    ("guess", "7", r"Let's try \boxed{7}. Then 7 * 2 = 14, not 12."),
    ("guess", "14", r"Let's try \boxed{7}. Then 7 * 2 = 14, not 12."),
    ("guess", "12", "If the answer were 5, then 5 x 3 = 15 != 12."),
    ("guess", "5", "If the answer were 5, then 5 x 3 = 15 != 12."),
    ("guess", "5", "Suppose the answer is 5."),
    ("guess", "15", "Suppose the number is 5. Then 5 * 3 = 15."),
    ("hedge", "12", "Possible values are 10, 11, or 12."),
    ("hedge", "10", "Possible values are 10, 11, or 12."),
    ("hedge", "12", "The total could be 10, 11, or 12 apples."),
    ("hedge", "4", r"The answer is either \boxed{3} or \boxed{4}."),
    ("hedge", "3", r"The answer is either \boxed{3} or \boxed{4}."),
    ("hedge", "12", "The answer is 12. Or maybe 13."),
    ("hedge", "11", "It is about 10 to 12 minutes."),
    ("hedge", "3", "The possible values of x are 2 and 3."),
    (
        "truncated",
        "210",
        r"The number of paths is \binom{10}{4} = 210. But we must exclude the "
        "paths through the blocked corner, which number",
    ),
    (
        "truncated",
        "210",
        "The answer is 210. However, we still need to remove the paths that "
        "cross the river, of which there are",
    ),
    ("truncated", "48", "First, 6 * 8 = 48 seats. But we forgot the balcony, which holds"),
    ("truncated", "12", "The answer is 12. Wait, 3 groups of 5 makes 15, so we"),
    ("hedge", "5", "The result is approximately 4 or 5."),
    ("guess", "5", "Try x = 5: 5 * 3 = 15, too big. Try x = 4: 4 * 3 = 12, which works."),
]


@pytest.mark.parametrize(("cls", "gold", "completion"), RIGHT)
def test_one_clear_final_answer_scores(cls: str, gold: str, completion: str) -> None:
    result = verify(gold, completion, timeout_s=20)
    assert result.correct, (cls, result)
    if gold.isdigit():
        assert loose_final_answer(completion) is not None
        assert (
            loose_final_answer(completion) == gold
            or verify(gold, loose_final_answer(completion) or "", timeout_s=20).correct
        ), (cls, loose_final_answer(completion))


@pytest.mark.parametrize(("cls", "wrong", "completion"), WRONG)
def test_a_value_the_completion_did_not_settle_on_scores_nothing(
    cls: str, wrong: str, completion: str
) -> None:
    result = verify(wrong, completion, timeout_s=20)
    assert not result.correct, (cls, result)
    assert loose_final_answer(completion) != wrong, cls


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        # no single answer: unparsed, not a wrong value
        ("Possible values are 10, 11, or 12.", None),
        (r"Suppose the answer is \boxed{5}. Then 5 x 3 = 15 != 12, a contradiction. So", None),
        (r"The number of paths is \binom{10}{4} = 210. But we must exclude the paths", None),
        ("The answer is 12. Hmm, but the corner was counted twice: the total is 11.", "11"),
        ("There are 5! = 120 ways. Check with 3 people: 3! = 6 ways.", "120"),
    ],
)
def test_the_final_statement_is_what_is_extracted(completion: str, expected: str | None) -> None:
    assert extract_answer(completion) == expected


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        # strict mode keeps every box but a guess the text refutes
        (r"Suppose it is \boxed{5}. Then 5 * 3 = 15 != 12.", None),
        (r"Let's try \boxed{4}: 4 * 3 = 12, which works.", "4"),
        (r"So \boxed{12}. Hmm, but the corner was counted twice: 11.", "12"),
        (r"The answer is \boxed{3} or \boxed{4}.", "3 and 4"),
    ],
)
def test_strict_mode_drops_only_a_refuted_guess(completion: str, expected: str | None) -> None:
    assert extract_answer(completion, strict=True) == expected
