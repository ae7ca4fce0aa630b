"""Rollouts with transformers models in the trainer's process: the engine for machines without vLLM.

By default completions come from a decode loop over the model's forward with a preallocated
(static) KV cache, each distinct prompt prefilled once for its whole group; ``decode="generate"``
uses ``model.generate`` instead (and models whose cache is not plain full attention always do).
Both sample from the same warped distribution (``warp_logits``) and report its logprobs. The
loop keeps each call's keys/values for the next one: the next turn of a multi-turn episode
(its history plus the environment's reply) prefills only its new tokens.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from grpo_train.rollout.base import Completion, GroupDone, SamplingConfig, check_prompts

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


#: At most this many bytes of keys/values are kept from one call for the next (``_keep``).
KEEP_BYTES = 1 << 30

logger = logging.getLogger(__name__)


class HFEngine:
    """A rollout engine on a transformers model: batched, left-padded, stops at EOS.

    Give it the trainer's policy module to share it (``sync_weights`` is then free), or a model
    path to load a separate copy (``sync_weights`` copies the trainer's weights into it).
    """

    name = "hf"

    def __init__(
        self,
        model: PreTrainedModel | str | Path,
        tokenizer: PreTrainedTokenizerBase | None = None,
        *,
        dtype: str = "auto",
        device: str = "auto",
        max_batch_size: int = 64,
        decode: Literal["loop", "generate"] = "loop",
    ) -> None:
        """Wrap ``model`` (a module or a model folder / hub id) for generation.

        ``dtype`` / ``device`` apply when loading from a path (``"auto"``: see ``load_policy``).
        ``max_batch_size`` caps the sequences (prompts x n) decoded together; larger requests
        run in chunks so memory stays bounded, and a chunk that runs out of accelerator memory
        halves it (``_halve_batch``). ``decode``: ``"loop"`` (the static-cache decode
        loop, see ``_decode_loop``) or ``"generate"`` (``model.generate``); same distribution.
        """
        from grpo_train.models.loading import load_policy

        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if decode not in ("loop", "generate"):
            raise ValueError(f"decode must be 'loop' or 'generate', got {decode!r}")
        self.decode = decode
        if isinstance(model, str | Path):
            self.model, loaded_tok = load_policy(str(model), dtype=dtype, device=device)
            tokenizer = tokenizer or loaded_tok
        else:
            self.model = model
        if tokenizer is None:
            raise ValueError("HFEngine needs the tokenizer when given a model module")
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.last_sync_seconds = 0.0
        # The keys/values of the previous call's sequences, for a next call that extends them
        # (the next turn of an episode): see ``_decode_loop``. Valid for one weights version.
        self._kept: dict[tuple[int, ...], KeptSequence] = {}
        self._kept_version: int | None = None
        eos = self.model.generation_config.eos_token_id
        eos_ids = {tokenizer.eos_token_id} | set(eos if isinstance(eos, list) else [eos])
        self.eos_token_ids = frozenset(int(t) for t in eos_ids if t is not None)
        if not self.eos_token_ids:
            raise ValueError(
                "the tokenizer and model define no EOS token; generation could not stop"
            )
        pad = tokenizer.pad_token_id
        self.pad_token_id = int(pad) if pad is not None else min(self.eos_token_ids)

    def generate(
        self,
        prompt_token_ids: Sequence[Sequence[int]],
        sampling: SamplingConfig,
        on_done: GroupDone | None = None,
    ) -> list[list[Completion]]:
        """Sample ``sampling.n`` completions per prompt, with their sampling logprobs.

        Rows are decoded in chunks of ``max_batch_size``; ``on_done`` hears of each prompt
        whose group is complete after the chunk that finished it.
        """
        import torch

        embeddings: Any = self.model.get_input_embeddings()
        vocab = int(embeddings.weight.shape[0])
        prompts = check_prompts(prompt_token_ids, vocab)
        # One row per (prompt, sample), a prompt's rows adjacent: the decode loop prefills each
        # prompt once for its rows; for generate, repeating the prompt instead of
        # num_return_sequences also covers greedy decoding (which refuses it above 1).
        rows = [(i, prompt) for i, prompt in enumerate(prompts) for _ in range(sampling.n)]
        results: list[list[Completion]] = [[] for _ in prompts]
        version = self._weights_version()
        previous = self._kept if self._kept_version == version else {}
        self._kept, self._kept_version = {}, version
        rng = torch.random.fork_rng() if sampling.seed is not None else contextlib.nullcontext()
        with rng, _eval_mode(self.model), torch.inference_mode():
            if sampling.seed is not None:
                torch.manual_seed(sampling.seed)
            start = 0
            while start < len(rows):
                chunk = rows[start : start + self.max_batch_size]
                try:
                    completions = self._generate_batch(chunk, sampling, previous)
                except torch.OutOfMemoryError as err:
                    if len(chunk) == 1:
                        raise _one_row_out_of_memory(chunk[0][1], sampling, err) from err
                    out_of_memory = True  # retried below: err's traceback holds the chunk
                else:
                    out_of_memory = False
                if out_of_memory:
                    self._halve_batch(len(chunk))
                    continue
                start += len(chunk)
                for completion in completions:
                    results[completion.prompt_index].append(completion)
                # A prompt's rows are adjacent: the chunk completed every prompt it touched
                # but possibly its last one, whose rows may go on in the next chunk.
                for index in sorted({i for i, _ in chunk}):
                    if len(results[index]) == sampling.n and on_done is not None:
                        on_done(index, results[index])
        return results

    def _halve_batch(self, failed_rows: int) -> None:
        """Go on with half the rows per chunk after ``failed_rows`` ran out of accelerator memory.

        The static KV cache and the logits of a chunk grow with its rows; what fits depends on
        the card, the model and the completion length, so a GPU run that meets its limit goes
        on with half the rows (for the rest of this engine's life) instead of losing the run.
        """
        import torch

        self.max_batch_size = max(1, failed_rows // 2)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        logger.warning(
            "hf engine: out of memory decoding %d sequences together; going on with at most %d "
            "(hf_max_batch_size starts there)",
            failed_rows,
            self.max_batch_size,
        )

    def _weights_version(self) -> int:
        """Return a number that changes whenever the model's parameters are written in place.

        Every in-place write (an optimizer step, ``load_state_dict``) bumps a tensor's version
        counter, so kept keys/values are never used with other weights than the ones that made
        them, also when the engine shares the trainer's module (no ``sync_weights`` call).
        """
        return sum(int(p._version) for p in self.model.parameters())

    def _generate_batch(
        self,
        rows: list[tuple[int, list[int]]],
        sampling: SamplingConfig,
        previous: Mapping[tuple[int, ...], KeptSequence],
    ) -> list[Completion]:
        """Decode a batch of (prompt index, prompt) rows; cut each at its first EOS."""
        decoded = self._decode_loop(rows, sampling, previous) if self.decode == "loop" else None
        new_tokens, logprobs = decoded or self._decode_generate(rows, sampling)  # (B, T) each
        completions = []
        for row, (prompt_index, _) in enumerate(rows):
            ids = new_tokens[row].tolist()
            length = self._length(ids)
            token_ids = tuple(ids[:length])
            completions.append(
                Completion(
                    prompt_index=prompt_index,
                    text=str(self.tokenizer.decode(list(token_ids), skip_special_tokens=True)),
                    token_ids=token_ids,
                    logprobs=tuple(logprobs[row, :length].tolist()),
                    finish_reason="stop" if token_ids[-1] in self.eos_token_ids else "length",
                )
            )
        return completions

    def _decode_loop(
        self,
        rows: list[tuple[int, list[int]]],
        sampling: SamplingConfig,
        previous: Mapping[tuple[int, ...], KeptSequence] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Sample with a decode loop over the model's forward; None if the model's cache can't.

        Why a loop of our own instead of ``model.generate``: profiling the trainer benchmark's
        decode (transformers 5.19, CPU) showed half of ``generate``'s time in ``torch.cat``:
        its ``DynamicCache`` re-copies every layer's keys and values at every step (O(T^2)
        copying), and each prompt is prefilled once per sample (``n`` times). Here each
        distinct prompt is prefilled once, its keys/values are copied into one row per sample
        of a preallocated ``StaticCache`` (written in place afterwards), and the sampling
        logprob is one gather from the warped log-softmax. Returns (B, T) tokens and logprobs,
        rows past their EOS padded, like ``model.generate``.

        A prompt that extends a sequence of the previous call (``previous``: the next turn of a
        multi-turn episode is its history plus the environment's reply) starts from that
        sequence's keys/values and prefills only the new tokens, instead of the whole history
        again; each row's sequence is kept for the next call in turn.
        """
        import torch
        from transformers.cache_utils import DynamicCache, StaticCache, StaticLayer

        from grpo_train.models.hf_compat import cache_keyword

        model: Any = self.model
        device = next(model.parameters()).device
        # Rows come grouped: each run of equal prompt indices is one prompt's samples.
        firsts = [r for r in range(len(rows)) if r == 0 or rows[r][0] != rows[r - 1][0]]
        unique = [rows[r][1] for r in firsts]
        counts = torch.tensor([b - a for a, b in zip(firsts, [*firsts[1:], len(rows)])])
        expand = torch.repeat_interleave(torch.arange(len(unique)), counts).to(device)  # (B,)
        kept = [_longest_kept_prefix(previous or {}, prompt) for prompt in unique]
        prefix = max((len(k.token_ids) for k in kept if k is not None), default=0)
        ids, mask = left_pad(
            [
                prompt[len(k.token_ids) if k else 0 :]
                for prompt, k in zip(unique, kept, strict=True)
            ],
            self.pad_token_id,
        )
        ids = ids.to(device)  # (U, S): what is prefilled now
        # (U, P + S): each row's kept prefix right-aligned in the first P columns, then its new
        # tokens right-aligned in the last S; the positions count the real tokens only.
        mask = torch.cat([_prefix_mask(kept, prefix), mask], dim=1).to(device)
        steps, batch = sampling.max_new_tokens, len(rows)
        width = mask.shape[1]
        cache = StaticCache(config=model.config, max_cache_len=width + steps)
        if not all(type(layer) is StaticLayer for layer in cache.layers):
            return None  # sliding-window / hybrid / recurrent layers: let generate handle them
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)  # as in training (micro_batches._pad)
        prefill = DynamicCache(config=model.config)
        if prefix:
            for index, (keys, values) in enumerate(_stack_prefixes(kept, prefix, device)):
                prefill.update(keys, values, index)
        out = model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions[:, prefix:],
            use_cache=True,
            logits_to_keep=1,
            **{cache_keyword(model): prefill},
        )
        layers: list[Any] = list(prefill.layers)  # plain key/value layers, checked above
        for index, layer in enumerate(layers):  # (U, H, W, D) -> (B, H, W, D)
            cache.update(
                layer.keys.index_select(0, expand), layer.values.index_select(0, expand), index
            )
        logits = out.logits[:, -1, :].index_select(0, expand)  # (B, V)
        attention = torch.zeros((batch, width + steps), dtype=mask.dtype, device=device)
        attention[:, :width] = mask.index_select(0, expand)
        position = positions[:, -1].index_select(0, expand)  # (B,)
        tokens = torch.full((batch, steps), self.pad_token_id, dtype=torch.long, device=device)
        logprobs = torch.zeros((batch, steps), dtype=torch.float32, device=device)
        eos = torch.tensor(sorted(self.eos_token_ids), device=device)
        done = torch.zeros(batch, dtype=torch.bool, device=device)
        for t in range(steps):
            token, logprob = sample_tokens(logits, sampling)  # (B,), (B,)
            token = token.masked_fill(done, self.pad_token_id)
            tokens[:, t], logprobs[:, t] = token, logprob
            done |= torch.isin(token, eos)
            if t == steps - 1 or bool(done.all()):
                tokens, logprobs = tokens[:, : t + 1].cpu(), logprobs[:, : t + 1].cpu()
                self._keep(rows, tokens, attention, width, cache)
                return tokens, logprobs
            attention[:, width + t] = 1
            position = position + 1
            logits = model(
                input_ids=token.unsqueeze(1),
                attention_mask=attention,
                position_ids=position.unsqueeze(1),
                use_cache=True,
                logits_to_keep=1,
                **{cache_keyword(model): cache},
            ).logits[:, -1, :]
        raise AssertionError("unreachable: max_new_tokens >= 1")

    def _length(self, ids: Sequence[int]) -> int:
        """Return how many of a row's decoded ids are its completion: up to its first EOS."""
        stop = next((t for t, tok in enumerate(ids) if tok in self.eos_token_ids), None)
        return len(ids) if stop is None else stop + 1

    def _keep(
        self,
        rows: list[tuple[int, list[int]]],
        tokens: torch.Tensor,
        attention: torch.Tensor,
        width: int,
        cache: Any,
    ) -> None:
        """Keep each row's keys/values (prompt + its sampled ids but the last) for the next call.

        The last sampled id has no keys/values yet (it was never fed back); a next prompt that
        extends the row feeds it with its own new tokens.
        """
        import torch

        per_token = sum(
            2 * layer.keys[0, :, 0].numel() * layer.keys.element_size() for layer in cache.layers
        )
        if per_token * int(attention[:, :width].sum()) > KEEP_BYTES:
            return  # too large to hold between calls: the next call prefills as before
        for row, (_, prompt) in enumerate(rows):
            ids = tokens[row].tolist()
            length = self._length(ids)
            key = (*prompt, *ids[: length - 1])
            if key in self._kept:
                continue  # the same sequence, kept already (greedy rows of one prompt)
            columns = torch.cat(
                [
                    attention[row, :width].nonzero().squeeze(1),
                    torch.arange(width, width + length - 1, device=attention.device),
                ]
            )
            self._kept[key] = KeptSequence(
                key,
                [layer.keys[row].index_select(1, columns) for layer in cache.layers],
                [layer.values[row].index_select(1, columns) for layer in cache.layers],
            )

    def _decode_generate(
        self, rows: list[tuple[int, list[int]]], sampling: SamplingConfig
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample with ``model.generate``; return (B, T) new tokens and their sampling logprobs."""
        from transformers import GenerationConfig, LogitsProcessorList

        device = next(self.model.parameters()).device
        input_ids, attention_mask = left_pad([prompt for _, prompt in rows], self.pad_token_id)
        recorder = _LogprobRecorder(sampling)
        # A fresh config so the checkpoint's own sampling defaults (top_k=50 in many) never apply:
        # the recorder applies temperature / top-k / top-p itself and transformers adds nothing.
        neutral = {} if sampling.greedy else {"temperature": 1.0, "top_k": 0, "top_p": 1.0}
        config = GenerationConfig(
            do_sample=not sampling.greedy,
            max_new_tokens=sampling.max_new_tokens,
            eos_token_id=sorted(self.eos_token_ids),
            pad_token_id=self.pad_token_id,
            **neutral,
        )
        sequences = self.model.generate(  # type: ignore[operator]
            input_ids=input_ids.to(device),
            attention_mask=attention_mask.to(device),
            generation_config=config,
            logits_processor=LogitsProcessorList([recorder]),
        )
        new_tokens = sequences[:, input_ids.shape[1] :].cpu()  # (B, T)
        return new_tokens, recorder.finish(new_tokens)

    def shares_weights(self, model: torch.nn.Module) -> bool:
        """Tell whether this engine generates with ``model`` (or the base inside a PEFT model)."""
        wrapper: Any = model
        base = wrapper.get_base_model() if hasattr(wrapper, "get_base_model") else model
        return model is self.model or base is self.model

    def sync_weights(self, state: Mapping[str, torch.Tensor]) -> None:
        """Copy the exported weights in; ``{}`` (the engine shares the trainer's module) is free."""
        start = time.perf_counter()
        if state:
            missing, unexpected = self.model.load_state_dict(state, strict=False)  # type: ignore[operator]
            tied = set(getattr(self.model, "_tied_weights_keys", None) or ())
            missing = [k for k in missing if k not in tied and k != "lm_head.weight"]
            if missing or unexpected:
                raise ValueError(
                    f"sync_weights: the trainer's model does not match the engine's "
                    f"(missing {missing[:5]}, unexpected {unexpected[:5]})"
                )
        self.last_sync_seconds = time.perf_counter() - start

    def sleep(self, level: Literal[1, 2] = 1) -> bool:
        """Do nothing: the HF engine keeps no memory of its own between generations."""
        return False

    def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """Do nothing (see ``sleep``)."""

    def close(self) -> None:
        """Drop the reference to the model (the trainer may still hold it)."""
        self.model = None  # type: ignore[assignment]
        self._kept = {}


@dataclass(frozen=True)
class KeptSequence:
    """A sequence the engine has keys/values for: its ids and, per layer, (H, L, D) tensors."""

    token_ids: tuple[int, ...]
    keys: list[torch.Tensor]
    values: list[torch.Tensor]


def _longest_kept_prefix(
    kept: Mapping[tuple[int, ...], KeptSequence], prompt: Sequence[int]
) -> KeptSequence | None:
    """Return the longest kept sequence that ``prompt`` extends by one token or more, or None.

    >>> kept = {k: KeptSequence(k, [], []) for k in [(1, 2), (1, 2, 3)]}
    >>> _longest_kept_prefix(kept, [1, 2, 3, 4]).token_ids
    (1, 2, 3)
    >>> _longest_kept_prefix(kept, [1, 2, 3]).token_ids  # a prompt must add a token
    (1, 2)
    >>> _longest_kept_prefix(kept, [2, 2, 3]) is None
    True
    """
    best = None
    for ids, sequence in kept.items():
        longer = best is None or len(ids) > len(best.token_ids)
        if longer and len(ids) < len(prompt) and tuple(prompt[: len(ids)]) == ids:
            best = sequence
    return best


def _prefix_mask(kept: Sequence[KeptSequence | None], prefix: int) -> torch.Tensor:
    """(U, prefix) attention mask: 1 on each row's kept tokens, right-aligned."""
    import torch

    mask = torch.zeros((len(kept), prefix), dtype=torch.long)
    for row, sequence in enumerate(kept):
        if sequence is not None:
            mask[row, prefix - len(sequence.token_ids) :] = 1
    return mask


def _stack_prefixes(
    kept: Sequence[KeptSequence | None], prefix: int, device: Any
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer, the rows' kept keys and values as (U, H, prefix, D), right-aligned."""
    import torch

    some = next(k for k in kept if k is not None)
    for layer in range(len(some.keys)):
        heads, _, dim = some.keys[layer].shape
        shape = (len(kept), heads, prefix, dim)
        keys = torch.zeros(shape, dtype=some.keys[layer].dtype, device=device)
        values = torch.zeros(shape, dtype=some.values[layer].dtype, device=device)
        for row, sequence in enumerate(kept):
            if sequence is not None:
                length = len(sequence.token_ids)
                keys[row, :, prefix - length :] = sequence.keys[layer]
                values[row, :, prefix - length :] = sequence.values[layer]
        yield keys, values


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token lists into (B, W) ``input_ids`` and ``attention_mask`` (1 on real tokens).

    >>> left_pad([[5, 6], [7]], pad_id=0)
    (tensor([[5, 6],
            [0, 7]]), tensor([[1, 1],
            [0, 1]]))
    """
    import torch

    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        input_ids[row, width - len(prompt) :] = torch.tensor(list(prompt), dtype=torch.long)
        attention_mask[row, width - len(prompt) :] = 1
    return input_ids, attention_mask


def warp_logits(logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """Return the (B, V) scores samples are drawn from: logits / T, then top-k, then top-p.

    Removed tokens get ``-inf``. Top-p keeps the smallest set of most likely tokens whose
    probability reaches ``top_p`` (a token is dropped when the tokens ranked above it already
    hold ``top_p``; the most likely one always stays). Greedy (``temperature == 0``) leaves the
    logits as they are: its logprobs are the model's plain distribution (module doc of base.py).
    """
    import torch

    if sampling.greedy:
        return logits
    scores = logits / sampling.temperature if sampling.temperature != 1.0 else logits
    if 0 < sampling.top_k < scores.shape[-1]:
        kth = torch.topk(scores, sampling.top_k, dim=-1).values[:, -1:]  # (B, 1)
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if sampling.top_p < 1.0:
        ordered, order = torch.sort(scores, dim=-1, descending=True)
        probs = torch.softmax(ordered, dim=-1)
        mass_before = torch.cumsum(probs, dim=-1) - probs  # (B, V), in sorted order
        drop_sorted = mass_before >= sampling.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)  # original order
        scores = scores.masked_fill(drop, float("-inf"))
    return scores


def sample_tokens(
    logits: torch.Tensor, sampling: SamplingConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row of (B, V) ``logits``; return the tokens (B,) and their logprobs (B,).

    The logprob is the token's log-probability under the distribution it was drawn from
    (``log_softmax(warp_logits(...))``), the engines' shared definition (base.py).
    """
    import torch

    log_probs = torch.log_softmax(warp_logits(logits.float(), sampling), dim=-1)  # (B, V)
    if sampling.greedy:
        tokens = log_probs.argmax(dim=-1)
    else:
        tokens = inverse_cdf_sample(log_probs.exp(), torch.rand(logits.shape[0], 1))
    return tokens, log_probs.gather(1, tokens.unsqueeze(1)).squeeze(1)


def inverse_cdf_sample(probs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """Draw token ``i`` of each row with probability ``probs[i]`` from one uniform per row.

    ``probs`` (B, V) need not be normalised; ``uniform`` (B, 1) holds draws from [0, 1). The token
    is the first whose cumulative probability exceeds ``u * total``, so a zero-probability token
    is never drawn. Why not ``torch.multinomial``: on CPU it draws one exponential variate per
    vocabulary entry (B x V per step; 20% of the decode time of the benchmark's tiny model with a
    512-token vocabulary, and it grows with the vocabulary), where this needs B uniforms and a
    cumulative sum. The sum is in float64 so that tokens of probability ~1e-8 keep their odds.

    >>> import torch
    >>> probs = torch.tensor([[0.2, 0.0, 0.8], [0.2, 0.0, 0.8]])
    >>> inverse_cdf_sample(probs, torch.tensor([[0.1], [0.2]]))
    tensor([0, 2])
    """
    import torch

    cdf = torch.cumsum(probs.double(), dim=-1)  # (B, V)
    total = cdf[:, -1:]  # (B, 1)
    if not bool(torch.isfinite(total).all() and (total > 0).all()):
        raise ValueError("cannot sample: the model produced NaN/inf or all-zero probabilities")
    target = uniform.to(cdf.device, cdf.dtype) * total
    tokens = torch.searchsorted(cdf, target, right=True).squeeze(1)
    return tokens.clamp(max=probs.shape[-1] - 1)


class _LogprobRecorder:
    """A logits processor for ``model.generate``: warps the scores and records sampling logprobs.

    transformers appends its own warpers after user processors and returns only the scores, not
    which token was drawn; so this processor does the warping itself (``warp_logits``) and, at
    step t, reads the token drawn at step t-1 from ``input_ids`` to gather its logprob. Memory
    stays O(batch x vocab) instead of ``output_scores``' O(batch x vocab x T).
    """

    def __init__(self, sampling: SamplingConfig) -> None:
        self.sampling = sampling
        self.previous: torch.Tensor | None = None  # (B, V) logprobs of the last step
        self.gathered: list[torch.Tensor] = []  # T-1 tensors of shape (B,)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """Warp ``scores`` (B, V) and remember their log-softmax."""
        import torch

        if self.previous is not None:
            self.gathered.append(self.previous.gather(1, input_ids[:, -1:]).squeeze(1).cpu())
        scores = warp_logits(scores, self.sampling)
        self.previous = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def finish(self, new_tokens: torch.Tensor) -> torch.Tensor:
        """Logprobs (B, T) of the generated tokens, given the final (B, T) token matrix."""
        import torch

        if self.previous is None:
            return torch.zeros(new_tokens.shape, dtype=torch.float32)
        last = new_tokens[:, -1:].to(self.previous.device)
        steps = [*self.gathered, self.previous.gather(1, last).squeeze(1).cpu()]
        return torch.stack(steps, dim=1)


@contextlib.contextmanager
def _eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """Put the model in eval mode (no dropout, KV cache on) and restore its mode afterwards."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def _one_row_out_of_memory(
    prompt: Sequence[int], sampling: SamplingConfig, err: BaseException
) -> BaseException:
    """Build the error of a single sequence that does not fit: its size, then torch's words."""
    import torch

    return torch.OutOfMemoryError(
        f"hf engine: out of memory decoding a single sequence of a {len(prompt)}-token prompt "
        f"and up to {sampling.max_new_tokens} new tokens: {err}"
    )
