"""Eval throughput: our runner vs raw ``vllm.LLM.generate`` vs a plain ``transformers`` loop.

SmolLM2-135M-Instruct (the embedded default) greedily answers the first ``--prompts`` GSM8K test
questions with at most ``--max_tokens`` new tokens, three ways, on the same token ids:

1. raw vLLM: ``llm.generate`` on pre-tokenized prompts, nothing else;
2. ours: ``grpo_train.eval.evaluate`` on the same running engine (so both share one ``vllm.LLM``
   after one untimed warm-up call): chat template + tokenization, generation, scoring with
   ``math/gsm8k-v0``, writing ``samples.jsonl`` and ``summary.json``;
3. transformers: ``model.generate`` over left-padded batches (run first, before vLLM starts).

Raw vLLM and ours alternate ``--repeats`` times; each reports its median wall time. Target: ours
within 10 % of raw vLLM. Prefix caching is off so that neither method reuses the other's
prefill. Run from the repository root:

    .venv/bin/python benchmarks/eval_bench.py            # ~4 min on 2 CPU cores
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# A folder with GSM8K's test.jsonl (the public openai/grade-school-math release); the 30-row test
# fixture is the fallback so the script runs on a fresh clone.
GSM8K_DIR = Path(os.environ.get("GRPO_GSM8K_DIR", REPO / "tests/grpo_envs/fixtures/gsm8k"))


@dataclass(frozen=True)
class Run:
    """One timed run: wall seconds, new tokens, completion texts, slice accuracy (ours only)."""

    seconds: float
    tokens: int
    texts: list[str]
    accuracy: float = 0.0


def _parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--max_tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--hf_batch", type=int, default=32, help="transformers batch size")
    p.add_argument("--skip_hf", action="store_true")
    p.add_argument("--data", default=str(GSM8K_DIR), help="folder with test.jsonl")
    return p.parse_args()


def main() -> None:
    args = _parse_args()

    from transformers import AutoTokenizer
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    import grpo_envs
    from grpo_envs.types import Sample
    from grpo_train.episodes.prompts import encode_prompt
    from grpo_train.eval.records import SampleStore
    from grpo_train.eval.runner import EvalTask, evaluate
    from grpo_train.models.loading import default_model_path
    from grpo_train.rollout.base import SamplingConfig
    from grpo_train.rollout.vllm_engine import VLLMEngine

    model_path = str(default_model_path())
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    env = grpo_envs.make("math/gsm8k-v0", data_path=args.data)

    rows = env.dataset("test").select(range(args.prompts))
    samples = [Sample.from_row(r) for r in rows]
    prompt_ids = [encode_prompt(tokenizer, s).ids for s in samples]
    sampling = SamplingConfig(n=1, temperature=0.0, max_new_tokens=args.max_tokens)

    # transformers first, before any vLLM process exists, so the two never share the 2 cores.
    hf_time = hf_tokens = None
    if not args.skip_hf:
        hf_time, hf_tokens = _hf_loop(model_path, tokenizer, prompt_ids, args)
        print(f"transformers loop: {hf_time:.1f} s, {hf_tokens} new tokens", flush=True)

    # No prefix caching: both methods run the same prompts, and whichever ran second would skip
    # their prefill and look faster than it is.
    engine = VLLMEngine(model_path, seed=0, max_model_len=1024, enable_prefix_caching=False)
    print(
        f"vLLM engine up in {engine.init_seconds:.1f} s; {len(samples)} prompts, "
        f"max {args.max_tokens} new tokens, greedy"
    )
    llm = engine.llm
    params = SamplingParams(n=1, temperature=0.0, max_tokens=args.max_tokens, logprobs=0)
    tokens_prompts = [TokensPrompt(prompt_token_ids=ids) for ids in prompt_ids]
    # Warm-up: the first full-size call pays one-off allocation and kernel set-up costs.
    llm.generate(tokens_prompts, params, use_tqdm=False)

    raw_runs: list[Run] = []
    ours_runs: list[Run] = []

    def run_raw() -> None:
        start = time.perf_counter()
        outs = llm.generate(tokens_prompts, params, use_tqdm=False)
        seconds = time.perf_counter() - start
        texts = [o.outputs[0].text for o in outs]
        raw_runs.append(Run(seconds, sum(len(o.outputs[0].token_ids) for o in outs), texts))

    def run_ours() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            summary = evaluate(
                engine, tokenizer, [EvalTask("gsm8k", env)], limit=args.prompts,
                sampling=sampling, out_dir=Path(tmp), progress=False, model=model_path,
            )  # fmt: skip
            seconds = time.perf_counter() - start
            recs = SampleStore(Path(tmp) / "samples.jsonl").records()
        tokens = sum(r.num_tokens for r in recs)
        texts = [r.completion for r in recs]
        ours_runs.append(Run(seconds, tokens, texts, summary["gsm8k"].accuracy))

    for rep in range(args.repeats):
        # Alternate which goes first so slow drift on a shared machine hits both alike.
        for run in (run_raw, run_ours) if rep % 2 == 0 else (run_ours, run_raw):
            run()
    engine.close()
    print(
        f"vLLM runs (s): raw {[round(r.seconds, 2) for r in raw_runs]}, "
        f"ours {[round(r.seconds, 2) for r in ours_runs]}",
        flush=True,
    )

    _report(raw_runs, ours_runs, hf_time, hf_tokens)


def _report(
    raw_runs: list[Run], ours_runs: list[Run], hf_time: float | None, hf_tokens: int | None
) -> None:
    """Print the table (medians), our overhead over raw vLLM and the completions' agreement."""
    raw_times = [r.seconds for r in raw_runs]
    ours_times = [r.seconds for r in ours_runs]
    raw, ours = statistics.median(raw_times), statistics.median(ours_times)
    raw_tokens, ours_tokens = raw_runs[-1].tokens, ours_runs[-1].tokens
    raw_texts, ours_texts = raw_runs[-1].texts, ours_runs[-1].texts
    accuracy = ours_runs[-1].accuracy
    same = sum(a == b for a, b in zip(raw_texts, ours_texts))
    print()
    print("| method | wall s (median) | new tokens | tokens/s | vs raw vLLM |")
    print("|---|---|---|---|---|")
    print(f"| raw vllm.LLM.generate | {raw:.2f} | {raw_tokens} | {raw_tokens / raw:.1f} | 1.00x |")
    print(
        f"| grpo eval runner (vLLM engine) | {ours:.2f} | {ours_tokens} | "
        f"{ours_tokens / ours:.1f} | {ours / raw:.2f}x |"
    )
    if hf_time is not None and hf_tokens is not None:
        print(
            f"| transformers generate loop | {hf_time:.2f} | {hf_tokens} | "
            f"{hf_tokens / hf_time:.1f} | {hf_time / raw:.2f}x |"
        )
    overhead = 100 * (ours - raw) / raw
    print(
        f"\nruns: raw {[round(t, 2) for t in raw_times]}, ours {[round(t, 2) for t in ours_times]}"
    )
    print(
        f"our overhead over raw vLLM: {overhead:+.1f}% (target < 10%): "
        f"{'PASS' if overhead < 10 else 'FAIL'}"
    )
    print(
        f"identical greedy completions (ours vs raw): {same}/{len(raw_texts)}; "
        f"GSM8K accuracy of the slice: {100 * accuracy:.1f}%"
    )


def _hf_loop(model_path, tokenizer, prompt_ids, args):
    """Greedy ``model.generate`` over left-padded batches; returns (seconds, new tokens)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    total_new = 0
    start = time.perf_counter()
    with torch.inference_mode():
        for lo in range(0, len(prompt_ids), args.hf_batch):
            batch = prompt_ids[lo : lo + args.hf_batch]
            width = max(len(x) for x in batch)
            ids = torch.tensor([[pad] * (width - len(x)) + x for x in batch])
            mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in batch])
            out = model.generate(
                input_ids=ids, attention_mask=mask, max_new_tokens=args.max_tokens,
                do_sample=False, pad_token_id=pad,
            )  # fmt: skip
            new = out[:, width:]
            # Count each row up to and including its first EOS, like the engines do.
            for row in new.tolist():
                n = len(row)
                if tokenizer.eos_token_id in row:
                    n = row.index(tokenizer.eos_token_id) + 1
                total_new += n
    return time.perf_counter() - start, total_new


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
