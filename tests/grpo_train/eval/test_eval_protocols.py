"""Protocols: presets, overrides, reasoning removal in the eval path, per-suite n, run records."""

import json
import re
from pathlib import Path

import datasets
import pytest

from grpo_envs.base import Environment
from grpo_envs.types import Outcome, Sample, Score
from grpo_train.eval.protocol_cli import write_run_record
from grpo_train.eval.protocols import (
    PROTOCOLS,
    Severity,
    ThinkingTags,
    compare_records,
    get_protocol,
    strip_reasoning,
)
from grpo_train.eval.runner import EvalTask, evaluate
from grpo_train.eval_cli import main, parse_eval_args
from grpo_train.rollout.base import Completion, SamplingConfig


class CharTokenizer:
    """One token per character; ``suffix`` ends every prompt (as a reasoning template's does)."""

    chat_template = "{role}: {content}"

    def __init__(self, suffix=""):
        self.suffix = suffix

    def apply_chat_template(self, conversation, tokenize=False, add_generation_prompt=True):
        return "".join(f"{m['content']}\n" for m in conversation) + "A: " + self.suffix

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [ord(ch) for ch in text]}


class NineEnv(Environment):
    """Every question's answer is 9; the last integer of the completion is the answer."""

    splits = ("test",)

    def __init__(self, env_id="toy/nine-v0", size=2):
        self.env_id, self.size = env_id, size

    def dataset(self, split="test"):
        return datasets.Dataset.from_list(
            [
                Sample(id=f"q{i}", prompt=(), answer="9", env_id=self.env_id).to_row()
                | {"prompt": [{"role": "user", "content": f"question {i}"}]}
                for i in range(self.size)
            ]
        )

    def score(self, completion, sample):
        found = re.findall(r"\d+", completion)
        if not found:
            return Score.failure(Outcome.UNPARSABLE, "no number")
        ok = found[-1] == "9"
        return Score(
            float(ok), Outcome.CORRECT if ok else Outcome.WRONG, details={"extracted": found[-1]}
        )

    def score_batch(self, completions, samples):
        return [self.score(c, s) for c, s in zip(completions, samples)]


class ListEngine:
    """Completion j of every prompt is ``texts[j % len(texts)]``."""

    name = "list"

    def __init__(self, texts):
        self.texts = texts
        self.calls = []

    def generate(self, prompt_token_ids, sampling):
        self.calls.append((len(prompt_token_ids), sampling.n))
        return [
            [
                Completion(p, self.texts[j % len(self.texts)], (1, 2), (0.0, 0.0), "stop")
                for j in range(sampling.n)
            ]
            for p in range(len(prompt_token_ids))
        ]

    def close(self):
        pass


@pytest.mark.parametrize(
    ("text", "tags", "opened", "graded"),
    [
        ("<think>3?</think>It is 9", ThinkingTags(), False, "It is 9"),
        ("<think>it is 9", ThinkingTags(), False, None),
        ("<think>a</think>b<think>c", ThinkingTags(), False, None),
        ("no tags: 9", ThinkingTags(), False, "no tags: 9"),
        ("9, no close", ThinkingTags(), True, None),
        ("9</think>7", ThinkingTags(), True, "7"),
        ("<reason>9</reason>7", ThinkingTags("<reason>", "</reason>"), False, "7"),
    ],
)
def test_strip_reasoning(text, tags, opened, graded):
    assert strip_reasoning(text, tags, opened_in_prompt=opened) == graded


def test_bad_thinking_tags():
    assert ThinkingTags.parse("none") is None
    assert ThinkingTags.parse("<r>,</r>") == ThinkingTags("<r>", "</r>")
    with pytest.raises(ValueError, match="OPEN,CLOSE"):
        ThinkingTags.parse("<think>")
    with pytest.raises(ValueError, match="distinct"):
        ThinkingTags("x", "x")


def test_the_eval_path_grades_after_the_reasoning_and_an_unclosed_block_is_no_answer():
    texts = ["<think>maybe 4</think>so 9", "<think>9 9 9", "it is 9", "<think>9</think>4"]
    sampling = SamplingConfig(n=4, temperature=1.0, max_new_tokens=8)
    with_tags = EvalTask("nine", NineEnv(), thinking=ThinkingTags())
    summary = evaluate(ListEngine(texts), CharTokenizer(), [with_tags], sampling=sampling,
                       ks=[1], progress=False)  # fmt: skip
    r = summary["nine"]
    assert r.accuracy == pytest.approx(2 / 4)  # the unclosed one and the "4" after thinking fail
    assert r.outcome_counts == {"correct": 4, "unparsable": 2, "wrong": 2}
    plain = evaluate(ListEngine(texts), CharTokenizer(), [EvalTask("nine", NineEnv())],
                     sampling=sampling, ks=[1], progress=False)  # fmt: skip
    assert plain["nine"].accuracy == pytest.approx(3 / 4)  # graded whole: the unclosed one counts
    # A template that opens the block in the prompt: a completion without </think> never answered.
    opened = evaluate(ListEngine(["9", "x</think>9"]), CharTokenizer(suffix="<think>\n"),
                      [with_tags], sampling=SamplingConfig(n=2, temperature=1.0), ks=[1],
                      progress=False)  # fmt: skip
    assert opened["nine"].accuracy == pytest.approx(1 / 2)


def test_per_task_sample_counts_are_generated_recorded_and_checked_on_resume(tmp_path):
    engine = ListEngine(["9", "8", "9"])
    tasks = [EvalTask("a", NineEnv("toy/a-v0"), n=3), EvalTask("b", NineEnv("toy/b-v0"), n=1)]
    sampling = SamplingConfig(n=2, temperature=0.6, max_new_tokens=8)
    summary = evaluate(engine, CharTokenizer(), tasks, sampling=sampling, out_dir=tmp_path,
                       progress=False)  # fmt: skip
    assert summary["a"].n == 3 and summary["a"].num_completions == 6
    assert summary["b"].n == 1 and summary["b"].num_completions == 2
    assert sorted(summary["a"].pass_at_k) == [1, 2, 3] and sorted(summary["b"].pass_at_k) == [1]
    assert summary["a"].maj_at_k[3] == 1.0  # "9" twice against "8" once
    assert sorted(engine.calls) == [(2, 1), (2, 3)]
    config = json.loads((tmp_path / "run_config.json").read_text())
    assert config["n_per_task"] == {"a": 3, "b": 1}
    written = json.loads((tmp_path / "summary.json").read_text())
    assert written["overall"]["macro_avg"] == pytest.approx((2 / 3 + 1) / 2)
    tasks[0] = EvalTask("a", NineEnv("toy/a-v0"), n=4)
    with pytest.raises(ValueError, match="n_per_task"):
        evaluate(engine, CharTokenizer(), tasks, sampling=sampling, out_dir=tmp_path,
                 progress=False)  # fmt: skip


def test_presets_and_overrides():
    r1 = get_protocol("r1")
    assert (r1.temperature, r1.top_p, r1.max_tokens) == (0.6, 0.95, 32768)
    assert [r1.n_for(s) for s in ("aime24", "math500", "gpqa_diamond", "livecodebench")] == [
        64, 4, 8, 16,
    ]  # fmt: skip
    assert r1.thinking == ThinkingTags() and PROTOCOLS["greedy"].n == 1
    small = r1.with_overrides(max_tokens=1024, n=2)
    assert small.overridden == ("max_tokens", "n") and small.n_for("aime24") == 2
    assert small.label == "r1 (overridden: max_tokens, n)"
    assert r1.with_overrides(top_p=0.95).overridden == ()  # the same value is no override
    with pytest.raises(ValueError, match="temperature 0"):
        r1.with_overrides(temperature=0.0)
    with pytest.raises(ValueError, match="known: greedy, r1"):
        get_protocol("r2")


FIXTURES = Path(__file__).resolve().parents[2] / "grpo_envs" / "fixtures"


def _record_of(argv):
    """The protocol.json contents `grpo eval` writes for ``argv`` (no model needed)."""
    from grpo_train.eval.protocol_cli import build_run_record
    from grpo_train.eval_cli import _eval_tasks

    args = parse_eval_args(argv)
    tasks, envs = _eval_tasks(args)
    return build_run_record(
        protocol=args.decoding.protocol, decoding={"n": args.n}, template={},
        max_prompt_tokens=None, max_model_len=args.max_model_len, split=args.split, limit=1,
        tasks=tasks, eval_tasks=envs,
    )  # fmt: skip


_DATA = {"aime24": FIXTURES / "benchmarks" / "aime24", "math500": FIXTURES / "math500"}
_TWO_SUITES = ("aime24", "math500")


def _r1(suites, *flags):
    """``grpo eval --protocol r1`` on ``suites`` (fixture data) with ``flags``."""
    data = ",".join(f"{s}={_DATA[s]}" for s in suites)
    return ["--protocol", "r1", "--suite", ",".join(suites), "--data_dir", data, *flags]


@pytest.mark.parametrize(
    ("flags", "field"),
    [
        (["--temperature", "0.7"], "temperature"),
        (["--top_p", "0.9"], "top_p"),
        (["--max_tokens", "4096"], "max_tokens"),
        (["--seed", "3"], "seed"),
        (["--think_tags", "none"], "thinking"),
        (["--think_tags", "<reason>,</reason>"], "thinking"),
    ],
)
def test_every_overridden_field_is_recorded_for_every_suite(flags, field):
    record = _record_of(_r1(_TWO_SUITES, *flags))
    assert record["protocol"]["overridden"] == [field]
    assert record["protocol"]["label"] == f"r1 (overridden: {field})"
    assert {t["label"]: t["overridden"] for t in record["tasks"]} == {
        "aime24": [field], "math500": [field],
    }  # fmt: skip


def test_n_is_an_override_per_suite_against_that_suites_own_count():
    # r1 samples AIME 64 times and MATH-500 4 times: --n 4 overrides AIME's count only.
    record = _record_of(_r1(_TWO_SUITES, "--n", "4"))
    tasks = {t["label"]: t for t in record["tasks"]}
    assert (tasks["aime24"]["n"], tasks["aime24"]["overridden"]) == (4, ["n"])
    assert (tasks["math500"]["n"], tasks["math500"]["overridden"]) == (4, [])
    assert record["protocol"]["overridden"] == ["n"]
    assert record["protocol"]["label"] == "r1 (overridden: n for aime24)"
    # the same --n alone on MATH-500 is r1 itself; on AIME it is not
    assert _record_of(_r1(["math500"], "--n", "4"))["protocol"]["overridden"] == []
    aime = _record_of(_r1(["aime24"], "--n", "4", "--top_p", "1"))
    assert aime["protocol"]["overridden"] == ["n", "top_p"]
    assert aime["protocol"]["label"] == "r1 (overridden: n, top_p)"
    # the preset's own values are no override
    same = ["--temperature", "0.6", "--top_p", "0.95", "--max_tokens", "32768", "--seed", "0"]
    plain = _record_of(_r1(_TWO_SUITES, *same, "--think_tags", "<think>,</think>"))
    assert plain["protocol"]["overridden"] == [] and plain["protocol"]["label"] == "r1"


def test_cli_protocol_flags():
    args = parse_eval_args(["--protocol", "r1", "--suite", "aime24"])
    assert args.decoding.protocol.name == "r1" and args.decoding.protocol.overridden == ()
    assert (args.temperature, args.top_p, args.max_tokens) == (0.6, 0.95, 32768)
    assert args.max_model_len >= 32768 + 1024
    args = parse_eval_args(["--protocol", "r1", "--top_p", "1", "--think_tags", "none"])
    assert args.decoding.protocol.overridden == ("thinking", "top_p")
    assert args.decoding.thinking is None and args.top_p == 1.0
    plain = parse_eval_args([])
    assert plain.decoding.protocol is None and plain.decoding.thinking == ThinkingTags()
    assert (plain.n, plain.max_tokens, plain.max_model_len, plain.top_p) == (1, 512, 2048, 1.0)
    # pass@64 is fine under r1: AIME samples 64
    assert parse_eval_args(["--protocol", "r1", "--k", "1,64"]).ks == (1, 64)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--protocol", "nope"], "unknown --protocol"),
        (["--protocol", "r1", "--temperature", "0"], "temperature 0"),
        (["--data_dir", "aime24"], "SUITE=PATH"),
        (["--data_dir", "aime24=/no/such/dir"], "no such file"),
        (["--suite", "gsm8k", "--data_dir", "aime24=."], "not evaluated"),
        (["--suite", "humaneval", "--data_dir", "humaneval=."], "installed package"),
    ],
)
def test_bad_protocol_arguments_exit_2(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def _record(**changes):
    record = {
        "protocol": {"name": "r1", "temperature": 0.6, "top_p": 0.95, "max_tokens": 32768,
                     "thinking": {"open": "<think>", "close": "</think>"}, "n": 4},
        "prompt_sha256": "p1",
        "max_prompt_tokens": None,
        "tasks": [{"label": "aime24", "n": 64, "dataset": {"sha256": "d1", "rows": 30},
                   "grader": {"source_sha256": "g1"}}],
    }  # fmt: skip
    for key, value in changes.items():
        if key in ("temperature", "thinking"):
            record["protocol"][key] = value
        elif key in ("n", "dataset", "grader"):
            record["tasks"][0][key] = value
        else:
            record[key] = value
    return record


def test_compare_records_says_why_runs_differ():
    assert compare_records(_record(), _record()) == []
    cases = {
        "protocol.temperature": (_record(temperature=1.0), Severity.INCOMPARABLE),
        "protocol.thinking": (_record(thinking=None), Severity.INCOMPARABLE),
        "aime24.n": (_record(n=32), Severity.INCOMPARABLE),
        "aime24.dataset": (_record(dataset={"sha256": "d2"}), Severity.INCOMPARABLE),
        "prompt_sha256": (_record(prompt_sha256="p2"), Severity.INCOMPARABLE),
        "aime24.grader": (_record(grader={"source_sha256": "g2"}), Severity.WARNING),
    }
    for what, (other, severity) in cases.items():
        (diff,) = compare_records(_record(), other)
        assert (diff.what, diff.severity) == (what, severity)


def _run(folder, record):
    evaluate(ListEngine(["9"]), CharTokenizer(), [EvalTask("aime24", NineEnv())],
             out_dir=folder, progress=False)  # fmt: skip
    write_run_record(folder, record)


def test_compare_refuses_incomparable_runs_unless_allowed(tmp_path, capsys):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    _run(a, _record())
    _run(b, _record(n=32))
    _run(c, _record(grader={"source_sha256": "g2"}))
    png = str(tmp_path / "d.png")
    assert main(["compare", str(a), str(b), "--png", png]) == 2
    captured = capsys.readouterr()
    assert "aime24.n differs (64 vs 32)" in captured.out and "not comparable" in captured.err
    # the records say which run moved off its protocol: compare names it
    b_record = _record(n=32)
    b_record["protocol"]["overridden"] = ["n"]
    b_record["protocol"]["label"] = "r1 (overridden: n for aime24)"
    b_record["tasks"][0]["overridden"] = ["n"]
    write_run_record(b, b_record)
    assert main(["compare", str(a), str(b), "--png", png]) == 2
    out = capsys.readouterr().out
    assert f"A: {a}  protocol: r1\n" in out
    assert f"B: {b}  protocol: r1 (overridden: n for aime24)" in out
    assert "aime24.n differs (64 vs 32); B overrode r1's n" in out
    assert main(["compare", str(a), str(b), "--png", png, "--allow_mismatch"]) == 0
    assert main(["compare", str(a), str(c), "--png", png]) == 0  # grader drift only warns
    out = capsys.readouterr().out
    assert "warning: aime24.grader differs" in out and "avg@n" in out
    # a folder holding another protocol's run is not overwritten
    with pytest.raises(ValueError, match="another protocol"):
        write_run_record(a, _record(temperature=1.0))


def test_eval_suites_during_training_log_avg_at_n_apart_from_eval_accuracy(monkeypatch):
    from grpo_train.config import ConfigError, TrainConfig
    from grpo_train.eval.training_suites import evaluate_suites, suite_sampling
    from grpo_train.setup.settings import suite_settings

    bench = Path(__file__).resolve().parents[2] / "grpo_envs" / "fixtures" / "benchmarks"
    monkeypatch.setenv("GRPO_AIME24_DIR", str(bench / "aime24"))
    monkeypatch.setenv("GRPO_GPQA_DIR", str(bench / "gpqa_diamond"))
    cfg = TrainConfig.from_flat(
        {"eval_suites": "aime24,gpqa_diamond", "eval_suite_samples": 2, "eval_size": 2,
         "temperature": 0.7}
    )  # fmt: skip
    settings = suite_settings(cfg)
    sampling = suite_sampling(settings)
    assert (sampling.n, sampling.temperature) == (2, 0.7)
    # "<think>..</think>" removed: "\boxed{24}" is AIME 2024 row 61's answer; GPQA gets no letter
    engine = ListEngine(["<think>\\boxed{67}</think>\\boxed{24}", "\\boxed{24}"])
    metrics = evaluate_suites(engine, CharTokenizer(), settings)
    assert "eval/accuracy" not in metrics and "eval/macro_avg" not in metrics
    assert metrics["eval/aime24/avg@2"] == pytest.approx(0.5)  # row 60 (067) wrong, 61 right
    assert metrics["eval/aime24/maj@2"] == pytest.approx(0.5)
    assert metrics["eval/gpqa_diamond/avg@2"] == 0.0
    assert metrics["eval/suites/macro_avg"] == pytest.approx(0.25)
    with pytest.raises(ConfigError, match="eval_suite_samples"):
        TrainConfig.from_flat({"eval_suite_samples": 0})


def test_a_suite_whose_data_is_missing_offline_is_one_line_and_exit_2(monkeypatch, capsys):
    from grpo_train.eval_cli import main

    monkeypatch.delenv("GRPO_AIME24_DIR", raising=False)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["--suite", "aime24", "--model", "/nonexistent", "--engine", "hf"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    assert err.startswith("grpo eval: error: aime24: cannot load HuggingFaceH4/aime_2024")
    assert "GRPO_AIME24_DIR" in err


def test_help_names_the_reported_metrics(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    for metric in ("avg@n", "standard error", "pass@k", "maj@k", "strict", "flexible"):
        assert metric in text, metric
