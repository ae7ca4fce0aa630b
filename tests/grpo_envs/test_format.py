import pytest
from scan_work import assert_linear  # tests/grpo_envs is on sys.path (its conftest)

from grpo_envs import format as fmt


@pytest.mark.parametrize(
    ("text", "strict", "soft"),
    [
        ("<think>2+2=4</think><answer>4</answer>", 1.0, 1.0),
        ("  <think>\nstep\n</think>\n<answer> 4 </answer>\n", 1.0, 1.0),
        ("Sure! <think>x</think> so <answer>4</answer> done", 0.0, 1.0),  # extra text: soft only
        ("<think>x</think><answer>4</answer><answer>5</answer>", 0.0, 0.0),  # duplicated tag
        ("<think>x</think><think>y</think><answer>4</answer>", 0.0, 0.0),
        ("<answer>4</answer><think>x</think>", 0.0, 0.0),  # wrong order
        ("<think>x</answer><answer>4</think>", 0.0, 0.0),  # mismatched
        ("<think>x</think><answer>  </answer>", 0.0, 0.0),  # empty answer
        ("<think>x</think>", 0.0, 0.0),
        ("", 0.0, 0.0),
    ],
)
def test_think_answer(text, strict, soft):
    assert fmt.think_answer_strict(text) == strict
    assert fmt.think_answer_soft(text) == soft


@pytest.mark.parametrize(
    ("text", "boxed"),
    [
        ("so \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("\\boxed{1} then \\boxed{2}", "2"),
        ("\\boxed {7}", "7"),
        ("\\fbox{x}", "x"),
        ("\\boxed{3} and an unclosed \\boxed{4", "3"),
        ("\\boxed{}", None),
        ("\\boxedx{3}", None),
        ("no box", None),
    ],
)
def test_last_boxed(text, boxed):
    assert fmt.last_boxed(text) == boxed
    assert fmt.boxed_present(text) == (0.0 if boxed is None else 1.0)


def test_answer_tag():
    assert fmt.answer_tag("<answer>1</answer> x <answer> 2 </answer>") == "2"
    assert fmt.answer_tag("<answer></answer>") is None
    assert fmt.answer_tag("</answer><answer>") is None


@pytest.mark.parametrize(
    "make",
    [
        lambda n: "\\boxed{" * n + "<answer>" * n,  # retrying every unclosed box is quadratic
        lambda n: "<answer>" * n + "</answer>",  # so is a lazy <answer>(.*?)</answer> regex
        lambda n: "<think>" * n + "</think>" * n,
    ],
)
def test_extractors_do_linear_work_on_hostile_input(make):
    def run(junk: str) -> None:
        assert fmt.last_boxed(junk) is None
        assert fmt.think_answer_soft(junk) == 0.0
        fmt.answer_tag(junk)

    assert_linear(run, make, 2_000)


def test_extractors_on_hostile_input():
    junk = "\\boxed{" * 100_000 + "<answer>" * 100_000
    assert fmt.last_boxed(junk) is None
    assert fmt.answer_tag(junk) is None
    assert fmt.think_answer_soft(junk) == 0.0
    assert fmt.last_boxed(junk + "\\boxed{7}") == "7"


def test_overlong_penalty_dapo():
    # max 100, buffer 20: free up to 80, then linear to -1 at 100, -1 beyond.
    assert fmt.overlong_penalty(80, 100, 20) == 0.0
    assert fmt.overlong_penalty(90, 100, 20) == pytest.approx(-0.5)
    assert fmt.overlong_penalty(100, 100, 20) == pytest.approx(-1.0)
    assert fmt.overlong_penalty(150, 100, 20) == -1.0
    with pytest.raises(ValueError):
        fmt.overlong_penalty(1, 100, 0)


def test_components_and_styles():
    comp = fmt.overlong_component(10, 5, weight=0.5, length_fn=lambda s: len(s.split()))
    assert comp.name == "overlong" and comp.weight == 0.5
    with pytest.raises(ValueError):
        fmt.overlong_component(10, 50)
    assert [c.name for c in fmt.format_components("think_answer", 0.2)] == [
        "format_strict",
        "format_soft",
    ]
    assert [c.weight for c in fmt.format_components("think_answer", 0.2)] == [0.2, 0.0]
    assert fmt.format_components("none", 1.0) == []
    with pytest.raises(ValueError, match="unknown format"):
        fmt.format_components("xml", 1.0)
