"""The step-1 sampler comparison: its arithmetic, and its logprob check on a tiny model."""

from __future__ import annotations

import doctest

import pytest
from bench_scripts import load

sc = load("sampler_check")


def test_docstring_examples():
    assert doctest.testmod(sc).failed == 0


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo_train.models.loading import build_tiny_model

    path = build_tiny_model(tmp_path_factory.mktemp("tiny"))
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    # Prompts of different lengths, so that both batched samplers left-pad.
    prompts = [tokenizer("a" * k)["input_ids"] for k in (3, 9, 17, 30, 5)]
    return model, tokenizer, prompts


def test_both_samplers_draw_from_the_trainers_own_distribution(tiny):
    """Under left padding, TRL's generate path and our HF engine report, for every drawn token,
    the probability an unpadded forward gives it: the check that separates "same sampler" from
    a logits processor or a position-id shift."""
    from grpo_train.rollout import make_engine

    model, tokenizer, prompts = tiny
    engine = make_engine("hf", "unused", model=model, tokenizer=tokenizer)
    for drawn in (
        sc.draw_trl(model, tokenizer, prompts, 4, 12, 1.0, seed=0),
        sc.draw_engine(engine, prompts, 4, 12, 1.0, seed=0),
    ):
        assert [d.prompt for d in drawn] == list(range(len(prompts)))
        assert all(len(d.token_ids) == 4 and d.logprobs for d in drawn)
        worst, mean = sc.teacher_forced_gap(model, prompts, drawn, 1.0, limit=len(prompts))
        assert worst is not None and worst < 1e-4 and mean < 1e-5
        _, _, excess = sc.sampling_fidelity(model, prompts, drawn, 1.0, limit=len(prompts))
        assert excess is not None and abs(excess[0]) < 4 * excess[1]  # no sharpening


def test_a_logits_processor_shows_up_in_the_gap(tiny):
    """The same check fails for a sampler that cuts the distribution (top-k 5 here)."""
    from grpo_train.rollout import make_engine
    from grpo_train.rollout.base import SamplingConfig

    model, tokenizer, prompts = tiny
    engine = make_engine("hf", "unused", model=model, tokenizer=tokenizer)
    groups = engine.generate(prompts, SamplingConfig(n=4, max_new_tokens=12, top_k=5, seed=1))
    drawn = [
        sc.Drawn(i, [list(c.token_ids) for c in g], [c.text for c in g],
                 [c.finish_reason == "stop" for c in g], [list(c.logprobs) for c in g])
        for i, g in enumerate(groups)
    ]  # fmt: skip
    worst, _ = sc.teacher_forced_gap(model, prompts, drawn, 1.0, limit=len(prompts))
    assert worst is not None and worst > 1e-2
    # and the fidelity checks, which need no sampler logprobs, see the cut: sharper draws
    ks, critical, excess = sc.sampling_fidelity(model, prompts, drawn, 1.0, limit=len(prompts))
    assert excess is not None and excess[0] > 4 * excess[1] and ks > critical


@pytest.mark.slow
def test_trl_trainer_draws_are_trls_own_batch_rendered_as_ours(tmp_path):
    """The real ``GRPOTrainer``, stopped at its reward call: each prompt gets its n completions in
    order, a seed reproduces its draw and another seed draws anew, and TRL's prompts are the
    ones ``encode_prompt`` renders (else the fidelity check, run on ours, would see a shift)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import grpo_envs
    from grpo_envs.types import Sample
    from grpo_train.episodes.prompts import encode_prompt
    from grpo_train.models.loading import build_tiny_model

    path = build_tiny_model(tmp_path / "tiny")
    env = grpo_envs.make("math/arithmetic-v0", task="add2", answer="loose")
    picked = sc.race_step1_rows(len(env.dataset("train")), 2)[:6]  # two calls: 4 rows, then 2
    rows = env.dataset("train").select(picked)
    draw = [sc.draw_trl_trainer(str(path), rows, env, 3, 10, 1.0, seed) for seed in (7, 7, 8)]
    first, again, other = draw
    assert [d.prompt for d in first] == list(range(6))
    assert all(len(d.token_ids) == len(d.texts) == len(d.stopped) == 3 for d in first)
    tokenizer = AutoTokenizer.from_pretrained(path)
    for d in first:
        for ids, text, stopped in zip(d.token_ids, d.texts, d.stopped, strict=True):
            assert 1 <= len(ids) <= 10 and text == tokenizer.decode(ids, skip_special_tokens=True)
            assert stopped == (ids[-1] == tokenizer.eos_token_id)
    assert [d.token_ids for d in again] == [d.token_ids for d in first]
    assert [d.token_ids for d in other] != [d.token_ids for d in first]
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    prompts = [encode_prompt(tokenizer, Sample.from_row(r), max_tokens=256).ids for r in rows]
    pooled = first + other
    ks, critical, excess = sc.sampling_fidelity(model, prompts, pooled, 1.0, limit=len(pooled))
    assert excess is not None and abs(excess[0]) < 4 * excess[1] and ks < 1.5 * critical


def test_pool_compares_each_race_arms_step1_right_answers_with_the_pooled_rates(tmp_path, capsys):
    """``--pool`` reads the samplers' per-prompt rates and the race's runs: an arm that drew
    far more right answers at step 1 than the rates predict gets a small upper tail."""
    import json
    from dataclasses import asdict

    rates = [0.0, 0.25, 0.0, 0.25] * 2  # seeds 0 and 1, four prompts each
    summary = sc.Summary(
        "vllm", 64, 0.125, 1.0, 0.0, 10.0, (1, 2, 3), 8.0, [], None, None, 1.0,
        per_prompt_reward=rates,
    )  # fmt: skip
    (tmp_path / "rates.json").write_text(json.dumps([asdict(summary)]))

    def run(trainer, seed, right):
        spec = {"name": f"{trainer}#s{seed}", "trainer": trainer, "steps": 1,
                "learning_rate": 2e-5, "seed": seed}  # fmt: skip
        return {"spec": spec, "points": [], "train_accuracy": [right / 32]}

    results = [run("trl", 0, 12), run("trl", 1, 13), run("ours", 0, 4), run("ours", 1, 4)]
    race = tmp_path / "race.json"
    race.write_text(json.dumps({"base_accuracy": 0.1, "args": {}, "results": results}))
    argv = ["--race-seeds", "2", "--pool", str(tmp_path / "rates.json"), "--race", str(race)]
    assert sc.main(argv) == 0
    lines = {line.split(":")[0].strip(): line for line in capsys.readouterr().out.splitlines()}
    ours, trl = lines["ours"], lines["trl"]
    assert "8 right, expected 8.0" in ours
    assert "25 right, expected 8.0" in trl
    assert float(trl.split("P(>= 25) = ")[1].split(",")[0]) < 1e-4


def test_hashed_trainer_seeds_take_one_round_per_run(capsys):
    """Round r of a hashed run would seed call c with round 0's seed of call c + r."""
    assert sc.trainer_seed(0, 5, hashed=True) == sc.trainer_seed(4, 1, hashed=True)  # the trap
    with pytest.raises(SystemExit):
        sc.main(["--samplers", "trl-trainer", "--trl-seed-hash", "--rounds", "2"])
    assert "--trl-seed-hash: one round per run" in capsys.readouterr().err
