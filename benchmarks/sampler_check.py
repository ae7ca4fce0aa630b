"""Step-1 samplers side by side: TRL's ``GRPOTrainer`` generation against our rollout engines.

Before the first update both trainers hold the same policy, so whatever differs in what they
sample at step 1 is the sampler's doing. This script draws completions of the same prompts (the
training rows ``grpo train`` draws first with ``--seed``, rendered by the trainer's
``encode_prompt``, 4 prompts x 8 per call as in the race) with:

- ``trl``: ``model.generate`` with the ``GenerationConfig`` TRL's ``GRPOTrainer`` builds (its
  ``GRPOConfig`` defaults for temperature, top-p, top-k, min-p, repetition penalty; every EOS id
  of the model's generation config plus the tokenizer's), on a model TRL has prepared (pad id
  mirrored onto the model);
- ``hf``: our ``HFEngine`` (the static-cache decode loop);
- ``vllm``: our ``VLLMEngine`` as ``grpo train`` starts it;
- ``trl-trainer``: TRL's ``GRPOTrainer`` itself with the race's ``GRPOConfig``, stopped at its
  reward call (before any update), for the rows of each call: the real generation path, not a
  replica of it (no sampler log-probs, so only the checks that need none apply).

and prints, for each: reward rate (the environment's score), EOS rate, truncation rate,
completion lengths, distinct completions per group, the first-token distribution, and the paired
difference of reward rate against TRL per prompt (mean ± standard error over prompts, so that
the samples of one prompt, which are correlated, are not counted as independent).

It also checks the distributions themselves, which needs far fewer samples than rates: for each
sampled completion the log-probability the sampler reports for each token (TRL: the processed
scores ``generate`` returns) is compared with the trainer's own ``log_softmax(logits / T)`` of
the same sequence (one teacher-forced forward, right-padded, as the update computes it). A
logits processor, a wrong position id under padding or a different EOS rule shows up here as a
gap far above float noise.

    .venv/bin/python benchmarks/sampler_check.py --prompts 200 --samplers trl vllm hf

``--race-seeds K`` takes the race's step-1 prompts instead (the first 4 rows of each of seeds
0 .. K-1: what both trainers sample from before their first update), and ``--rounds R`` draws
every prompt R times (round r seeded with ``--seed`` + r), for reward rates over thousands of
completions; per-prompt rates pool the rounds.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import learning_curve as lc  # the race's prompt order and TRL config

CALL_PROMPTS = 4
"""Prompts per generation call: the race's prompts per step."""


@dataclass
class Drawn:
    """What one sampler drew for one prompt."""

    prompt: int
    token_ids: list[list[int]]
    texts: list[str]
    stopped: list[bool]
    logprobs: list[list[float]] | None = None


@dataclass
class Summary:
    """One sampler's statistics over all its completions."""

    name: str
    completions: int
    reward: float
    eos: float
    truncated: float
    mean_length: float
    length_quartiles: tuple[float, float, float]
    distinct_per_group: float
    first_tokens: list[tuple[str, float]]
    max_logprob_gap: float | None
    mean_abs_logprob_gap: float | None
    seconds: float
    pit_ks: float | None = None
    """KS distance of the tokens' PIT values from uniform (``teacher_forced_gap``)."""
    pit_ks_5pct: float | None = None
    """The 5% critical distance for that many independent tokens: 1.36 / sqrt(n)."""
    logprob_excess: tuple[float, float, int] | None = None
    """Mean of log p(sampled) + H(p) over tokens, its standard error, the token count."""
    per_prompt_reward: list[float] = field(default_factory=list)


def quartiles(values: Sequence[float]) -> tuple[float, float, float]:
    """25th, 50th and 75th percentiles (nearest rank).

    >>> quartiles([1, 2, 3, 4, 5, 6, 7, 8])
    (2, 4, 6)
    """
    ordered = sorted(values)
    pick = [ordered[max(math.ceil(q * len(ordered)) - 1, 0)] for q in (0.25, 0.5, 0.75)]
    return pick[0], pick[1], pick[2]


def paired(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """Mean and standard error of the per-prompt differences ``a - b``.

    >>> [round(x, 4) for x in paired([0.5, 0.25, 0.0], [0.25, 0.25, 0.0])]
    [0.0833, 0.0833]
    """
    diffs = [x - y for x, y in zip(a, b, strict=True)]
    n = len(diffs)
    mean = sum(diffs) / n
    var = sum((d - mean) ** 2 for d in diffs) / (n - 1) if n > 1 else 0.0
    return mean, math.sqrt(var / n)


def trl_generation(model, tokenizer, max_new_tokens: int, temperature: float):
    """The ``GenerationConfig`` TRL's ``GRPOTrainer`` (HF generation path) builds, and the EOS ids.

    Mirrors ``GRPOTrainer.__init__`` of TRL 1.16 field for field, taking every sampling value
    from ``GRPOConfig``'s own defaults so that a TRL default is not guessed here.
    """
    from transformers import GenerationConfig
    from trl import GRPOConfig

    args = GRPOConfig(output_dir="/tmp/unused", temperature=temperature, use_cpu=True)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.config.get_text_config().pad_token_id = tokenizer.pad_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    eos = model.generation_config.eos_token_id
    eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    if tokenizer.eos_token_id not in eos:
        eos = [tokenizer.eos_token_id, *eos]
    kwargs = {
        "max_new_tokens": max_new_tokens,
        "do_sample": True,
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": eos,
        "temperature": args.temperature,
        "top_p": args.top_p,
        "top_k": args.top_k,
        "min_p": args.min_p,
        "repetition_penalty": args.repetition_penalty,
        "cache_implementation": args.cache_implementation,
    }
    return GenerationConfig(**kwargs, disable_compile=True), eos, kwargs


def draw_trl(model, tokenizer, prompts, n, max_new, temperature, seed) -> list[Drawn]:
    """TRL's generation path: repeat each prompt n times, left-pad, ``generate``, cut at EOS."""
    import torch

    from grpo_train.rollout.hf import left_pad

    config, eos, _ = trl_generation(model, tokenizer, max_new, temperature)
    pad = tokenizer.pad_token_id
    out: list[Drawn] = []
    for call, start in enumerate(range(0, len(prompts), CALL_PROMPTS)):
        chunk = prompts[start : start + CALL_PROMPTS]
        rows = [p for p in chunk for _ in range(n)]
        ids, mask = left_pad(rows, pad)
        width = ids.shape[1]
        torch.manual_seed(seed * 1_000_003 + call)
        with torch.no_grad():
            res = model.generate(
                input_ids=ids,
                attention_mask=mask,
                generation_config=config,
                output_scores=True,
                return_dict_in_generate=True,
            )
        new = res.sequences[:, width:]
        # The processed scores are what was sampled from: their log-softmax is the sampling
        # logprob of each token.
        steps = [torch.log_softmax(s.float(), dim=-1) for s in res.scores]
        for k in range(len(chunk)):
            d = Drawn(start + k, [], [], [], [])
            for r in range(k * n, (k + 1) * n):
                row = new[r].tolist()
                cut = next((t + 1 for t, tok in enumerate(row) if tok in eos), len(row))
                d.token_ids.append(row[:cut])
                d.stopped.append(cut <= len(row) and row[cut - 1] in eos)
                d.texts.append(tokenizer.decode(row[:cut], skip_special_tokens=True))
                assert d.logprobs is not None
                d.logprobs.append([float(steps[t][r, row[t]]) for t in range(cut)])
            out.append(d)
    return out


class _Drawn(Exception):
    """Raised by the recording reward function: the batch is drawn, the update is not wanted."""


def trainer_seed(seed: int, call: int, hashed: bool = False) -> int:
    """The ``GRPOConfig`` seed of call ``call``: ``(seed x 1,000,003 + call) mod 2^32``, or with
    ``hashed`` the race's hashed TRL seed of race seed ``seed + call`` (``--seed 0``: exactly the
    hashed race arm's step 1, call c being race seed c).

    >>> trainer_seed(0, 3), trainer_seed(2, 3)
    (3, 2000009)
    >>> trainer_seed(0, 3, hashed=True) == lc.hashed_seed(3)
    True
    """
    if hashed:
        return lc.hashed_seed(seed + call)
    return (seed * 1_000_003 + call) % 2**32  # numpy's seeds are 32-bit


def draw_trl_trainer(
    model_path, dataset, env, n, max_new, temperature, seed, hashed: bool = False
) -> list[Drawn]:
    """TRL's ``GRPOTrainer`` as the race builds it, stopped at its reward call, per 4 rows.

    ``dataset`` holds the environment's rows (TRL renders their prompts itself); call ``c`` runs
    a fresh trainer with ``GRPOConfig(seed=trainer_seed(seed, c, hashed))`` on rows
    ``4c .. 4c+3`` and records the completions its first batch scored. The model is loaded
    afresh each call (nothing is updated, but TRL prepares the model it is given).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOTrainer

    from grpo_envs.adapters import trl_reward_funcs

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    reward = trl_reward_funcs(env)[0]
    out: list[Drawn] = []
    batch: dict[str, list] = {}  # what the current call's trainer scored

    def record(completions, **kwargs):
        batch["ids"] = [str(i) for i in kwargs["id"]]
        batch["tokens"] = [list(map(int, c)) for c in kwargs["completion_ids"]]
        raise _Drawn

    record.__name__ = reward.__name__
    with tempfile.TemporaryDirectory() as tmp:
        for call, start in enumerate(range(0, len(dataset), CALL_PROMPTS)):
            rows = dataset.select(range(start, min(start + CALL_PROMPTS, len(dataset))))
            batch.clear()
            config = lc.race_grpo_config(
                Path(tmp) / f"call-{call}",
                prompts=len(rows),
                group=n,
                completion_length=max_new,
                temperature=temperature,
                learning_rate=1e-6,
                steps=1,
                seed=trainer_seed(seed, call, hashed),
            )
            model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
            trainer = GRPOTrainer(
                model=model,
                reward_funcs=[record],
                args=config,
                train_dataset=rows,
                processing_class=tokenizer,
            )
            try:
                trainer.train()
            except _Drawn:
                pass
            else:
                raise RuntimeError("GRPOTrainer finished a step without calling its reward")
            eos = {tokenizer.eos_token_id, *lc._as_list(model.generation_config.eos_token_id)}
            by_id = {str(row_id): k for k, row_id in enumerate(rows["id"])}
            drawn = {k: Drawn(start + k, [], [], []) for k in range(len(rows))}
            for row_id, ids in zip(batch["ids"], batch["tokens"], strict=True):
                d = drawn[by_id[row_id]]
                d.token_ids.append(ids)
                d.texts.append(tokenizer.decode(ids, skip_special_tokens=True))
                d.stopped.append(bool(ids) and ids[-1] in eos)
            out += [drawn[k] for k in range(len(rows))]
    return out


def draw_engine(engine, prompts, n, max_new, temperature, seed) -> list[Drawn]:
    """Our engine, called as ``grpo train``'s rollout calls it (one seeded call per step)."""
    from grpo_train.rollout.base import SamplingConfig

    out: list[Drawn] = []
    for call, start in enumerate(range(0, len(prompts), CALL_PROMPTS)):
        chunk = prompts[start : start + CALL_PROMPTS]
        sampling = SamplingConfig(
            n=n, max_new_tokens=max_new, temperature=temperature, seed=seed * 1_000_003 + call
        )
        for k, group in enumerate(engine.generate(chunk, sampling)):
            out.append(
                Drawn(
                    start + k,
                    [list(c.token_ids) for c in group],
                    [c.text for c in group],
                    [c.finish_reason == "stop" for c in group],
                    [list(c.logprobs) for c in group],
                )
            )
    return out


def against_trainer(model, prompts, drawn: list[Drawn], temperature: float, limit: int):
    """The sampler against the trainer's distribution, over the first ``limit`` prompts' tokens.

    The trainer's distribution is ``log_softmax(logits / T)`` from one forward over prompt +
    completion per row (no padding: one row at a time), the quantity the update uses. One pass
    gives ``teacher_forced_gap``'s two values and ``sampling_fidelity``'s three, in that order.
    """
    import torch

    gen = torch.Generator().manual_seed(12345)
    gaps: list[float] = []
    pit: list[float] = []
    rows: list[tuple[float, int]] = []  # (sum of log p + H, tokens) per completion
    for d in drawn[:limit]:
        for k, ids in enumerate(d.token_ids):
            if not ids:
                continue
            full = torch.tensor([prompts[d.prompt] + ids])
            with torch.no_grad():
                logits = model(input_ids=full).logits[0, len(prompts[d.prompt]) - 1 : -1]
            ref_all = torch.log_softmax(logits.float() / temperature, dim=-1)
            picked = torch.tensor(ids).unsqueeze(1)
            ref = ref_all.gather(1, picked).squeeze(1)
            if d.logprobs is not None:
                gaps += (ref - torch.tensor(d.logprobs[k])).abs().tolist()
            probs, p_x = ref_all.exp(), ref.exp()
            below = probs.cumsum(dim=1).gather(1, picked).squeeze(1) - p_x
            pit += (below + torch.rand(len(ids), generator=gen) * p_x).clamp(0, 1).tolist()
            entropy = -(probs * ref_all).sum(dim=1)
            rows.append((float((ref + entropy).sum()), len(ids)))
    gap = (max(gaps), sum(gaps) / len(gaps)) if gaps else (None, None)
    if not pit:
        return (*gap, None, None, None)
    pit.sort()
    n = len(pit)
    ks = max(max((i + 1) / n - u, u - i / n) for i, u in enumerate(pit))
    tokens = sum(c for _, c in rows)
    mean = sum(e for e, _ in rows) / tokens
    var = sum((e - mean * c) ** 2 for e, c in rows) / max(len(rows) - 1, 1)
    se = (var * len(rows)) ** 0.5 / tokens  # the ratio estimator's, over completions
    return (*gap, ks, 1.36 / n**0.5, (mean, se, n))


def teacher_forced_gap(model, prompts, drawn: list[Drawn], temperature: float, limit: int):
    """Max and mean |sampler logprob - trainer logprob| (``against_trainer``).

    Does the sampler score a token as the trainer does (samplers that report log-probs).
    """
    return against_trainer(model, prompts, drawn, temperature, limit)[:2]


def sampling_fidelity(model, prompts, drawn: list[Drawn], temperature: float, limit: int):
    """Does the sampler draw as the trainer's distribution says: two checks needing no logprobs.

    (1) Each token's randomised probability integral transform under the trainer's
    distribution, ``u = P(X < x) + V * P(X = x)`` (V uniform, vocabulary order), is uniform on
    [0, 1] exactly when the tokens are drawn from that distribution: returns the Kolmogorov-
    Smirnov distance of the u's from uniform and its 5% critical value for independent draws
    (1.36 / sqrt(n)). (2) The mean over tokens of ``log p(x) + H(p)``, the sampled token's
    log-probability above its expectation: 0 for a faithful sampler, positive for a sharper one
    (a lower effective temperature, a top-k or top-p cut); with its standard error taken over
    completions (a completion's tokens are dependent) and the token count. None without tokens.
    """
    return against_trainer(model, prompts, drawn, temperature, limit)[2:]


def summarise(name, drawn, samples, env, tokenizer, gap, seconds) -> tuple[Summary, Counter]:
    """Score every completion with the environment; the statistics and the first-token counts."""
    texts = [t for d in drawn for t in d.texts]
    scores = env.score_batch(texts, [samples[d.prompt] for d in drawn for _ in d.texts])
    correct = [float(s.correct) for s in scores]
    lengths = [len(ids) for d in drawn for ids in d.token_ids]
    stopped = [s for d in drawn for s in d.stopped]
    right: dict[int, float] = {}
    count: dict[int, int] = {}
    i = 0
    for d in drawn:  # a prompt drawn in several rounds pools them
        k = len(d.texts)
        right[d.prompt] = right.get(d.prompt, 0.0) + sum(correct[i : i + k])
        count[d.prompt] = count.get(d.prompt, 0) + k
        i += k
    per_prompt = [right[q] / count[q] for q in sorted(right)]
    firsts = Counter(ids[0] for d in drawn for ids in d.token_ids if ids)
    total = sum(firsts.values())
    top = [(repr(tokenizer.decode([t])), c / total) for t, c in firsts.most_common(6)]
    return Summary(
        name=name,
        completions=len(texts),
        reward=sum(correct) / len(correct),
        eos=sum(stopped) / len(stopped),
        truncated=1 - sum(stopped) / len(stopped),
        mean_length=sum(lengths) / len(lengths),
        length_quartiles=quartiles(lengths),
        distinct_per_group=sum(len({tuple(x) for x in d.token_ids}) for d in drawn) / len(drawn),
        first_tokens=top,
        max_logprob_gap=gap[0],
        mean_abs_logprob_gap=gap[1],
        seconds=seconds,
        pit_ks=gap[2],
        pit_ks_5pct=gap[3],
        logprob_excess=gap[4],
        per_prompt_reward=per_prompt,
    ), firsts


def race_step1_rows(size: int, seeds: int) -> list[int]:
    """The race's step-1 rows: the first ``CALL_PROMPTS`` of each of seeds 0 .. ``seeds`` - 1.

    >>> rows = race_step1_rows(100, 2)
    >>> rows == lc.prompt_order(100, 0, 4) + lc.prompt_order(100, 1, 4) and len(set(rows[:4])) == 4
    True
    """
    return [row for seed in range(seeds) for row in lc.prompt_order(size, seed, CALL_PROMPTS)]


def count_distribution(rates: Sequence[float], draws: int) -> list[float]:
    """Distribution of the total right answers when prompt i is drawn ``draws`` times at
    ``rates[i]`` (a sum of binomials, by convolution): index k holds P(total = k).

    >>> [round(x, 4) for x in count_distribution([0.5, 0.0], 2)]
    [0.25, 0.5, 0.25, 0.0, 0.0]
    >>> round(sum(count_distribution([0.1, 0.3, 0.02], 8)), 10)
    1.0
    """
    total = [1.0]
    for rate in rates:
        one = [math.comb(draws, k) * rate**k * (1 - rate) ** (draws - k) for k in range(draws + 1)]
        merged = [0.0] * (len(total) + draws)
        for i, a in enumerate(total):
            for k, b in enumerate(one):
                merged[i + k] += a * b
        total = merged
    return total


def race_step1_surprise(
    rates: Sequence[float], right_by_seed: dict[int, int], draws: int
) -> tuple[int, float, float, float]:
    """How a race arm's step-1 right answers compare with what the samplers' rates predict.

    ``rates``: per prompt, the race's step-1 prompts of seeds 0, 1, ... (``CALL_PROMPTS`` each,
    as ``race_step1_rows`` orders them); ``right_by_seed``: the arm's right answers at step 1 per
    seed (seeds beyond the rates are left out); ``draws``: completions per prompt. Returns the
    observed total, its expectation, P(total >= observed) and P(total <= observed).

    >>> obs, expected, upper, lower = race_step1_surprise([0.5] * 4, {0: 4, 1: 9}, 2)
    >>> obs, expected, round(upper, 4), round(lower, 4)
    (4, 4.0, 0.6367, 0.6367)
    """
    seeds = sorted(s for s in right_by_seed if (s + 1) * CALL_PROMPTS <= len(rates))
    picked = [rates[s * CALL_PROMPTS + k] for s in seeds for k in range(CALL_PROMPTS)]
    dist = count_distribution(picked, draws)
    observed = sum(right_by_seed[s] for s in seeds)
    expected = sum(k * p for k, p in enumerate(dist))
    return observed, expected, sum(dist[observed:]), sum(dist[: observed + 1])


def pooled_rates(summaries: Sequence[Summary]) -> list[float]:
    """Per-prompt reward rates pooled over samplers, each weighted by its completions."""
    weights = [s.completions / len(s.per_prompt_reward) for s in summaries]
    return [
        sum(w * s.per_prompt_reward[i] for w, s in zip(weights, summaries, strict=True))
        / sum(weights)
        for i in range(len(summaries[0].per_prompt_reward))
    ]


def race_report(summaries: Sequence[Summary], races: Sequence[Path], group: int) -> str:
    """Each race arm's step-1 right answers against the pooled rates (``race_step1_surprise``)."""
    rates = pooled_rates(summaries)
    arms: dict[str, dict[int, int]] = {}
    for path in races:
        _, _, results = lc.load(path)
        for r in results:
            if r.train_accuracy and not r.error:
                seed = r.spec.seed_or(0)
                right = round(r.train_accuracy[0] * group * CALL_PROMPTS)
                arms.setdefault(r.spec.arm_name(), {})[seed] = right
    lines = [
        f"step-1 right answers in the race against the pooled rates "
        f"({sum(s.completions for s in summaries)} completions, {len(rates)} prompts):"
    ]
    for arm, by_seed in sorted(arms.items()):
        observed, expected, upper, lower = race_step1_surprise(rates, by_seed, group)
        lines.append(
            f"  {arm}: {observed} right, expected {expected:.1f}; "
            f"P(>= {observed}) = {upper:.2g}, P(<= {observed}) = {lower:.2g}"
        )
    return "\n".join(lines)


def total_variation(a: Counter, b: Counter) -> float:
    """Total variation distance between two empirical distributions.

    >>> total_variation(Counter({1: 2, 2: 2}), Counter({1: 4}))
    0.5
    """
    ta, tb = sum(a.values()), sum(b.values())
    return 0.5 * sum(abs(a[k] / ta - b[k] / tb) for k in set(a) | set(b))


def main(argv: Sequence[str] | None = None) -> int:
    """Draw with every asked-for sampler, print the side-by-side table, write the JSON."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="default")
    p.add_argument("--env", default="math/arithmetic-v0")
    p.add_argument("--env-kwargs", default='{"task": "add2", "answer": "loose"}')
    p.add_argument("--prompts", type=int, default=200)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--completion-length", type=int, default=64)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--race-seeds",
        type=int,
        default=0,
        help="K > 0: the race's step-1 prompts of seeds 0 .. K-1 (4 each) instead of --prompts",
    )
    p.add_argument("--rounds", type=int, default=1, help="draws per prompt (round r: seed + r)")
    p.add_argument(
        "--pool",
        nargs="+",
        default=[],
        help="draw nothing: pool the rates of these --out files (same --race-seeds) and compare "
        "the step-1 right answers of the --race runs with them",
    )
    p.add_argument("--race", nargs="*", default=[], help="learning_curve.json files, with --pool")
    p.add_argument(
        "--samplers",
        nargs="+",
        default=["trl", "vllm", "hf"],
        choices=["trl", "trl-trainer", "hf", "vllm"],
    )
    p.add_argument(
        "--trl-seed-hash",
        action="store_true",
        help="trl-trainer: seed call c with the race's hashed TRL seed of seed + c "
        "(learning_curve.py --trl-sampling-seed hashed) instead of seed x 1,000,003 + c",
    )
    p.add_argument("--gap-prompts", type=int, default=8, help="prompts for the logprob check")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--out", default="")
    args = p.parse_args(argv)
    if args.trl_seed_hash and args.rounds > 1:
        # Round r would seed call c with round 0's seed of call c + r: the same random stream
        # for other prompts, correlated draws counted as independent ones.
        p.error("--trl-seed-hash: one round per run (give each run its own --seed: 0, 100, ...)")
    if args.pool:
        missing = [path for path in [*args.pool, *args.race] if not Path(path).is_file()]
        if missing:
            raise SystemExit(f"--pool / --race: no such file: {', '.join(missing)}")
        files = [json.loads(Path(path).read_text()) for path in args.pool]
        pooled = [Summary(**row) for rows in files for row in rows]
        if len({len(s.per_prompt_reward) for s in pooled}) != 1:
            raise SystemExit("--pool: the files cover different prompts (use one --race-seeds)")
        print(race_report(pooled, [Path(r) for r in args.race], args.group))
        return 0

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import grpo_envs
    from grpo_envs.types import Sample
    from grpo_train.episodes.prompts import encode_prompt
    from grpo_train.models.loading import resolve_model

    if args.threads:
        torch.set_num_threads(args.threads)
    path = resolve_model(args.model)
    env = grpo_envs.make(args.env, **json.loads(args.env_kwargs))
    rows = env.dataset("train")
    picked = (
        race_step1_rows(len(rows), args.race_seeds)
        if args.race_seeds
        else lc.prompt_order(len(rows), args.seed, args.prompts)
    )
    samples = [Sample.from_row(rows[i]) for i in picked]
    tokenizer = AutoTokenizer.from_pretrained(path)
    prompts = [encode_prompt(tokenizer, s, max_tokens=256).ids for s in samples]
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    print(
        f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, load {os.getloadavg()[0]:.1f}; "
        f"{path}; generation_config: {model.generation_config.to_diff_dict()}; "
        f"tokenizer eos {tokenizer.eos_token!r} ({tokenizer.eos_token_id}), "
        f"pad {tokenizer.pad_token!r} ({tokenizer.pad_token_id})",
        flush=True,
    )
    summaries: list[Summary] = []
    firsts: list[Counter] = []
    for name in args.samplers:
        t = time.perf_counter()
        if name == "trl":
            _, _, kwargs = trl_generation(model, tokenizer, args.completion_length, 1.0)
            print(f"trl GenerationConfig kwargs: {kwargs}", flush=True)
        engine = None
        if name in ("hf", "vllm"):
            from grpo_train.rollout import make_engine

            engine = (
                make_engine("hf", path, model=model, tokenizer=tokenizer, dtype="float32")
                if name == "hf"
                else make_engine(
                    "vllm",
                    path,
                    dtype="float32",
                    seed=args.seed,
                    max_model_len=256 + args.completion_length,
                )
            )
        drawn: list[Drawn] = []
        for round_ in range(args.rounds):
            seed = args.seed + round_
            shape = (args.group, args.completion_length, args.temperature, seed)
            if name == "trl":
                drawn += draw_trl(model, tokenizer, prompts, *shape)
            elif name == "trl-trainer":
                drawn += draw_trl_trainer(
                    path, rows.select(picked), env, *shape, hashed=args.trl_seed_hash
                )
            else:
                assert engine is not None  # hf or vllm (argparse checked the names)
                drawn += draw_engine(engine, prompts, *shape)
            print(f"{name} round {round_ + 1}/{args.rounds} drawn", flush=True)
        if name == "vllm":
            assert engine is not None
            engine.close()
        seconds = time.perf_counter() - t
        gap = against_trainer(model, prompts, drawn, args.temperature, args.gap_prompts)
        s, first = summarise(name, drawn, samples, env, tokenizer, gap, seconds)
        summaries.append(s)
        firsts.append(first)
        print(f"{name}: reward {s.reward:.3f}, eos {s.eos:.3f}, {seconds:.0f} s", flush=True)
    print(report(summaries, firsts))
    if args.out:
        Path(args.out).write_text(json.dumps([asdict(s) for s in summaries], indent=1))
    return 0


def report(summaries: Sequence[Summary], firsts: Sequence[Counter]) -> str:
    """The side-by-side table, and each sampler's reward rate paired by prompt with the first's."""
    rows = [
        ("completions", lambda s: f"{s.completions}"),
        ("reward rate", lambda s: f"{s.reward:.1%}"),
        ("EOS (stopped)", lambda s: f"{s.eos:.1%}"),
        ("truncated", lambda s: f"{s.truncated:.1%}"),
        ("mean length", lambda s: f"{s.mean_length:.1f}"),
        ("length q1/med/q3", lambda s: "/".join(f"{q:g}" for q in s.length_quartiles)),
        ("distinct / group", lambda s: f"{s.distinct_per_group:.2f}"),
        (
            "logprob gap max",
            lambda s: "-" if s.max_logprob_gap is None else f"{s.max_logprob_gap:.1e}",
        ),
        (
            "logprob gap mean",
            lambda s: "-" if s.mean_abs_logprob_gap is None else f"{s.mean_abs_logprob_gap:.1e}",
        ),
        (
            "PIT KS distance (5% critical)",
            lambda s: "-" if s.pit_ks is None else f"{s.pit_ks:.4f} ({s.pit_ks_5pct:.4f})",
        ),
        (
            "log p(sampled) + H, mean ± se (tokens)",
            lambda s: (
                "-"
                if s.logprob_excess is None
                else "{:+.4f} ± {:.4f} ({})".format(*s.logprob_excess)
            ),
        ),
        ("seconds", lambda s: f"{s.seconds:.0f}"),
    ]
    lines = ["| | " + " | ".join(s.name for s in summaries) + " |"]
    lines.append("|---" * (len(summaries) + 1) + "|")
    lines += [f"| {label} | " + " | ".join(f(s) for s in summaries) + " |" for label, f in rows]
    lines.append("")
    for s, first in zip(summaries, firsts, strict=True):
        tops = ", ".join(f"{tok} {share:.1%}" for tok, share in s.first_tokens)
        tv = total_variation(first, firsts[0])
        lines.append(f"{s.name} first tokens: {tops}; TV distance to {summaries[0].name}: {tv:.3f}")
    base = summaries[0]
    for s in summaries[1:]:
        mean, se = paired(s.per_prompt_reward, base.per_prompt_reward)
        lines.append(
            f"reward rate {s.name} - {base.name}, paired by prompt: {mean:+.2%} ± {se:.2%} "
            f"({len(s.per_prompt_reward)} prompts)"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
