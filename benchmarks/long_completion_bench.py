"""Benchmark: peak memory and update time of one GRPO update vs completion length and length mix.

Every variant runs one update (forward, backward and AdamW step over all micro-batches, with the
entropy metric, as ``grpo_train.learner.update.grpo_update`` does it) on the same batch, each
in a fresh subprocess whose peak RSS (``VmHWM``, reset once the model and batch are built) is
measured above the RSS it had then, so that variants do not pollute each other:

* ``previous``: the formula the update used before (the full logits cast to float32, their
  log-softmax kept for the backward), padded micro-batches;
* ``chunked``: ``logprob_head: chunked`` (bitwise ``previous``), padded;
* ``fused``: ``logprob_head: fused`` (the lm_head chunked under recomputation), padded;
* ``default``: the default settings (``logprob_head: auto``, ``packing: auto``: as a single
  process without gradient checkpointing runs, the shared-prompt forward over padded rows, or
  packed rows where those run fewer token positions, ``micro_batches.packing_pays``);
* ``packed``: ``auto`` head on padding-free micro-batches (``packing: on``);
* ``checkpointed``: the default under ``gradient_checkpointing: true`` (one hidden state per
  layer kept, the rest recomputed in the backward; no shared prompt, so rows are packed);
* ``trl``: TRL's ``GRPOTrainer._compute_loss`` on the same padded batch (its own
  ``selective_log_softmax``), backward and the same AdamW step;
* ``liger``: Liger's ``LigerFusedLinearGRPOLoss`` (the fused, chunked lm_head + GRPO loss that
  TRL's ``use_liger_kernel`` used before TRL 1.16 turned that flag into a model-kernel patch),
  from the final hidden states of the same padded batch, ``compiled=False`` (its
  ``torch.compile`` would add minutes of compilation to one update); where ``liger-kernel`` is
  installed (it imports on a CPU without Triton), else the table says so;
* ``liger-head``: ``logprob_head: liger``, the same loss as the update runs it: Liger's loss
  from our ``completion_hidden_states``, plus the gradient-free pass of our fused head that
  gives the old policy's log-probs and the entropy metric;
* ``bound``: the lower bound, computed: gradients + AdamW's two moments (float32) +
  checkpointed activations (one hidden state per layer and token), above the weights (as the
  measured peaks are).

Two tables: (1) vs completion length (1 prompt x 2 completions running to the length, one
micro-batch per completion), with the peak growth per completion token between the two longest
lengths; (2) vs the length mix: a uniform mix and a
skewed one (40x spread between shortest and longest) of the same total tokens, update seconds
and the skewed / uniform ratio (padding costs the skewed mix; packing should not).

    python benchmarks/long_completion_bench.py                   # tiny Qwen3, a few minutes
    python benchmarks/long_completion_bench.py --lengths 512,2048,8192 --smollm   # the full run

The model is a random Qwen3-architecture model (2 layers, hidden 128, Qwen's 151,936-row
vocabulary); ``--smollm`` adds SmolLM2-135M (the embedded default model, 49,152 rows). One
thread per worker (``--threads``): on a shared machine the timings measure the load otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

VARIANTS = (
    "previous",
    "chunked",
    "fused",
    "default",
    "packed",
    "checkpointed",
    "trl",
    "liger",
    "liger-head",
)
PROMPT_TOKENS = 64


def _status_kib(key: str) -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(key))


def _start_peak() -> int:
    """Reset the kernel's high-water mark of the resident set (``VmHWM``) and return the resident
    set now: the peak then counts the update alone, not the model's initialisation, whose
    temporaries (~75 MiB for the tiny model) ``ru_maxrss`` would keep and hide smaller peaks
    under."""
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")
    return _status_kib("VmRSS:")


def tiny_qwen3_config(max_positions: int) -> Any:
    """A 2-layer, hidden-128 Qwen3 with Qwen's full 151,936-row (tied) vocabulary head."""
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=151_936,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
    )


def _model(name: str) -> Any:
    import torch
    from transformers import AutoModelForCausalLM, Qwen3ForCausalLM

    torch.manual_seed(0)
    if name == "tiny-qwen3":
        return Qwen3ForCausalLM(tiny_qwen3_config(40_000)).train()
    from grpo_train.models.loading import default_model_path

    return AutoModelForCausalLM.from_pretrained(default_model_path(), dtype=torch.float32).train()


def _batch(
    vocab: int, lengths: list[int], groups: int
) -> tuple[list[list[int]], list[list[int]], Any]:
    import torch

    gen = torch.Generator().manual_seed(1)
    per_group = len(lengths) // groups
    prompts = [
        torch.randint(3, vocab, (PROMPT_TOKENS,), generator=gen).tolist() for _ in range(groups)
    ]
    rows = [prompts[i // per_group] for i in range(len(lengths))]
    completions = [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in lengths]
    advantages = torch.linspace(-1.0, 1.0, len(lengths))
    return rows, completions, advantages


def previous_logprobs(model: Any, mb: Any, with_entropy: bool) -> Any:
    """The update's formula before the chunked / fused heads (kept here for the comparison)."""
    from grpo_train.learner.logprobs import plain_logprobs

    out = model(
        input_ids=mb.input_ids,
        attention_mask=mb.attention_mask,
        position_ids=mb.position_ids,
        logits_to_keep=mb.completion_ids.shape[1] + 1,
        use_cache=False,
    )
    return plain_logprobs(out.logits[:, :-1], mb.completion_ids, 1.0, with_entropy)


def worker(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one variant's update in this process; return its peak RSS growth and seconds."""
    import torch

    from grpo_train.algorithm.objective import grpo_loss
    from grpo_train.learner.forward import token_logprobs
    from grpo_train.learner.logprobs import HeadChoice
    from grpo_train.learner.micro_batches import ForwardCost, make_micro_batches, packing_pays

    torch.set_num_threads(spec["threads"])
    variant = spec["variant"]
    model = _model(spec["model"])
    vocab = int(model.get_output_embeddings().weight.shape[0])
    prompts, completions, advantages = _batch(vocab, spec["lengths"], spec["groups"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    budget = spec["micro_batch_tokens"]
    trainer = _trl_trainer(model, len(completions)) if variant.startswith("trl") else None
    if variant == "checkpointed":
        from grpo_train.models.hf_compat import enable_checkpointing

        enable_checkpointing(model, {"use_reentrant": False})
    # The default (``packing: auto`` on one process): the shared-prompt forward over padded
    # rows, or packed rows where those run fewer positions (``micro_batches.packing_pays``).
    packed = variant in ("packed", "checkpointed") or (
        variant == "default"
        and packing_pays(prompts, completions, budget, cost=ForwardCost.of(model.config))
    )
    share = variant == "default" and not packed
    batches = make_micro_batches(
        prompts, completions, budget, pad_id=0, group_prompts=share, packed=packed
    )
    head = {"chunked": HeadChoice("chunked"), "fused": HeadChoice("fused")}.get(
        variant, HeadChoice()
    )
    total = sum(len(c) for c in completions)
    base = _start_peak()
    start, cpu_start = time.perf_counter(), time.process_time()
    for mb in batches:
        rows = list(mb.rows)
        mask = mb.completion_mask.float()
        if trainer is not None:
            loss = _trl_loss(trainer, model, mb, advantages[rows])
        elif variant == "liger":
            loss = _liger_loss(model, mb, advantages[rows])
        elif variant == "liger-head":
            loss = _liger_head_loss(model, mb, advantages[rows])
        else:
            if variant == "previous":
                logprobs, _entropy = previous_logprobs(model, mb, True)
            else:
                logprobs, _entropy = token_logprobs(model, mb, 1.0, True, share, head)
            loss, _ = grpo_loss(
                logprobs, logprobs.detach(), advantages[rows], mask, loss_type="dapo"
            )
        (loss * float(mask.sum()) / total).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    seconds = time.perf_counter() - start
    # One thread per worker: its CPU seconds are its work, whatever else the machine runs (the
    # wall seconds stretch with the load).
    cpu_seconds = time.process_time() - cpu_start
    peak = _status_kib("VmHWM:")
    return {
        "peak_mib": (peak - base) / 1024,
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "micro_batches": len(batches),
    }


def _trl_trainer(model: Any, rows: int) -> Any:
    """TRL's GRPOTrainer around ``model`` (only its loss is used: no generation)."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from grpo_train.models.loading import build_tiny_model, load_policy

    with tempfile.TemporaryDirectory() as tmp:
        _, tokenizer = load_policy(str(build_tiny_model(Path(tmp) / "tok", seed=0)))
        args = GRPOConfig(
            output_dir=str(Path(tmp) / "out"),
            per_device_train_batch_size=rows,
            num_generations=rows,
            use_cpu=True,
            report_to=[],
            loss_type="dapo",
            beta=0.0,
            bf16=False,
        )
        return GRPOTrainer(
            model=model,
            reward_funcs=[lambda completions, **_: [0.0] * len(completions)],
            args=args,
            train_dataset=Dataset.from_dict({"prompt": ["x"] * rows}),
            processing_class=tokenizer,
        )


def _trl_loss(trainer: Any, model: Any, mb: Any, advantages: Any) -> Any:
    c_len = mb.completion_ids.shape[1]
    inputs = {
        "prompt_ids": mb.input_ids[:, :-c_len],
        "prompt_mask": mb.attention_mask[:, :-c_len],
        "completion_ids": mb.completion_ids,
        "completion_mask": mb.completion_mask,
        "advantages": advantages,
        "num_items_in_batch": mb.completion_mask.sum().float(),
    }
    trainer.current_gradient_accumulation_steps = trainer.args.steps_per_generation  # one pass
    return trainer._compute_loss(model, inputs)


def _liger_loss(model: Any, mb: Any, advantages: Any) -> Any:
    """Liger's fused GRPO loss (dapo, beta 0) from the hidden states before the lm_head."""
    from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss

    from grpo_train.learner.forward import completion_hidden_states

    hidden = completion_hidden_states(model, mb)  # the positions predicting completions
    loss_fn = LigerFusedLinearGRPOLoss(
        beta=0.0, compiled=False, use_ref_model=False, loss_type="dapo", temperature=1.0
    )
    loss, _metrics = loss_fn(
        hidden,
        model.get_output_embeddings().weight,
        mb.completion_ids,
        mb.completion_mask,
        advantages,
    )
    return loss


def _liger_head_loss(model: Any, mb: Any, advantages: Any) -> Any:
    """``logprob_head: liger`` as ``grpo_update`` runs it (dapo, beta 0, first pass)."""
    import torch

    from grpo_train.algorithm.objective import ObjectiveSettings
    from grpo_train.learner.forward import completion_hidden_states, output_layer
    from grpo_train.learner.liger_loss import liger_grpo_loss
    from grpo_train.learner.logprobs import fused_logprobs

    head = output_layer(model)
    states = completion_hidden_states(model, mb, False, head)
    mask = mb.completion_mask.float()
    with torch.no_grad():  # the old policy's log-probs and the entropy metric
        fused_logprobs(head, states.detach(), mb.completion_ids, 1.0, True, vocab=head.out_features)
    return liger_grpo_loss(
        head, states, mb.completion_ids, mask, advantages, ObjectiveSettings(beta=0.0),
        temperature=1.0,
    )  # fmt: skip


def _run(spec: dict[str, Any]) -> dict[str, Any]:
    """The least peak and seconds of ``spec["repeats"]`` fresh workers.

    A worker's peak moves by a chunk's worth (~75 MiB at 1,024 tokens) from run to run with the
    allocator's choices, which two lengths' difference turns into ~150 KiB per token; the least
    of a few runs is the update's own need (as ``tests/grpo_train/memory_probe.py`` takes it).
    """
    runs = [_run_once(spec) for _ in range(max(1, int(spec.get("repeats", 1))))]
    good = [r for r in runs if "error" not in r]
    if not good:
        return runs[0]
    return {key: min(r[key] for r in good) for key in good[0]}


def _run_once(spec: dict[str, Any]) -> dict[str, Any]:
    if spec["variant"] in ("liger", "liger-head"):
        try:
            import liger_kernel.chunked_loss  # noqa: F401
        except ImportError:
            return {"error": "liger-kernel not installed"}
    env = {**os.environ, "OMP_NUM_THREADS": str(spec["threads"]), "TOKENIZERS_PARALLELISM": "0"}
    done = subprocess.run(
        [sys.executable, __file__, "--worker", json.dumps(spec)],
        capture_output=True,
        text=True,
        env=env,
        timeout=3600,
    )
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["?"])[-1]
        return {"error": f"failed: {tail[:80]}"}
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _shape(model_name: str) -> tuple[int, int]:
    """(hidden size, layers) of a benchmark model."""
    return (128, 2) if model_name == "tiny-qwen3" else (576, 30)


def lower_bound_mib(model_name: str, tokens: int) -> float:
    """Gradients + AdamW moments (float32) + one checkpointed hidden state per layer and token.

    Above the weights, as the measured peaks are. ``tokens``: those of the largest micro-batch
    (the one whose activations are alive).
    """
    hidden, layers = _shape(model_name)
    return (3 * 4 * _params(model_name) + 4 * hidden * layers * tokens) / 2**20


def _params(model_name: str) -> int:
    if model_name == "tiny-qwen3":
        v, h, i, layers = 151_936, 128, 384, 2
        attention = h * (4 * 32) + 2 * h * (2 * 32) + (4 * 32) * h + 2 * 32
        return v * h + layers * (attention + 3 * h * i + 2 * h) + h
    return 134_515_008  # SmolLM2-135M (tied embeddings)


def _cell(result: dict[str, Any], key: str, fmt: str) -> str:
    return result["error"] if "error" in result else format(result[key], fmt)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--lengths", default="512,1024", help="completion lengths")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--smollm", action="store_true", help="also SmolLM2-135M")
    parser.add_argument(
        "--models", default="", help="instead: these of tiny-qwen3,smollm2-135m (comma-separated)"
    )
    parser.add_argument("--mix-tokens", type=int, default=1920, help="total tokens of each mix")
    parser.add_argument(
        "--mix-variants", default="previous,default,packed,trl", help="variants of the mix table"
    )
    parser.add_argument("--micro-batch-tokens", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=2, help="fresh workers per cell (least)")
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return 0
    lengths = [int(x) for x in args.lengths.split(",")]
    variants = [v for v in args.variants.split(",") if v]
    models = ["tiny-qwen3", *(["smollm2-135m"] if args.smollm else [])]
    if args.models:
        models = [m for m in args.models.split(",") if m]
    common = {
        "threads": args.threads,
        "micro_batch_tokens": args.micro_batch_tokens,
        "repeats": args.repeats,
    }
    print(f"load: {os.getloadavg()[0]:.1f} (1-min average), threads per worker: {args.threads}")
    for model in models:
        print(f"\n## {model}: peak RSS growth (MiB) and update seconds, 1 prompt x 2 completions\n")
        results: dict[tuple[str, int], dict[str, Any]] = {}
        for length in lengths:
            for variant in variants:
                # one micro-batch per completion (a budget of 1 token: each row alone), so that
                # the peak is one completion's, as with long chains under any budget
                spec = {**common, "variant": variant, "model": model, "groups": 1}
                spec["micro_batch_tokens"] = 1
                results[variant, length] = _run({**spec, "lengths": [length, length]})
        head = " | ".join(f"{n} MiB | {n} s" for n in lengths)
        print(f"| variant | {head} | KiB / token ({lengths[-2]}->{lengths[-1]}) |")
        print("|---" * (2 * len(lengths) + 2) + "|")
        for variant in variants:
            cells = []
            for length in lengths:
                r = results[variant, length]
                cells += [_cell(r, "peak_mib", ".0f"), _cell(r, "seconds", ".1f")]
            a, b = results[variant, lengths[-2]], results[variant, lengths[-1]]
            growth = "-"
            if "error" not in a and "error" not in b:
                growth = (
                    f"{(b['peak_mib'] - a['peak_mib']) * 1024 / (lengths[-1] - lengths[-2]):.0f}"
                )
            print(f"| {variant} | {' | '.join(cells)} | {growth} |")
        bounds = [f"{lower_bound_mib(model, n):.0f} | -" for n in lengths]
        hidden, layers = _shape(model)
        print(f"| bound (whole state) | {' | '.join(bounds)} | {4 * hidden * layers / 1024:.1f} |")
        mix = [v for v in args.mix_variants.split(",") if v]
        _mix_table(model, mix, common, args.mix_tokens)
    return 0


def _mix_table(model: str, variants: list[str], common: dict[str, Any], total: int) -> None:
    """Update seconds on a uniform and a skewed (40x spread) mix of the same total tokens."""
    rows = 8
    weights = [1, 1, 2, 3, 5, 10, 18, 40]  # longest / shortest = 40
    skewed = [max(1, round(total * w / sum(weights))) for w in weights]
    uniform = [sum(skewed) // rows] * rows
    print(
        f"\n## {model}: update seconds vs length mix ({rows} rows, 2 prompts, {sum(skewed)} "
        f"tokens each; skewed lengths {skewed})\n"
    )
    # CPU seconds of the one-thread workers: the ratio holds on a loaded machine too.
    print(
        "| variant | uniform CPU s | skewed CPU s | skewed / uniform | uniform wall s | "
        "skewed wall s | uniform MiB | skewed MiB |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for variant in variants:
        spec = {**common, "variant": variant, "model": model, "groups": 2}
        u = _run({**spec, "lengths": uniform})
        s = _run({**spec, "lengths": skewed})
        ratio = (
            "-" if "error" in u or "error" in s else f"{s['cpu_seconds'] / u['cpu_seconds']:.2f}"
        )
        print(
            f"| {variant} | {_cell(u, 'cpu_seconds', '.1f')} | {_cell(s, 'cpu_seconds', '.1f')} "
            f"| {ratio} | {_cell(u, 'seconds', '.1f')} | {_cell(s, 'seconds', '.1f')} | "
            f"{_cell(u, 'peak_mib', '.0f')} | {_cell(s, 'peak_mib', '.0f')} |"
        )


if __name__ == "__main__":
    raise SystemExit(main())
