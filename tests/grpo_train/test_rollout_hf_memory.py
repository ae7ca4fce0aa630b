"""The hf engine's memory grows with its KV cache, not with the vocabulary, per generated token."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

_SCRIPT = r"""
import json, resource, sys, torch
from transformers import Qwen3Config, Qwen3ForCausalLM
from grpo_train.rollout.base import SamplingConfig
from grpo_train.rollout.hf import HFEngine

steps, decode = int(sys.argv[1]), sys.argv[2]
torch.manual_seed(0)
torch.set_num_threads(1)
config = Qwen3Config(vocab_size=151936, hidden_size=128, intermediate_size=384,
                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                     head_dim=32, max_position_embeddings=steps + 64, tie_word_embeddings=True,
                     eos_token_id=151935)
model = Qwen3ForCausalLM(config)
model.generation_config.eos_token_id = 151935

class Tokenizer:  # the engine reads ids only; no text is needed here
    eos_token_id = 151935
    pad_token_id = 0
    def decode(self, ids, skip_special_tokens=True):
        return ""

def rss_kib():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))

engine = HFEngine(model, Tokenizer(), decode=decode)
# never sample EOS, so every completion runs to max_new_tokens
bias = torch.zeros(151936); bias[151935] = -1e9
model.lm_head.register_forward_hook(lambda m, i, out: out + bias)
before = rss_kib()
(group,) = engine.generate([[5, 6, 7, 8]], SamplingConfig(n=2, max_new_tokens=steps, seed=0))
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
assert all(len(c.token_ids) == steps for c in group)
print(json.dumps({"kib": peak - before}))
"""


def _peak_kib(steps: int, decode: str) -> float:
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(steps), decode],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    return float(json.loads(done.stdout.strip().splitlines()[-1])["kib"])


@pytest.mark.slow
@pytest.mark.parametrize("decode", ["loop", "generate"])
def test_generation_memory_per_token_is_its_kv_cache(decode: str) -> None:
    """2 rows on Qwen's 151,936-row vocabulary: a float32 vocabulary row is 594 KiB per row and
    token; the KV cache of this model is 1 KiB. Allow 8 KiB per generated token and row."""
    short, long = 32, 256
    growth = (_peak_kib(long, decode) - _peak_kib(short, decode)) / (2 * (long - short))
    assert growth <= 8, f"{growth:.1f} KiB per generated token and row"
