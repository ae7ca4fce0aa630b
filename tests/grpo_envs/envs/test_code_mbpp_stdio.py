"""code/mbpp-v0 and code/stdio-v0 on fixtures in the shapes of the public datasets."""

from __future__ import annotations

import base64
import json
import pickle
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from grpo_envs.envs.mbpp import MBPPEnv, entry_point_of
from grpo_envs.envs.stdio import StdioEnv, parse_stdio_row
from grpo_envs.types import Outcome, Sample
from sandbox import Sandbox

FIXTURES = Path(__file__).parents[1] / "fixtures" / "code"
MBPP_FULL = FIXTURES / "mbpp_full.jsonl"
MBPP_SANITIZED = FIXTURES / "mbpp_sanitized.jsonl"
STDIO = FIXTURES / "stdio.jsonl"


def fenced(code: str) -> str:
    return f"```python\n{code}\n```"


# -- loading (no sandbox needed) ----------------------------------------------------------------


def test_mbpp_rows_from_both_configs():
    full = [Sample.from_row(r) for r in MBPPEnv(data_files=MBPP_FULL).dataset("test")]
    assert [s.id for s in full] == ["mbpp/11", "mbpp/12", "mbpp/17", "mbpp/900"]
    assert full[0].metadata["entry_point"] == "remove_Occ"
    assert 'assert remove_Occ("hello","l") == "heo"' in full[0].prompt[0].content
    assert "abcda" not in full[0].prompt[0].content  # prompt_tests=1: only the first test shown
    assert full[3].metadata["setup"] == "from math import isclose"
    assert full[3].metadata["entry_point"] == "point_distance"  # not the builtin-like isclose
    with_challenge = MBPPEnv(data_files=MBPP_FULL, challenge_tests=True).dataset("test")
    assert len(json.loads(with_challenge[0]["metadata"])["tests"]) == 5
    sanitized = [
        Sample.from_row(r)
        for r in MBPPEnv(name="sanitized", data_files=MBPP_SANITIZED).dataset("test")
    ]
    assert sanitized[1].metadata["setup"] == "import math"
    assert sanitized[1].metadata["entry_point"] == "circle_area"


def test_mbpp_reads_the_hub_dataset_by_its_id(monkeypatch):
    import grpo_envs.code.data as data

    calls = []
    rows = [json.loads(line) for line in MBPP_SANITIZED.read_text().splitlines()]

    def fake_load(repo, name=None, split=None):
        calls.append((repo, name, split))
        if split == "validation":
            raise ConnectionError("offline")
        return rows

    monkeypatch.setattr(data.datasets, "load_dataset", fake_load)
    env = MBPPEnv(name="sanitized")
    assert len(env.dataset("test")) == 2
    assert calls == [("google-research-datasets/mbpp", "sanitized", "test")]
    with pytest.raises(RuntimeError, match="data_files=PATH"):
        env.dataset("validation")


def test_mbpp_errors_say_what_to_do(tmp_path):
    with pytest.raises(ValueError, match="full"):
        MBPPEnv(name="tiny")
    with pytest.raises(FileNotFoundError, match="not found"):
        MBPPEnv(data_files=tmp_path / "missing.jsonl")
    with pytest.raises(ValueError, match="data_files="):
        MBPPEnv(data_files=MBPP_FULL).dataset("train")
    with pytest.raises(ValueError, match="which function"):
        entry_point_of(["assert len([1]) == 1"])


def test_stdio_rows_in_every_supported_shape():
    problems = [
        parse_stdio_row(json.loads(line), i)
        for i, line in enumerate(STDIO.read_text().splitlines())
    ]
    by_id = {p.id: p for p in problems}
    assert set(by_id) == {"sum-two", "lcb-1", "cc-reverse", "4242"}
    assert len(by_id["sum-two"].tests) == 3 and by_id["sum-two"].reference
    assert len(by_id["lcb-1"].tests) == 3  # 1 public (JSON) + 2 private (LiveCodeBench encoding)
    assert by_id["lcb-1"].reference is None
    assert len(by_id["cc-reverse"].tests) == 4  # public + private + generated
    assert by_id["cc-reverse"].reference == "print(input()[::-1])\n"  # the Python 3 one
    assert by_id["4242"].tests == (("3\n", "9\n"), ("10\n", "100\n"))


def test_stdio_refuses_pickles_that_carry_code():
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    payload = base64.b64encode(zlib.compress(pickle.dumps(Evil()))).decode()
    row = {"question_content": "x", "private_test_cases": payload}
    with pytest.raises(ValueError, match="refusing to load"):
        parse_stdio_row(row)


def test_stdio_row_errors():
    with pytest.raises(ValueError, match="no problem statement"):
        parse_stdio_row({"tests": [{"input": "", "output": ""}]})
    with pytest.raises(ValueError, match="no stdin/stdout tests"):
        parse_stdio_row({"prompt": "p"})
    with pytest.raises(ValueError, match="call-based"):
        parse_stdio_row(
            {
                "question": "q",
                "input_output": json.dumps({"inputs": [], "outputs": [], "fn_name": "f"}),
            }
        )
    with pytest.raises(ValueError, match="data_files=PATH"):
        StdioEnv().dataset("test")


# -- scoring on the real sandbox -----------------------------------------------------------------


@pytest.fixture(scope="module")
def own_sandbox() -> Iterator[object]:
    with Sandbox(workers=2) as box:
        yield box


def test_mbpp_scoring(own_sandbox):
    env = MBPPEnv(data_files=MBPP_FULL, sandbox=own_sandbox)  # a sandbox of the caller's
    rows = [Sample.from_row(r) for r in env.dataset("test")]
    by_id = {s.id: s for s in rows}
    completions = [
        (by_id["mbpp/11"], fenced(by_id["mbpp/11"].answer)),
        (by_id["mbpp/12"], fenced("def sort_matrix(M):\n    return sorted(M, key=sum)")),
        (by_id["mbpp/12"], fenced("def sort_matrix(M):\n    return M")),  # wrong
        (by_id["mbpp/17"], "def square_perimeter(a):\n    return 4 * a\n"),  # bare code
        (by_id["mbpp/900"], fenced(by_id["mbpp/900"].answer)),  # tests use the setup's isclose
        (by_id["mbpp/17"], fenced("def perimeter(a):\n    return 4 * a")),  # wrong name
        (by_id["mbpp/17"], "Just multiply by four."),
    ]
    scores = env.score_batch([c for _, c in completions], [s for s, _ in completions])
    assert [s.reward for s in scores] == [1.0, 1.0, 0.0, 1.0, 1.0, 0.0, 0.0]
    assert scores[2].outcome is Outcome.FAILED
    assert scores[5].outcome is not Outcome.PASSED  # its outcome: see the next test
    assert scores[6].outcome is Outcome.UNPARSABLE
    # Partial credit: right on 2 of the 3 perimeter tests.
    frac = MBPPEnv(data_files=MBPP_FULL, sandbox=own_sandbox, reward="fraction")
    half = fenced("def square_perimeter(a):\n    return 40 if a == 10 else 20")
    assert frac.score(half, by_id["mbpp/17"]).reward == pytest.approx(2 / 3)


def test_a_program_without_the_entry_point_is_a_runtime_error():
    env = MBPPEnv(data_files=MBPP_FULL, workers=2, calibrate=False)
    sample = next(s for s in map(Sample.from_row, env.dataset("test")) if s.id == "mbpp/17")
    right = fenced("def square_perimeter(a):\n    return 4 * a")
    misnamed = fenced("def perimeter(a):\n    return 4 * a")
    # Scored after a passing program (the order in which the sandbox once misreported it).
    scores = [env.score(right, sample), env.score(misnamed, sample), env.score(misnamed, sample)]
    assert scores[0].outcome is Outcome.PASSED
    assert [s.outcome for s in scores[1:]] == [Outcome.RUNTIME_ERROR] * 2, [
        s.details.get("first_failure") for s in scores[1:]
    ]


def test_mbpp_sanitized_scoring():
    env = MBPPEnv(name="sanitized", data_files=MBPP_SANITIZED, workers=2)
    rows = [Sample.from_row(r) for r in env.dataset("test")]
    scores = env.score_batch([fenced(s.answer) for s in rows], rows)
    assert [s.outcome for s in scores] == [Outcome.PASSED, Outcome.PASSED]


def test_stdio_scoring_exact_lines_and_trailing_whitespace():
    env = StdioEnv(data_files=STDIO, workers=2)
    rows = {s.id: s for s in (Sample.from_row(r) for r in env.dataset("test"))}
    lines_ok = "n = int(input())\nfor i in range(1, n + 1):\n    print(i)"
    cases = [
        (rows["sum-two"], fenced(rows["sum-two"].answer), 1.0),
        # Trailing spaces and a missing/extra final newline are normalized away.
        (
            rows["sum-two"],
            fenced("a, b = map(int, input().split())\nprint(str(a + b) + '   ')\nprint()"),
            1.0,
        ),
        (rows["lcb-1"], fenced(lines_ok), 1.0),
        # A prefix of the expected output fails: it stops one line short.
        (rows["lcb-1"], fenced("n = int(input())\nfor i in range(1, n):\n    print(i)"), 0.0),
        # Extra output fails too, and so does leading whitespace.
        (rows["lcb-1"], fenced(lines_ok + "\nprint('done')"), 0.0),
        (rows["4242"], fenced("print(' ' + str(int(input()) ** 2))"), 0.0),
        (rows["4242"], fenced(rows["4242"].answer), 1.0),
        (rows["cc-reverse"], fenced(rows["cc-reverse"].answer), 1.0),
        (rows["cc-reverse"], fenced("import sys\nsys.exit(0)"), 0.0),
    ]
    scores = env.score_batch([c for _, c, _ in cases], [s for s, _, _ in cases])
    assert [s.reward for s in scores] == [r for _, _, r in cases]
    assert scores[3].outcome is Outcome.FAILED


def test_stdio_partial_credit_and_timeout():
    env = StdioEnv(data_files=STDIO, workers=2, reward="fraction", default_test_timeout_s=0.5)
    rows = {s.id: s for s in (Sample.from_row(r) for r in env.dataset("test"))}
    # Reverses only the public example correctly: 1 of 4 tests.
    one = fenced("s = input()\nprint('cba' if s == 'abc' else s)")
    loop = fenced("while True:\n    pass")
    scores = env.score_batch([one, loop], [rows["cc-reverse"], rows["lcb-1"]])
    # cc-reverse: 'abc' right, 'hello' wrong, 'x' and 'ab ba' (palindromes) right.
    assert scores[0].reward == pytest.approx(3 / 4)
    assert scores[1].reward == 0.0 and scores[1].outcome is Outcome.TIMEOUT


@pytest.mark.parametrize(
    ("env_id", "data_files"), [("code/mbpp-v0", MBPP_FULL), ("code/stdio-v0", STDIO)]
)
def test_contract_checker(env_id, data_files):
    import grpo_envs
    from grpo_envs.checker import check_env

    check_env(grpo_envs.make(env_id, data_files=str(data_files), workers=2), n_samples=2)
