"""Code tasks in languages other than Python: extraction, tasks, outcomes, the shipped C++ set."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import grpo_envs
from grpo_envs.code import languages
from grpo_envs.code.extract import ExtractionMethod, extract_code
from grpo_envs.code.scoring import CodeTask, outcome_of, score_report
from grpo_envs.data import CPP_STDIO
from grpo_envs.envs.stdio import DEFAULT_INSTRUCTION, StdioEnv, StdioProblem, parse_stdio_row
from grpo_envs.types import Outcome, Sample
from sandbox import IOTest, LanguageUnavailableError, Status, TestReport, TestResult, TestStatus

ROWS = [json.loads(line) for line in CPP_STDIO.read_text().splitlines()]


# -- extraction (no sandbox) --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("language", "tag"),
    [
        ("cpp", "cpp"), ("cpp", "c++"), ("cpp", "C++"), ("java", "java"),
        ("nodejs", "javascript"), ("nodejs", "js"), ("rust", "rust"), ("bash", "bash"),
        ("bash", "sh"), ("cpp", ""),
    ],
)  # fmt: skip
def test_extraction_takes_the_last_block_of_the_language(language: str, tag: str) -> None:
    completion = (
        f"<think>```{tag}\ndraft\n```</think>Try:\n```{tag}\nold\n```\nBetter:\n```{tag}\nnew\n```"
    )
    found = extract_code(completion, language=language)
    assert found is not None and found.code == "new\n"
    assert found.method is ExtractionMethod.FENCED


def test_extraction_ignores_other_languages_and_prose() -> None:
    assert extract_code("```python\nprint(1)\n```", language="cpp") is None
    assert extract_code("int main() { return 0; }", language="cpp") is None  # no fence: no guess
    assert extract_code("```cpp\n\n```", language="cpp") is None  # empty block
    mixed = "```cpp\nint main(){}\n```\n```python\nprint(1)\n```"
    assert extract_code(mixed, language="cpp").code == "int main(){}\n"  # type: ignore[union-attr]
    assert extract_code(mixed).code == "print(1)\n"  # type: ignore[union-attr]  # Python as before
    assert extract_code("```cpp\nx\n```", language="cobol") is None


def test_language_names_match_the_sandbox() -> None:
    from sandbox import Language

    assert tuple(lang.value for lang in Language) == languages.LANGUAGES
    with pytest.raises(ValueError, match="valid languages are python, cpp"):
        languages.check_language("c")


# -- tasks, jobs and outcomes -------------------------------------------------------------------


def _report(status: Status, verdicts: list[TestStatus]) -> TestReport:
    results = tuple(TestResult(f"t{i}", v, "main.cpp:1: error") for i, v in enumerate(verdicts))
    return TestReport(results, status, 0.1, ())


def test_compile_error_is_its_own_outcome_with_no_reward() -> None:
    report = _report(Status.COMPILE_ERROR, [TestStatus.COMPILE_ERROR] * 3)
    assert outcome_of(report, 3) is Outcome.COMPILE_ERROR
    score = score_report(report, 3, grpo_envs.code.scoring.RewardMode.FRACTION, "fenced", 4.0)
    assert score.reward == 0.0 and score.outcome is Outcome.COMPILE_ERROR
    assert "compile_error" in str(score.details["first_failure"])
    assert not Outcome.COMPILE_ERROR.is_success


def test_the_job_carries_the_task_language() -> None:
    env = StdioEnv()
    task = CodeTask("k", (IOTest("1\n", "1\n"),), language="cpp")
    assert env._job(task, "int main(){}").language == "cpp"
    assert env._job(CodeTask("p", (IOTest("", ""),)), "pass").language == "python"
    # The compile limit is the environment's (one per job), and Python has no compile step.
    assert env._job(task, "int main(){}").compile_timeout_s == 20.0
    assert StdioEnv(compile_timeout_s=3)._job(task, "").compile_timeout_s == 3
    assert env._job(CodeTask("p", (IOTest("", ""),)), "pass").compile_timeout_s is None


def test_python_stdio_samples_are_unchanged() -> None:
    problem = StdioProblem("p", "Add.", (("1 2\n", "3\n"),), "print(3)")
    sample = StdioEnv().sample(problem)
    assert "language" not in sample.metadata
    assert sample.prompt[0].content == DEFAULT_INSTRUCTION.format(statement="Add.")
    assert DEFAULT_INSTRUCTION.startswith("Solve the following problem in Python 3.")
    assert StdioEnv().reference_completion(sample) == "```python\nprint(3)\n```"


def test_stdio_rows_name_their_language() -> None:
    row = {"id": "x", "prompt": "P", "tests": [{"input": "1", "output": "1"}]}
    assert parse_stdio_row(row).language == "python"
    assert parse_stdio_row({**row, "language": "rust"}).language == "rust"
    with pytest.raises(ValueError, match=r"row 0 \(id 'x'\): unknown language 'c\+\+'"):
        parse_stdio_row({**row, "language": "c++"})


def test_unavailable_toolchain_is_a_clear_error_when_the_task_is_built(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import sandbox.languages

    env = StdioEnv(data_files=CPP_STDIO)
    sample = Sample.from_row(env.dataset("test")[0])
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(sandbox.languages, "EXTRA_SEARCH_DIRS", ())
    with pytest.raises(LanguageUnavailableError, match=r"`g\+\+` not found"):
        env.task(sample)
    score = env.score("```cpp\nint main(){}\n```", sample)
    assert score.outcome is Outcome.ERROR
    assert "g++" in str(score.details["reason"])


# -- the shipped C++ problem set, in the sandbox ------------------------------------------------


def test_cpp_problem_set_is_well_formed() -> None:
    assert len(ROWS) >= 20
    assert len({r["id"] for r in ROWS}) == len(ROWS)
    for row in ROWS:
        assert row["language"] == "cpp" and "int main" in row["solution"]
        assert 3 <= len(row["tests"]) <= 5, row["id"]
    others = {lang for r in ROWS for lang in r.get("other_solutions", {})}
    assert others == {"java", "rust"}


def test_stdio_env_scores_cpp_references_wrong_programs_and_compile_errors() -> None:
    env = StdioEnv(data_files=CPP_STDIO, workers=2)
    samples = {s.id: s for s in (Sample.from_row(r) for r in env.dataset("test"))}
    first = samples["cpp-sum-two"]
    assert first.metadata["language"] == "cpp"
    assert "C++17" in first.prompt[0].content and "```cpp" in first.prompt[0].content
    picked = [samples[k] for k in ("cpp-sum-two", "cpp-gcd-lcm", "cpp-brackets", "cpp-binary")]
    completions = [env.reference_completion(s) or "" for s in picked]
    wrong = '```cpp\n#include <cstdio>\nint main(){ puts("3"); }\n```'
    broken = "```cpp\nint main() { return undefined_name; }\n```"
    python = "```python\nprint(3)\n```"
    scores = env.score_batch([*completions, wrong, broken, python], [*picked, first, first, first])
    outcomes = [s.outcome for s in scores]
    assert outcomes == [Outcome.PASSED] * 4 + [
        Outcome.FAILED, Outcome.COMPILE_ERROR, Outcome.UNPARSABLE,
    ]  # fmt: skip
    assert [s.reward for s in scores] == [1.0] * 4 + [0.0] * 3
    assert "undefined_name" in str(scores[5].details["first_failure"])


def test_other_language_references_pass() -> None:
    env = StdioEnv(workers=2)
    pairs = []
    for row in ROWS:
        for language, code in row.get("other_solutions", {}).items():
            problem = parse_stdio_row({**row, "language": language, "solution": code})
            pairs.append(env.sample(problem))
    assert {s.metadata["language"] for s in pairs} == {"java", "rust"}
    assert "public class Main" in next(
        s.prompt[0].content for s in pairs if s.metadata["language"] == "java"
    )
    completions = [env.reference_completion(s) or "" for s in pairs]
    assert [s.outcome for s in env.score_batch(completions, pairs)] == [Outcome.PASSED] * len(pairs)


def test_dataset_env_reads_the_language_column() -> None:
    env = grpo_envs.make(
        "code/dataset-v0", path=str(CPP_STDIO), question="prompt", splits="test",
        language_column="language", workers=2,
    )  # fmt: skip
    samples = [Sample.from_row(r) for r in env.dataset("test")]
    assert all(s.metadata["language"] == "cpp" for s in samples)
    assert "C++17 solution in a single ```cpp code block" in samples[0].prompt[0].content
    grpo_envs.check_env(env, n_samples=2)  # runs two C++ references: they must pass
    assert env.score("```cpp\nint main(){ return 1; }\n```", samples[0]).outcome is (
        Outcome.RUNTIME_ERROR
    )


def test_dataset_env_refuses_asserts_for_other_languages(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_text(json.dumps({"question": "add", "tests": ["assert add(1, 2) == 3"]}) + "\n")
    env = grpo_envs.make("code/dataset-v0", path=str(path), splits="test", language="cpp")
    with pytest.raises(ValueError, match="cpp tasks need stdin/stdout tests"):
        env.dataset("test")
    with pytest.raises(ValueError, match="unknown language 'go'"):
        grpo_envs.make("code/dataset-v0", path=str(path), splits="test", language="go")


def test_a_compiled_job_gets_the_configured_compile_limit_cut_to_the_batch_budget() -> None:
    from grpo_envs.code.scoring import _cap_job
    from sandbox import IOTest, Limits, TestJob

    job = TestJob(
        "int main(){}", (IOTest("", ""),), limits=Limits(timeout_s=4), per_test_timeout_s=2,
        language="cpp", compile_timeout_s=20.0,
    )  # fmt: skip
    capped = _cap_job(job, 5.0)  # the run's limits fit; the 20 s compile does not
    assert capped.compile_timeout_s == 5.0
    assert capped.limits == job.limits and capped.per_test_timeout_s == 2
    tight = _cap_job(job, 1.5)
    assert tight.compile_timeout_s == 1.5 and tight.per_test_timeout_s == 1.5
    assert tight.limits is not None and tight.limits.timeout_s == 1.5
    assert _cap_job(job, 30.0) is job
    python = TestJob("print()", (IOTest("", "\n"),), limits=Limits(timeout_s=4))
    assert _cap_job(python, 2.0).compile_timeout_s is None
