"""The hf engine's memory grows with its KV cache, not with the vocabulary, per generated token."""

from __future__ import annotations

import pytest
from memory_probe import peak_kib

_SCRIPT = r"""
from grpo_train.rollout.base import SamplingConfig
from grpo_train.rollout.hf import HFEngine

steps, decode = int(sys.argv[1]), sys.argv[2]
model = Qwen3ForCausalLM(tiny_qwen3(steps + 64, eos_token_id=151935))
model.generation_config.eos_token_id = 151935

class Tokenizer:  # the engine reads ids only; no text is needed here
    eos_token_id = 151935
    pad_token_id = 0
    def decode(self, ids, skip_special_tokens=True):
        return ""

engine = HFEngine(model, Tokenizer(), decode=decode)
# never sample EOS, so every completion runs to max_new_tokens
bias = torch.zeros(151936); bias[151935] = -1e9
model.lm_head.register_forward_hook(lambda m, i, out: out + bias)
before = start_peak()
(group,) = engine.generate([[5, 6, 7, 8]], SamplingConfig(n=2, max_new_tokens=steps, seed=0))
peak = high_water_kib()
assert all(len(c.token_ids) == steps for c in group)
print(json.dumps({"kib": peak - before}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("decode", ["loop", "generate"])
def test_generation_memory_per_token_is_its_kv_cache(decode: str) -> None:
    """2 rows on Qwen's 151,936-row vocabulary: a float32 vocabulary row is 594 KiB per row and
    token, the KV cache of this model 1 KiB. Measured from the model built to the end of
    generation: 3-10 KiB per generated token and row, with 20-45 MiB that come and go between
    identical runs (the least of two runs per length is taken). Keeping any vocabulary-sized
    tensor per token would cost at least a quarter of a row (bf16 logits: half a row)."""
    short, long = 32, 256
    growth = (
        peak_kib(_SCRIPT, long, decode, repeats=2) - peak_kib(_SCRIPT, short, decode, repeats=2)
    ) / (2 * (long - short))
    assert growth <= 594 / 4, f"{growth:.1f} KiB per generated token and row"
