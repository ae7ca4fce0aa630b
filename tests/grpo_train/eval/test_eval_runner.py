"""The evaluation loop on fakes: a toy addition environment and a scripted engine."""

import json
import re
from collections.abc import Sequence
from dataclasses import replace

import datasets
import pytest

from grpo_envs.base import Environment
from grpo_envs.types import Outcome, Sample, Score
from grpo_train.eval.passk import pass_at_k
from grpo_train.eval.records import SampleStore
from grpo_train.eval.runner import GREEDY, EvalTask, default_ks, evaluate
from grpo_train.rollout.base import Completion, SamplingConfig


class CharTokenizer:
    """One token per character; a fixed chat template."""

    chat_template = "{role}: {content}"

    def apply_chat_template(self, conversation, tokenize=False, add_generation_prompt=True):
        assert tokenize is False
        return "".join(f"{m['role']}: {m['content']}\n" for m in conversation) + "assistant: "

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [ord(ch) for ch in text]}


class AddEnv(Environment):
    """'What is a+b?' -> the sum; completions are scored by exact match of the last integer."""

    splits = ("test",)

    def __init__(self, size: int = 6, env_id: str = "toy/add-v0", scorer_raises: bool = False):
        self.env_id = env_id
        self.size = size
        self.scorer_raises = scorer_raises

    def dataset(self, split="test"):
        rows = [
            Sample(id=f"add-{i}", prompt=(), answer=str(i + 2 * i), env_id=self.env_id).to_row()
            | {"prompt": [{"role": "user", "content": f"What is {i}+{2 * i}?"}]}
            for i in range(self.size)
        ]
        return datasets.Dataset.from_list(rows)

    def score(self, completion, sample):
        if self.scorer_raises:
            raise RuntimeError("scorer bug")
        sample = Sample.from_row(sample)
        found = re.findall(r"-?\d+", completion)
        if not found:
            return Score.failure(Outcome.UNPARSABLE, "no number")
        ok = found[-1] == sample.answer
        return Score(
            float(ok), Outcome.CORRECT if ok else Outcome.WRONG, details={"extracted": found[-1]}
        )

    def score_batch(self, completions, samples):
        if self.scorer_raises:
            raise RuntimeError("batch scorer bug")
        return [self.score(c, s) for c, s in zip(completions, samples)]


class ScriptedEngine:
    """Answers 'a+b' prompts. Prompt i gets ``correct(i)`` right answers out of each n.

    Completion j (0-based, within one generate call) is right iff j < correct(i); prompts whose
    a is 4 answer with no number at all; a is 5 gets a 'length' finish.
    """

    name = "scripted"

    def __init__(self, correct=lambda a, n: n if a % 2 == 0 else 0):
        self.correct = correct
        self.calls: list[tuple[int, int]] = []  # (num prompts, n)

    def generate(self, prompt_token_ids: Sequence[Sequence[int]], sampling: SamplingConfig):
        self.calls.append((len(prompt_token_ids), sampling.n))
        out = []
        for pi, ids in enumerate(prompt_token_ids):
            text = "".join(chr(t) for t in ids)
            a, b = map(int, re.search(r"(\d+)\+(\d+)\?", text).groups())
            comps = []
            for j in range(sampling.n):
                if a == 4:
                    body = "I do not know"
                else:
                    body = (
                        f"The answer is {a + b if j < self.correct(a, sampling.n) else a + b + 1}"
                    )
                tokens = tuple(range(len(body.split())))
                finish = "length" if a == 5 else "stop"
                comps.append(Completion(pi, body, tokens, (0.0,) * len(tokens), finish))
            out.append(comps)
        return out

    def sync_weights(self, model):
        raise NotImplementedError

    def close(self):
        pass

    @property
    def generated(self) -> int:
        return sum(p * n for p, n in self.calls)


def test_greedy_accuracy_and_record_fields(tmp_path):
    engine = ScriptedEngine()
    summary = evaluate(engine, CharTokenizer(), [AddEnv()], out_dir=tmp_path, progress=False)
    r = summary["toy/add-v0"]
    # a = 0, 2 right; 1, 3, 5 wrong; 4 unparsable (a=4 is even but answers no number)
    assert r.num_prompts == 6 and r.num_completions == 6 and r.n == 1 and r.greedy
    assert r.accuracy == pytest.approx(2 / 6)
    assert dict(r.outcome_counts) == {"correct": 2, "unparsable": 1, "wrong": 3}
    assert r.truncation_rate == pytest.approx(1 / 6)
    assert r.mean_completion_tokens == 4.0  # every scripted completion has four words
    assert r.strict_accuracy is None  # not a math/ env
    lines = (tmp_path / "samples.jsonl").read_text().splitlines()
    assert len(lines) == 6
    rec = json.loads(lines[0])
    assert rec["prompt"].startswith("user: What is 0+0?")
    assert rec["completion"] == "The answer is 0" and rec["extracted"] == "0"
    assert rec["outcome"] == "correct" and rec["success"] is True and rec["score"]["reward"] == 1.0
    written = json.loads((tmp_path / "summary.json").read_text())
    assert written["sampling"]["temperature"] == 0.0 and written["engine"] == "scripted"
    assert written["prompt_template"]["sha256"] and written["envs"][0]["env_id"] == "toy/add-v0"
    assert "datasets" in written["packages"]
    assert written["results"][0]["accuracy"] == pytest.approx(2 / 6)


def test_pass_at_k_through_the_runner_matches_hand_values():
    # prompt a gets c = a (capped at n) right answers out of n = 4; a = 4, 5 excluded by limit.
    engine = ScriptedEngine(correct=lambda a, n: min(a, n))
    sampling = SamplingConfig(n=4, temperature=1.0, max_new_tokens=16)
    summary = evaluate(
        engine,
        CharTokenizer(),
        {"add": AddEnv()},
        limit=4,
        sampling=sampling,
        ks=[1, 2, 4],
        progress=False,
    )
    r = summary["add"]
    cs = [0, 1, 2, 3]
    for k in (1, 2, 4):
        assert r.pass_at_k[k] == pytest.approx(sum(pass_at_k(4, c, k) for c in cs) / 4)
    assert r.pass_at_k[2] == pytest.approx((0 + 0.5 + 1 - 1 / 6 + 1) / 4)
    assert r.accuracy == pytest.approx(6 / 16)
    assert not r.greedy
    metrics = summary.metrics()
    assert metrics["eval/add/pass@4"] == pytest.approx(0.75)
    assert engine.calls == [(4, 4)]


def test_k_larger_than_n_is_an_error():
    with pytest.raises(ValueError, match="raise n"):
        evaluate(
            ScriptedEngine(),
            CharTokenizer(),
            [AddEnv()],
            sampling=GREEDY,
            ks=[1, 4],
            progress=False,
        )


def test_default_ks():
    assert default_ks(1) == (1,)
    assert default_ks(8) == (1, 2, 4, 8)
    assert default_ks(6) == (1, 2, 4, 6)


def test_resume_after_kill_has_no_duplicates_and_same_summary(tmp_path):
    sampling = SamplingConfig(n=3, temperature=1.0, max_new_tokens=16)
    kw = dict(sampling=sampling, batch_size=2, progress=False)
    reference = evaluate(
        ScriptedEngine(), CharTokenizer(), [AddEnv()], out_dir=tmp_path / "ref", **kw
    )

    run = tmp_path / "run"
    evaluate(ScriptedEngine(), CharTokenizer(), [AddEnv()], out_dir=run, **kw)
    path = run / "samples.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    assert len(lines) == 18
    # "Kill" the run: keep 7 full records (prompt 2 is half done) and half of the 8th line.
    path.write_text("".join(lines[:7]) + lines[7][: len(lines[7]) // 2])

    engine = ScriptedEngine()
    resumed = evaluate(engine, CharTokenizer(), [AddEnv()], out_dir=run, **kw)
    assert resumed.num_reused == 7 and resumed.num_generated == 11 == engine.generated
    keys = [
        (r["env_id"], r["sample_id"], r["gen_index"])
        for r in map(json.loads, path.read_text().splitlines())
    ]
    assert len(keys) == 18 == len(set(keys))
    assert resumed.results == reference.results

    # A third run finds everything done and generates nothing.
    engine = ScriptedEngine()
    again = evaluate(engine, CharTokenizer(), [AddEnv()], out_dir=run, **kw)
    assert engine.calls == [] and again.num_generated == 0 and again.results == reference.results


def test_resume_with_a_larger_limit_only_generates_new_prompts(tmp_path):
    evaluate(
        ScriptedEngine(), CharTokenizer(), [AddEnv()], out_dir=tmp_path, limit=2, progress=False
    )
    engine = ScriptedEngine()
    summary = evaluate(
        engine, CharTokenizer(), [AddEnv()], out_dir=tmp_path, limit=5, progress=False
    )
    assert engine.generated == 3 and summary["toy/add-v0"].num_prompts == 5
    # Going back to a smaller limit reports only the selected prompts.
    small = evaluate(
        ScriptedEngine(), CharTokenizer(), [AddEnv()], out_dir=tmp_path, limit=2, progress=False
    )
    assert small["toy/add-v0"].num_prompts == 2 and small.num_generated == 0


def test_resume_refuses_other_generation_settings(tmp_path):
    evaluate(
        ScriptedEngine(), CharTokenizer(), [AddEnv()], out_dir=tmp_path, limit=1, progress=False
    )
    hot = replace(GREEDY, temperature=0.7)
    with pytest.raises(ValueError, match="other settings"):
        evaluate(
            ScriptedEngine(),
            CharTokenizer(),
            [AddEnv()],
            out_dir=tmp_path,
            sampling=hot,
            progress=False,
        )


def test_store_drops_partial_last_line_and_ignores_duplicates(tmp_path):
    evaluate(
        ScriptedEngine(), CharTokenizer(), [AddEnv()], out_dir=tmp_path, limit=2, progress=False
    )
    path = tmp_path / "samples.jsonl"
    first = path.read_text().splitlines(keepends=True)[0]
    path.write_text(path.read_text() + first + '{"task": "tru')
    store = SampleStore(path)
    assert len(store) == 2
    assert path.read_text().endswith("\n")  # the partial line is gone, appends start clean


def test_scorer_failures_become_error_outcomes():
    summary = evaluate(
        ScriptedEngine(), CharTokenizer(), [AddEnv(scorer_raises=True)], limit=3, progress=False
    )
    r = summary["toy/add-v0"]
    assert dict(r.outcome_counts) == {"error": 3} and r.accuracy == 0.0


def test_engine_returning_wrong_shape_is_a_clear_error():
    class Short(ScriptedEngine):
        def generate(self, prompt_token_ids, sampling):
            return super().generate(prompt_token_ids, sampling)[:-1]

    with pytest.raises(RuntimeError, match="returned"):
        evaluate(Short(), CharTokenizer(), [AddEnv()], progress=False)


def test_bad_inputs_fail_early():
    with pytest.raises(ValueError, match="split"):
        evaluate(ScriptedEngine(), CharTokenizer(), [AddEnv()], split="train", progress=False)
    with pytest.raises(ValueError, match="nothing to evaluate"):
        evaluate(ScriptedEngine(), CharTokenizer(), [], progress=False)
    with pytest.raises(ValueError, match="distinct"):
        evaluate(
            ScriptedEngine(),
            CharTokenizer(),
            [EvalTask("a", AddEnv()), EvalTask("b", AddEnv())],
            progress=False,
        )


def test_several_tasks_are_reported_separately():
    envs = [EvalTask("one", AddEnv(3, "toy/a-v0")), EvalTask("two", AddEnv(2, "toy/b-v0"))]
    engine = ScriptedEngine()
    summary = evaluate(engine, CharTokenizer(), envs, batch_size=10, progress=False)
    assert [r.label for r in summary.results] == ["one", "two"]
    assert [r.num_prompts for r in summary.results] == [3, 2]
    assert engine.calls == [(3, 1), (2, 1)]  # batches never mix environments
    assert "| one |" in summary.table() and "| two |" in summary.table()


def test_malformed_scores_become_errors_and_overall_accuracy_is_logged():
    class NaNEnv(AddEnv):
        def score_batch(self, completions, samples):
            scores = super().score_batch(completions, samples)
            return [Score(float("nan"), Outcome.CORRECT), *scores[1:]]

    summary = evaluate(ScriptedEngine(), CharTokenizer(), [NaNEnv()], limit=3, progress=False)
    r = summary["toy/add-v0"]
    assert r.outcome_counts["error"] == 1 and r.accuracy == pytest.approx(1 / 3)  # a=2 right
    envs = [EvalTask("one", AddEnv(3, "toy/a-v0")), EvalTask("two", AddEnv(1, "toy/b-v0"))]
    metrics = evaluate(ScriptedEngine(), CharTokenizer(), envs, progress=False).metrics("val")
    # one: a=0 right, a=1 wrong, a=2 right; two: a=0 right -> 3 of 4 completions overall
    assert metrics["val/accuracy"] == pytest.approx(3 / 4)
    assert metrics["val/one/accuracy"] == pytest.approx(2 / 3)
    assert metrics["val/two/pass@1"] == 1.0


def test_long_prompts_keep_their_last_tokens():
    seen: list[list[int]] = []

    class Recording(ScriptedEngine):
        def generate(self, prompt_token_ids, sampling):
            seen.append([len(p) for p in prompt_token_ids])
            return super().generate(prompt_token_ids, sampling)

    kw = dict(limit=2, progress=False)
    evaluate(Recording(), CharTokenizer(), [AddEnv()], **kw)
    assert seen[-1] == [30, 30]  # "user: What is 0+0?\nassistant: "
    summary = evaluate(Recording(), CharTokenizer(), [AddEnv()], max_prompt_tokens=20, **kw)
    assert seen[-1] == [20, 20] and summary["toy/add-v0"].accuracy == 0.5
