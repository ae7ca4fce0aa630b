"""Rollouts with transformers' ``model.generate``: the engine for machines without vLLM."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grpo_train.rollout.base import Completion, SamplingConfig, check_prompts
from grpo_train.rollout.weights import checkpoint_state_dict

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


class HFEngine:
    """A rollout engine on ``model.generate``: batched, left-padded, stops at EOS.

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
    ) -> None:
        """Wrap ``model`` (a module or a model folder / hub id) for generation.

        ``dtype`` / ``device`` apply when loading from a path (``"auto"``: see ``load_policy``).
        ``max_batch_size`` caps the sequences (prompts x n) decoded together; larger requests
        run in chunks so memory stays bounded.
        """
        from grpo_train.models import load_policy

        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
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
        self, prompt_token_ids: Sequence[Sequence[int]], sampling: SamplingConfig
    ) -> list[list[Completion]]:
        """Sample ``sampling.n`` completions per prompt, with their sampling logprobs."""
        import torch

        embeddings: Any = self.model.get_input_embeddings()
        vocab = int(embeddings.weight.shape[0])
        prompts = check_prompts(prompt_token_ids, vocab)
        # One row per (prompt, sample): repeating the prompt instead of num_return_sequences
        # also covers greedy decoding, where transformers refuses num_return_sequences > 1.
        rows = [(i, prompt) for i, prompt in enumerate(prompts) for _ in range(sampling.n)]
        results: list[list[Completion]] = [[] for _ in prompts]
        rng = torch.random.fork_rng() if sampling.seed is not None else contextlib.nullcontext()
        with rng, _eval_mode(self.model), torch.inference_mode():
            if sampling.seed is not None:
                torch.manual_seed(sampling.seed)
            for start in range(0, len(rows), self.max_batch_size):
                for completion in self._generate_batch(
                    rows[start : start + self.max_batch_size], sampling
                ):
                    results[completion.prompt_index].append(completion)
        return results

    def _generate_batch(
        self, rows: list[tuple[int, list[int]]], sampling: SamplingConfig
    ) -> list[Completion]:
        """Decode a left-padded batch of (prompt index, prompt) rows; cut each at its first EOS."""
        import torch
        from transformers import GenerationConfig, LogitsProcessorList

        device = next(self.model.parameters()).device
        prompts = [prompt for _, prompt in rows]
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            input_ids[row, width - len(prompt) :] = torch.tensor(prompt)
            attention_mask[row, width - len(prompt) :] = 1
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
        new_tokens = sequences[:, width:].cpu()  # (B, T)
        logprobs = recorder.finish(new_tokens)  # (B, T)
        completions = []
        for row in range(len(prompts)):
            ids = new_tokens[row].tolist()
            stop = next((t for t, tok in enumerate(ids) if tok in self.eos_token_ids), None)
            length = len(ids) if stop is None else stop + 1
            token_ids = tuple(ids[:length])
            completions.append(
                Completion(
                    prompt_index=rows[row][0],
                    text=str(self.tokenizer.decode(list(token_ids), skip_special_tokens=True)),
                    token_ids=token_ids,
                    logprobs=tuple(logprobs[row, :length].tolist()),
                    finish_reason="length" if stop is None else "stop",
                )
            )
        return completions

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Copy the trainer's weights in; free when the engine shares the trainer's module."""
        start = time.perf_counter()
        wrapper: Any = model
        base = wrapper.get_base_model() if hasattr(wrapper, "get_base_model") else model
        if model is not self.model and base is not self.model:
            state = checkpoint_state_dict(model)
            missing, unexpected = self.model.load_state_dict(state, strict=False)  # type: ignore[operator]
            tied = set(getattr(self.model, "_tied_weights_keys", None) or ())
            missing = [k for k in missing if k not in tied and k != "lm_head.weight"]
            if missing or unexpected:
                raise ValueError(
                    f"sync_weights: the trainer's model does not match the engine's "
                    f"(missing {missing[:5]}, unexpected {unexpected[:5]})"
                )
        self.last_sync_seconds = time.perf_counter() - start

    def close(self) -> None:
        """Drop the reference to the model (the trainer may still hold it)."""
        self.model = None  # type: ignore[assignment]


class _LogprobRecorder:
    """A logits processor that applies temperature / top-k / top-p and records the sampling logprob.

    transformers appends its own warpers after user processors and returns only the scores, not
    which token was drawn; so this processor does the warping itself (with transformers' warper
    classes) and, at step t, reads the token drawn at step t-1 from ``input_ids`` to gather its
    logprob. Memory stays O(batch x vocab) instead of ``output_scores``' O(batch x vocab x T).
    """

    def __init__(self, sampling: SamplingConfig) -> None:
        from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

        self.warpers: list[object] = []
        if not sampling.greedy:
            if sampling.temperature != 1.0:
                self.warpers.append(TemperatureLogitsWarper(sampling.temperature))
            if sampling.top_k > 0:
                self.warpers.append(TopKLogitsWarper(sampling.top_k))
            if sampling.top_p < 1.0:
                self.warpers.append(TopPLogitsWarper(sampling.top_p))
        self.previous: torch.Tensor | None = None  # (B, V) logprobs of the last step
        self.gathered: list[torch.Tensor] = []  # T-1 tensors of shape (B,)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """Warp ``scores`` (B, V) and remember their log-softmax."""
        import torch

        if self.previous is not None:
            self.gathered.append(self.previous.gather(1, input_ids[:, -1:]).squeeze(1).cpu())
        for warper in self.warpers:
            scores = warper(input_ids, scores)  # type: ignore[operator]
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
