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

    from grpo_train.models import build_tiny_model

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
