"""avg@k with its standard errors, maj@k with equivalent answers, macro averages: by hand."""

import math

import pytest

from grpo_train.eval.metrics import (
    TieRule,
    avg_at_k,
    cluster_answers,
    exact_equivalence,
    macro_average,
    maj_at_k,
    majority_correct,
    math_equivalence,
)
from grpo_train.eval.passk import pass_at_k
from grpo_train.eval.records import SampleRecord
from grpo_train.eval.report import summarize_task


def test_avg_at_k_and_both_standard_errors_by_hand():
    # 4 problems x 4 samples: 4/4, 3/4, 1/4, 0/4 correct -> rates 1, .75, .25, 0.
    verdicts = [
        [True, True, True, True],
        [True, True, False, True],
        [False, True, False, False],
        [False, False, False, False],
    ]
    r = avg_at_k(verdicts)
    assert r.k == 4 and r.num_problems == 4
    assert r.value == pytest.approx(0.5)
    # sample variance: ((.5)^2 + (.25)^2 + (.25)^2 + (.5)^2) / 3 = 0.625 / 3
    assert r.se == pytest.approx(math.sqrt(0.625 / 3 / 4))
    # sampling part: sum p(1-p)/(k-1) = (0 + .1875 + .1875 + 0) / 3 = 0.125; sqrt / m
    assert r.se_sampling == pytest.approx(math.sqrt(0.125) / 4)
    # avg@k is the unbiased pass@1 averaged over problems
    assert r.value == pytest.approx(sum(pass_at_k(4, sum(v), 1) for v in verdicts) / 4)


def test_avg_at_k_edge_cases():
    one = avg_at_k([[True, False]])
    assert one.value == 0.5 and one.se is None and one.se_sampling == pytest.approx(0.5)
    single = avg_at_k([[True], [False]])
    assert single.se == pytest.approx(0.5) and single.se_sampling is None
    with pytest.raises(ValueError, match="same number"):
        avg_at_k([[True], [True, False]])
    with pytest.raises(ValueError, match="at least one"):
        avg_at_k([])


def test_clusters_use_the_equivalence_and_skip_missing_answers():
    calls = []

    def eq(a, b):
        calls.append((a, b))
        return float(eval(a)) == float(eval(b))

    clusters = cluster_answers(["1/2", None, "0.5", " 1/2", "", "2"], eq)
    assert clusters == [[0, 2, 3], [5]]
    # the duplicate " 1/2" joined by its text: no comparison made for it
    assert ("1/2", "1/2") not in calls and len(calls) == 2


def test_majority_vote_equivalent_answers_outvote_a_plurality_string():
    # Verifier equivalence: \frac{1}{2}, 0.5 and 1/2 are one answer (3 votes) against "3" twice.
    answers = ["3", "\\frac{1}{2}", "3", "0.5", "1/2"]
    correct = [False, True, False, True, True]
    assert majority_correct(answers, correct, math_equivalence) == 1.0
    # By exact text, "3" would win.
    assert majority_correct(answers, correct, exact_equivalence) == 0.0


def test_tie_rules():
    answers = ["A", "B", "B", "A", "C"]
    correct = [True, False, False, True, False]
    # A and B tie with 2 votes: split -> 1/2 correct
    assert majority_correct(answers, correct, exact_equivalence) == 0.5
    # first-seen: A came first
    assert majority_correct(answers, correct, exact_equivalence, TieRule.FIRST) == 1.0
    assert majority_correct(list(reversed(answers)), correct[::-1], exact_equivalence) == 0.5


def test_maj_at_k_blocks_by_hand():
    # one problem, n=6, k=3: blocks [7,7,9] -> correct, [9,9,7] -> wrong => 0.5
    p1 = [("7", True), ("7", True), ("9", False), ("9", False), ("9", False), ("7", True)]
    # second problem: every answer missing -> 0
    p2 = [(None, False)] * 6
    assert maj_at_k([p1], 3, exact_equivalence) == 0.5
    assert maj_at_k([p1, p2], 3, exact_equivalence) == 0.25
    # k = n: one block; 3 votes each for 7 and 9 -> tie split 0.5
    assert maj_at_k([p1], 6, exact_equivalence) == 0.5
    # maj@1 is avg@n
    assert maj_at_k([p1], 1, exact_equivalence) == pytest.approx(3 / 6)
    with pytest.raises(ValueError, match="at least 7"):
        maj_at_k([p1], 7, exact_equivalence)


def test_macro_average():
    m = macro_average([(0.2, 0.03), (0.6, 0.04), (0.4, None)])
    assert m.value == pytest.approx(0.4) and m.se is None and m.num_suites == 3
    m = macro_average([(0.2, 0.03), (0.6, 0.04)])
    assert m.se == pytest.approx(0.05 / 2)


def _record(sid, g, ok, extracted, outcome=None):
    return SampleRecord(
        task="t",
        env_id="math/aime24-v0",
        sample_id=sid,
        gen_index=g,
        prompt="p",
        completion="c",
        num_tokens=3,
        truncated=False,
        reward=float(ok),
        outcome=outcome or ("correct" if ok else "wrong"),
        success=ok,
        extracted=extracted,
    )


def test_summarize_task_reports_avg_se_maj_and_pass_at_k():
    recs = [
        _record("a", 0, True, "\\frac{1}{2}"),
        _record("a", 1, True, "0.5"),
        _record("a", 2, False, "3"),
        _record("a", 3, False, None, outcome="unparsable"),
        _record("b", 3, False, "5"),  # out of order on purpose: voting uses gen_index order
        _record("b", 0, False, "4"),
        _record("b", 1, False, "4"),
        _record("b", 2, True, "6"),
    ]
    r = summarize_task("t", "math/aime24-v0", recs, n=4, ks=[1, 2, 4], greedy=False)
    assert r.accuracy == pytest.approx(3 / 8) and r.avg_at_n == r.accuracy
    assert r.avg_se == pytest.approx(math.sqrt(((0.5 - 0.375) ** 2 + (0.25 - 0.375) ** 2) / 2))
    # maj@4: a -> {1/2, 0.5} wins (correct); b -> "4" wins (wrong) => 0.5
    assert r.maj_at_k[4] == pytest.approx(0.5)
    # maj@2: a blocks [1/2, .5] -> 1, [3, none] -> 1 vote "3" -> 0; b [4, 4] -> 0, [6, 5] tie
    # -> 1/2 => a 0.5, b 0.25 => 0.375
    assert r.maj_at_k[2] == pytest.approx(0.375)
    assert r.pass_at_k[2] == pytest.approx((pass_at_k(4, 2, 2) + pass_at_k(4, 1, 2)) / 2)
    m = r.metrics()
    assert m["avg@4"] == r.accuracy and m["maj@4"] == 0.5 and "avg@4_se" in m


def test_code_tasks_get_no_majority_vote():
    recs = [_record("a", g, g == 0, "def f(): pass") for g in range(2)]
    recs = [r.__class__(**{**r.__dict__, "env_id": "code/mbpp-plus-v0"}) for r in recs]
    r = summarize_task("t", "code/mbpp-plus-v0", recs, n=2, ks=[1, 2], greedy=False)
    assert r.maj_at_k == {} and r.accuracy == 0.5
