"""Every benchmark suite end to end through `grpo eval --protocol r1` on the tiny random model.

The data are the fixtures in the hub schemas (tests/grpo_envs/fixtures/benchmarks, one problem per
suite via --limit 1); the code suites run their tests in the sandbox.
"""

import json
from pathlib import Path

import pytest

from grpo_envs.types import Outcome
from grpo_train.eval_cli import main

FIXTURES = Path(__file__).resolve().parents[2] / "grpo_envs" / "fixtures"
BENCH = FIXTURES / "benchmarks"
#: r1's samples per problem for each suite (Open-R1's counts; AMC and EvalPlus our choice).
R1_N = {
    "aime24": 64,
    "aime25": 64,
    "amc23": 32,
    "math500": 4,
    "gpqa_diamond": 8,
    "livecodebench": 16,
    "humaneval_plus": 16,
    "mbpp_plus": 16,
}
MATH_LIKE = {"aime24", "aime25", "amc23", "math500", "gpqa_diamond"}


@pytest.mark.slow
def test_every_suite_runs_under_the_r1_protocol_and_is_recorded(tiny_model_path, tmp_path, capsys):
    out = tmp_path / "run"
    dirs = {s: BENCH / s for s in R1_N if s != "math500"} | {"math500": FIXTURES / "math500"}
    argv = [
        "--model", str(tiny_model_path), "--engine", "hf", "--protocol", "r1",
        "--suite", ",".join(R1_N), "--limit", "1", "--max_tokens", "4", "--no_progress",
        "--data_dir", ",".join(f"{s}={p}" for s, p in dirs.items()),
        "--env_kwargs", json.dumps({"code/livecodebench-v0": {"version_tag": "release_v2"}}),
        "--out", str(out),
    ]  # fmt: skip
    assert main(argv) == 0
    first = capsys.readouterr().out
    assert "protocol: r1 (overridden: max_tokens)" in first

    record = json.loads((out / "protocol.json").read_text())
    proto = record["protocol"]
    assert (proto["name"], proto["temperature"], proto["top_p"]) == ("r1", 0.6, 0.95)
    assert proto["max_tokens"] == 4 and proto["overridden"] == ["max_tokens"]
    assert proto["thinking"] == {"open": "<think>", "close": "</think>"}
    tasks = {t["label"]: t for t in record["tasks"]}
    assert {label: t["n"] for label, t in tasks.items()} == R1_N
    for t in tasks.values():
        assert t["dataset"]["rows"] == 1 and len(t["dataset"]["sha256"]) == 64
        assert t["grader"]["source_sha256"] and t["grader"]["grading_rules"] >= 1
        assert "wrappers" not in t["grader"]["env_class"]  # the env itself, not make()'s guard
    assert "file " in tasks["aime24"]["dataset"]["source"]
    assert "version_tag=release_v2" in tasks["livecodebench"]["dataset"]["source"]
    assert record["prompt_sha256"] and record["max_model_len"] >= 4

    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    counts = {label: sum(r["task"] == label for r in records) for label in R1_N}
    assert counts == R1_N
    valid = {o.value for o in Outcome} - {"error", "sandbox_error"}
    assert {r["outcome"] for r in records} <= valid  # every completion scored, none failed

    summary = json.loads((out / "summary.json").read_text())
    results = {r["label"]: r for r in summary["results"]}
    for label, n in R1_N.items():
        r = results[label]
        assert r["n"] == n and r["num_completions"] == n and f"avg@{n}" in r
        assert r["avg_se"] is None  # one problem: no spread across problems
        assert r["avg_se_sampling"] is not None
        assert sorted(r["pass_at_k"], key=int)[-1] == str(n)
        assert bool(r["maj_at_k"]) == (label in MATH_LIKE)  # no vote over program text
    assert summary["protocol"]["name"] == "r1" and summary["overall"]["num_tasks"] == 8
    model_line, protocol_line = (out / "summary.md").read_text().splitlines()[:2]
    assert model_line.startswith("model: ") and protocol_line.startswith("protocol: r1")

    # The same command resumes: nothing is generated again, the record is accepted.
    assert main(argv) == 0
    assert "(0 generated, 220 resumed" in capsys.readouterr().out
