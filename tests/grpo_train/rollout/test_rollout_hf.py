from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from rollout_checks import PROMPTS, check_groups, forward_logprobs, max_logprob_gap

from grpo_train.learner.weight_export import export_state_dict, sync_rollout_weights
from grpo_train.models.loading import load_policy
from grpo_train.rollout import make_engine
from grpo_train.rollout.base import SamplingConfig
from grpo_train.rollout.hf import HFEngine


@pytest.fixture(scope="module")
def policy(tiny_model_path: Path):
    return load_policy(str(tiny_model_path))


@pytest.fixture()
def engine(policy) -> HFEngine:
    model, tok = policy
    return HFEngine(model, tok)


def _eos(engine: HFEngine) -> set[int]:
    return set(engine.eos_token_ids)


def test_sampled_groups_are_consistent_and_match_trainer_logprobs(engine: HFEngine, policy) -> None:
    sampling = SamplingConfig(n=8, max_new_tokens=48, temperature=0.8, seed=0)
    groups = engine.generate(PROMPTS, sampling)
    check_groups(groups, 8, 48, _eos(engine), engine.tokenizer.decode)
    reasons = {c.finish_reason for g in groups for c in g}
    assert reasons == {"stop", "length"}, "the fixed seed should give both kinds of endings"
    assert max_logprob_gap(policy[0], groups, PROMPTS, 0.8) < 1e-4
    # n samples of one prompt differ: the group is not one repeated sample.
    assert len({c.token_ids for c in groups[0]}) > 1


def test_max_new_tokens_cuts_with_length_reason(engine: HFEngine) -> None:
    groups = engine.generate(PROMPTS, SamplingConfig(n=2, max_new_tokens=3, seed=1))
    for c in (c for g in groups for c in g):
        assert len(c.token_ids) <= 3
        assert c.finish_reason == "length" or c.token_ids[-1] in _eos(engine)


def test_greedy_is_deterministic_and_independent_of_batching(engine: HFEngine, policy) -> None:
    greedy = SamplingConfig(n=3, max_new_tokens=12, temperature=0.0)
    first = engine.generate(PROMPTS, greedy)
    assert first == engine.generate(PROMPTS, greedy)
    for group in first:
        assert len({c.token_ids for c in group}) == 1
    # Alone (no padding) and in a left-padded batch of 1-row chunks: same continuation.
    alone = engine.generate([PROMPTS[2]], greedy)[0][0]
    assert alone.token_ids == first[2][0].token_ids
    chunked = HFEngine(policy[0], policy[1], max_batch_size=2).generate(PROMPTS, greedy)
    assert [g[0].token_ids for g in chunked] == [g[0].token_ids for g in first]
    # Greedy logprobs are the plain model distribution (temperature 1).
    assert max_logprob_gap(policy[0], first, PROMPTS, 1.0) < 1e-4


def test_seed_reproduces_and_leaves_global_rng_alone(engine: HFEngine) -> None:
    sampling = SamplingConfig(n=4, max_new_tokens=16, seed=7)
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a = engine.generate(PROMPTS, sampling)
    after = torch.rand(1)
    assert torch.equal(before, after)
    assert a == engine.generate(PROMPTS, sampling)
    assert a != engine.generate(PROMPTS, SamplingConfig(n=4, max_new_tokens=16, seed=8))


def test_top_k_and_top_p_logprobs_are_renormalised(engine: HFEngine) -> None:
    one = engine.generate(PROMPTS, SamplingConfig(n=2, max_new_tokens=6, top_k=1, seed=0))
    greedy = engine.generate(PROMPTS, SamplingConfig(n=1, max_new_tokens=6, temperature=0))
    for g, ref in zip(one, greedy):
        assert g[0].token_ids == ref[0].token_ids
        assert all(lp == pytest.approx(0.0, abs=1e-6) for lp in g[0].logprobs)
    nucleus = engine.generate(PROMPTS, SamplingConfig(n=2, max_new_tokens=6, top_p=0.5, seed=0))
    full = engine.generate(PROMPTS, SamplingConfig(n=2, max_new_tokens=6, seed=0))
    # A nucleus holds less mass than the full vocabulary, so its tokens get higher logprobs.
    assert min(nucleus[0][0].logprobs) > min(full[0][0].logprobs)


def test_bad_input_is_a_clear_error(engine: HFEngine) -> None:
    sampling = SamplingConfig(n=1, max_new_tokens=2)
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        engine.generate([[1, 2], []], sampling)
    with pytest.raises(ValueError, match="outside"):
        engine.generate([[1, 10**6]], sampling)
    with pytest.raises(TypeError, match="tokenize first"):
        engine.generate(["hello"], sampling)  # type: ignore[list-item]
    for bad in ({"n": 0}, {"max_new_tokens": 0}, {"temperature": -1}, {"top_p": 0}, {"top_k": -2}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            SamplingConfig(**bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="engine must be one of"):
        make_engine("tgi", "x")


def test_auto_engine_falls_back_to_hf(tiny_model_path: Path, monkeypatch) -> None:
    import grpo_train.rollout as rollout

    monkeypatch.setattr(rollout, "vllm_available", lambda: False)
    engine = rollout.make_engine("auto", tiny_model_path)
    assert isinstance(engine, HFEngine) and engine.name == "hf"


def test_shared_module_sync_is_free_and_separate_copy_syncs(tiny_model_path: Path) -> None:
    trainer, tok = load_policy(str(tiny_model_path))
    shared = HFEngine(trainer, tok)
    separate = make_engine("hf", tiny_model_path)
    assert isinstance(separate, HFEngine) and separate.model is not trainer
    with torch.no_grad():
        for p in trainer.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    sync_rollout_weights(shared, trainer)
    sync_rollout_weights(separate, trainer)
    assert separate.last_sync_seconds > 0
    sampling = SamplingConfig(n=2, max_new_tokens=10, seed=3)
    assert shared.generate(PROMPTS, sampling) == separate.generate(PROMPTS, sampling)
    assert max_logprob_gap(trainer, separate.generate(PROMPTS, sampling), PROMPTS, 1.0) < 1e-4


def _lora(model: torch.nn.Module) -> Any:
    import peft

    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"])
    wrapped = peft.get_peft_model(copy.deepcopy(model), config)
    with torch.no_grad():
        for name, p in wrapped.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)  # LoRA starts as a no-op; make the adapter matter
    return wrapped


def test_checkpoint_state_dict_maps_peft_names_and_merges(policy) -> None:
    model, _ = policy
    plain = export_state_dict(model)
    assert "model.embed_tokens.weight" in plain and "lm_head.weight" not in plain  # tied
    wrapped = _lora(model)
    merged = export_state_dict(wrapped)
    assert merged.keys() == plain.keys()
    name = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.allclose(merged[name], plain[name])
    assert torch.equal(
        merged["model.layers.0.self_attn.k_proj.weight"],
        plain["model.layers.0.self_attn.k_proj.weight"],
    )
    # The trainer's weights are untouched (no merge/unmerge round trip).
    base_q = wrapped.get_base_model().model.layers[0].self_attn.q_proj.base_layer.weight
    assert torch.equal(base_q, plain[name])


def _reference_merge(wrapped: Any) -> dict[str, torch.Tensor]:
    return dict(copy.deepcopy(wrapped).merge_and_unload().state_dict())


def test_lora_delta_merge_matches_peft_merge(policy) -> None:
    wrapped = _lora(policy[0])
    merged, ref = export_state_dict(wrapped), _reference_merge(wrapped)
    for name, tensor in merged.items():
        assert torch.allclose(tensor, ref[name], atol=1e-6), name


def test_dora_falls_back_to_merge_and_restores_the_trainer(policy) -> None:
    import peft

    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"], use_dora=True)
    wrapped: Any = peft.get_peft_model(copy.deepcopy(policy[0]), config)
    with torch.no_grad():
        for name, p in wrapped.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    before = {k: v.clone() for k, v in wrapped.state_dict().items()}
    merged, ref = export_state_dict(wrapped), _reference_merge(wrapped)
    for name, tensor in merged.items():
        assert torch.allclose(tensor, ref[name], atol=1e-5), name
    after = wrapped.state_dict()
    assert all(torch.allclose(after[k], v, atol=1e-6) for k, v in before.items())
    assert not any(m.merged for m in wrapped.modules() if hasattr(m, "merged"))


def test_peft_model_syncs_into_separate_engine(tiny_model_path: Path, policy) -> None:
    wrapped = _lora(policy[0])
    engine = make_engine("hf", tiny_model_path)
    sync_rollout_weights(engine, wrapped)
    sampling = SamplingConfig(n=2, max_new_tokens=10, seed=5)
    groups = engine.generate(PROMPTS, sampling)
    assert max_logprob_gap(wrapped, groups, PROMPTS, 1.0) < 1e-4
    assert max_logprob_gap(policy[0], groups, PROMPTS, 1.0) > 1e-2


def test_forward_logprobs_helper_matches_manual(policy) -> None:
    model, _ = policy
    lp = forward_logprobs(model, [1, 2, 3], [4, 5], 1.0)
    with torch.no_grad():
        logits = model(torch.tensor([[1, 2, 3, 4]])).logits[0]
    assert lp[1].item() == pytest.approx(torch.log_softmax(logits[3], -1)[5].item(), abs=1e-5)


def test_decode_loop_matches_model_generate(policy) -> None:
    # The static-cache decode loop (each prompt prefilled once for its group) against
    # transformers' generate: the same greedy continuations, also when a chunk of
    # max_batch_size rows splits a group, and sampled logprobs equal to the trainer's.
    model, tok = policy
    greedy = SamplingConfig(n=3, max_new_tokens=16, temperature=0.0)
    reference = HFEngine(model, tok, decode="generate").generate(PROMPTS, greedy)
    for size in (64, 4):
        loop = HFEngine(model, tok, max_batch_size=size).generate(PROMPTS, greedy)
        assert [[c.token_ids for c in g] for g in loop] == [
            [c.token_ids for c in g] for g in reference
        ]
        assert max_logprob_gap(model, loop, PROMPTS, 1.0) < 1e-4
    sampling = SamplingConfig(n=4, max_new_tokens=12, temperature=0.7, seed=2)
    groups = HFEngine(model, tok, max_batch_size=5).generate(PROMPTS, sampling)
    check_groups(groups, 4, 12, set(HFEngine(model, tok).eos_token_ids), tok.decode)
    assert max_logprob_gap(model, groups, PROMPTS, 0.7) < 1e-4


def _prefill_widths(model: torch.nn.Module) -> tuple[list[int], Any]:
    """Record the width of every forward's input_ids (a prefill is the first of a call)."""
    widths: list[int] = []

    def record(module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        widths.append(int(kwargs["input_ids"].shape[1]))

    return widths, model.register_forward_pre_hook(record, with_kwargs=True)


def test_a_next_turn_prefills_only_its_new_tokens_and_samples_what_a_fresh_engine_does(
    policy,
) -> None:
    # A multi-turn episode's next prompt is its history (prompt + sampled ids) plus the
    # environment's reply: the engine starts from the previous call's keys/values.
    model, tok = policy
    warm = HFEngine(model, tok)
    groups = warm.generate(PROMPTS, SamplingConfig(n=2, max_new_tokens=10, seed=3))
    reply = tok.encode(" No, try again.", add_special_tokens=False)
    histories = [[*PROMPTS[i], *c.token_ids, *reply] for i, g in enumerate(groups) for c in g]
    greedy = SamplingConfig(n=1, max_new_tokens=12, temperature=0.0)
    widths, hook = _prefill_widths(model)
    try:
        reused = warm.generate(histories, greedy)
        fresh = HFEngine(model, tok).generate(histories, greedy)
    finally:
        hook.remove()
    prefill_reused, prefill_fresh = widths[0], widths[len(widths) // 2]
    # Only the reply and each history's last sampled id (it had no keys yet) are prefilled.
    assert prefill_reused == len(reply) + 1 and prefill_fresh == max(map(len, histories))
    assert [[c.token_ids for c in g] for g in reused] == [[c.token_ids for c in g] for g in fresh]
    assert max_logprob_gap(model, reused, histories, 1.0) < 1e-4


def test_kept_keys_and_values_are_dropped_when_the_weights_change(policy) -> None:
    model, tok = policy
    engine = HFEngine(model, tok)
    groups = engine.generate(PROMPTS[:1], SamplingConfig(n=1, max_new_tokens=6, seed=5))
    history = [[*PROMPTS[0], *groups[0][0].token_ids, 7]]
    with torch.no_grad():  # an optimizer step writes the shared module in place
        next(model.parameters()).add_(0.0)
    widths, hook = _prefill_widths(model)
    try:
        engine.generate(history, SamplingConfig(n=1, max_new_tokens=2, temperature=0.0))
    finally:
        hook.remove()
    assert widths[0] == len(history[0])  # the whole history again: nothing stale reused


def test_models_without_a_plain_static_cache_fall_back_to_generate(policy, monkeypatch) -> None:
    import transformers.cache_utils

    class NoLayer:  # no cache layer is of this type: the loop declines the model
        pass

    model, tok = policy
    sampling = SamplingConfig(n=2, max_new_tokens=8, seed=4)
    expected = HFEngine(model, tok, decode="generate").generate(PROMPTS, sampling)
    monkeypatch.setattr(transformers.cache_utils, "StaticLayer", NoLayer)
    assert HFEngine(model, tok).generate(PROMPTS, sampling) == expected
    with pytest.raises(ValueError, match="decode must be"):
        HFEngine(model, tok, decode="beam")  # type: ignore[arg-type]


def test_warp_logits_temperature_top_k_top_p_by_hand() -> None:
    from grpo_train.rollout.hf import warp_logits

    logits = torch.log(torch.tensor([[0.1, 0.2, 0.3, 0.4]]))
    inf = float("-inf")
    assert torch.equal(warp_logits(logits, SamplingConfig(temperature=0)), logits)  # greedy
    torch.testing.assert_close(warp_logits(logits, SamplingConfig(temperature=0.5)), logits * 2)
    top_k = warp_logits(logits, SamplingConfig(top_k=2))
    assert top_k[0, :2].tolist() == [inf, inf] and torch.equal(top_k[0, 2:], logits[0, 2:])
    # top_p 0.6: 0.4 (mass above it 0) and 0.3 (0.4) stay; 0.2 (0.7 above it) and 0.1 go.
    top_p = warp_logits(logits, SamplingConfig(top_p=0.6))
    assert top_p[0, :2].tolist() == [inf, inf] and torch.equal(top_p[0, 2:], logits[0, 2:])
    tiny = warp_logits(logits, SamplingConfig(top_p=0.01))  # the most likely token always stays
    assert torch.isfinite(tiny).tolist() == [[False, False, False, True]]


def test_inverse_cdf_sample_draws_each_token_with_its_probability() -> None:
    from grpo_train.rollout.hf import inverse_cdf_sample, sample_tokens

    probs = torch.tensor([0.1, 0.0, 0.6, 0.3])
    uniform = torch.rand(20000, 1, generator=torch.Generator().manual_seed(0))
    tokens = inverse_cdf_sample(probs.expand(20000, 4), uniform)
    freq = torch.bincount(tokens, minlength=4).double() / 20000
    assert freq[1] == 0  # a zero-probability token is never drawn
    torch.testing.assert_close(freq, probs.double(), atol=0.01, rtol=0)
    edges = inverse_cdf_sample(probs.expand(2, 4), torch.tensor([[0.0], [1.0 - 1e-9]]))
    assert edges.tolist() == [0, 3]
    with pytest.raises(ValueError, match="NaN"):
        inverse_cdf_sample(torch.tensor([[0.5, float("nan")]]), torch.zeros(1, 1))
    # sample_tokens returns the drawn token's logprob under the warped distribution.
    torch.manual_seed(0)
    logits = torch.randn(5, 4)
    drawn, logprob = sample_tokens(logits, SamplingConfig(temperature=0.5))
    expected = torch.log_softmax(logits / 0.5, dim=-1).gather(1, drawn[:, None])[:, 0]
    torch.testing.assert_close(logprob, expected)


@pytest.mark.parametrize("max_batch_size", [3, 64])
def test_on_done_reports_every_prompt_once_with_its_finished_group(
    policy, max_batch_size, monkeypatch
) -> None:
    # Chunks of 3 rows with n = 2: some prompts' rows span two chunks; a prompt is reported
    # right after the chunk that completes it (before the next chunk decodes), once.
    engine = HFEngine(policy[0], policy[1], max_batch_size=max_batch_size)
    sampling = SamplingConfig(n=2, max_new_tokens=8, temperature=0.8, seed=5)
    chunks: list[int] = []  # rows of each chunk decoded so far
    decode = engine._generate_batch
    monkeypatch.setattr(
        engine, "_generate_batch", lambda rows, *a: chunks.append(len(rows)) or decode(rows, *a)
    )
    reported: list[tuple[int, list[Any], int]] = []  # prompt, group, rows decoded by then
    groups = engine.generate(
        PROMPTS, sampling, lambda i, g: reported.append((i, list(g), sum(chunks)))
    )
    assert sorted(i for i, _, _ in reported) == list(range(len(PROMPTS)))
    assert all(group == groups[i] and len(group) == 2 for i, group, _ in reported)
    # Prompt i's rows are 2i and 2i + 1: reported once the chunk holding row 2i + 1 is done.
    size = min(max_batch_size, 2 * len(PROMPTS))
    assert [rows for _, _, rows in reported] == [
        min(-(-(2 * i + 2) // size) * size, 2 * len(PROMPTS)) for i, _, _ in reported
    ]
    assert engine.generate(PROMPTS, sampling) == groups  # the same completions without it


def _refusing_rows_over(limit: int, model: torch.nn.Module, tried: list[int]) -> Any:
    """A forward pre-hook that fails like CUDA does when a forward has more than ``limit`` rows."""

    def refuse(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        rows = int(kwargs["input_ids"].shape[0])
        tried.append(rows)
        if rows > limit:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    return model.register_forward_pre_hook(refuse, with_kwargs=True)


@pytest.mark.parametrize("decode", ["loop", "generate"])
def test_a_chunk_out_of_gpu_memory_is_decoded_again_in_halves(policy, decode, caplog) -> None:
    # What fits depends on the card, the model and the lengths: a chunk that runs out of memory
    # is decoded again with half the rows, later chunks and calls keep that size, and every
    # group comes back whole, reported once, with the policy's logprobs.
    model, tok = policy
    engine = HFEngine(model, tok, max_batch_size=8, decode=decode)
    sampling = SamplingConfig(n=4, max_new_tokens=6, temperature=0.8, seed=3)
    tried: list[int] = []
    reported: list[int] = []
    handle = _refusing_rows_over(3, model, tried)
    try:
        with caplog.at_level(logging.WARNING, logger="grpo_train.rollout.hf"):
            groups = engine.generate(PROMPTS[:3], sampling, lambda i, g: reported.append(i))
            tried.clear()
            again = engine.generate(PROMPTS[:1], sampling)
    finally:
        handle.remove()
    check_groups(groups, 4, 6, _eos(engine), engine.tokenizer.decode)
    assert sorted(reported) == [0, 1, 2] and len(again[0]) == 4
    assert max_logprob_gap(model, groups, PROMPTS[:3], 0.8) < 1e-4
    assert engine.max_batch_size == 2 and max(tried) <= 2  # the next call starts at 2
    assert [r.getMessage() for r in caplog.records] == [
        "hf engine: out of memory decoding 8 sequences together; going on with at most 4 "
        "(hf_max_batch_size starts there)",
        "hf engine: out of memory decoding 4 sequences together; going on with at most 2 "
        "(hf_max_batch_size starts there)",
    ]


def test_a_single_sequence_out_of_gpu_memory_says_what_to_change(policy) -> None:
    model, tok = policy
    engine = HFEngine(model, tok, max_batch_size=2)
    handle = _refusing_rows_over(0, model, [])
    try:
        with pytest.raises(torch.OutOfMemoryError, match="single sequence") as raised:
            engine.generate(PROMPTS[:1], SamplingConfig(n=2, max_new_tokens=4, seed=0))
    finally:
        handle.remove()
    message = str(raised.value)
    assert f"a {len(PROMPTS[0])}-token prompt and up to 4 new tokens: CUDA out of memory" in message
    assert message.endswith("Tried to allocate 2.00 GiB")
    assert isinstance(raised.value.__cause__, torch.OutOfMemoryError)
    assert engine.max_batch_size == 1


def test_a_runs_hf_max_batch_size_reaches_its_engine(policy, tiny_model_path: Path) -> None:
    from grpo_train.config import TrainConfig
    from grpo_train.setup.engines import build_engine

    config = TrainConfig.from_flat({"engine": "hf", "hf_max_batch_size": 5})
    engine = build_engine(config, str(tiny_model_path), *policy)
    assert isinstance(engine, HFEngine) and engine.max_batch_size == 5
    assert engine.model is policy[0]  # the trainer's module, shared
