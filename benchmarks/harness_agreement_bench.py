"""Per-sample agreement with lm-eval: same model, same prompts, greedy, on GSM8K; time of each.

Two comparisons. Graders: our math verifier and lm-eval's GSM8K grading (its own filter and
metric code, settings read from its ``gsm8k.yaml``) on the same labelled completions, the GSM8K
reference solutions rewritten in the answer styles models use (``#### N``, boxed, prose, a number
after the answer, thousands commas, a wrong final answer). Generation: ``grpo eval``'s runner
(transformers engine) and lm-eval 0.4.13's ``simple_evaluate`` (its ``hf``
model) both answer the first ``--prompts`` GSM8K test questions with SmolLM2-135M-Instruct (the
embedded default), greedy, at most ``--max_tokens`` new tokens, the prompt being ``math/gsm8k-v0``'s
user message through the model's chat template (lm-eval: ``apply_chat_template=True``, zero-shot).
lm-eval grades with its own GSM8K task's filters and metric, loaded from its ``gsm8k.yaml``
(``strict-match``: ``#### N``; ``flexible-extract``: the last number), only the data source, the
prompt and the stop strings changed. The table shows how many completions came out identical, and
on those, how often the verdicts agree (ours: the math verifier, flexible extraction, what
``grpo eval`` reports; lm-eval: flexible-extract), with every disagreement printed.

lm-eval is not a dependency of grpo-kit; install it beside the project's packages first, e.g. in a
venv that sees them (a ``.pth`` file naming the project venv's site-packages), then::

    pip install lm_eval==0.4.13
    python benchmarks/harness_agreement_bench.py --prompts 32

Without hub access both read GSM8K from ``$GRPO_GSM8K_DIR`` (a folder with ``test.jsonl``; the
30-row test fixture otherwise).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GSM8K_DIR = Path(os.environ.get("GRPO_GSM8K_DIR", REPO / "tests/grpo_envs/fixtures/gsm8k"))


def _parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--max_tokens", type=int, default=256)
    p.add_argument("--batch_size", type=int, default=16)
    p.add_argument("--model", default=None, help="model folder (default: the embedded SmolLM2)")
    p.add_argument("--data", default=str(GSM8K_DIR), help="folder with test.jsonl")
    p.add_argument(
        "--graded", type=int, default=200, help="GSM8K items for the grader-only comparison"
    )
    p.add_argument("--grader_only", action="store_true", help="skip the generation comparison")
    return p.parse_args()


def run_ours(model: str, data: str, n: int, max_tokens: int, batch: int, out: Path) -> dict:
    """``grpo_train.eval.evaluate`` on the transformers engine; per-sample records and seconds."""
    from transformers import AutoTokenizer

    import grpo_envs
    from grpo_train.eval.runner import EvalTask, evaluate
    from grpo_train.rollout import make_engine
    from grpo_train.rollout.base import SamplingConfig

    start = time.perf_counter()
    env = grpo_envs.make("math/gsm8k-v0", data_path=data, limit=n)
    engine = make_engine("hf", model, dtype="float32")
    try:
        summary = evaluate(
            engine,
            AutoTokenizer.from_pretrained(model),
            [EvalTask("gsm8k", env)],
            sampling=SamplingConfig(n=1, temperature=0.0, max_new_tokens=max_tokens),
            batch_size=batch,
            out_dir=out,
            progress=False,
        )
    finally:
        engine.close()
    seconds = time.perf_counter() - start
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    prompts = [dict(r) for r in env.dataset("test")]
    return {"seconds": seconds, "records": records, "prompts": prompts, "summary": summary}


def lm_eval_task(prompts: list[dict], golds: list[str], max_tokens: int, folder: Path) -> dict:
    """lm-eval's own GSM8K task config, reading our prompts from a local file."""
    import lm_eval
    import yaml

    path = folder / "gsm8k_grpo_prompts.jsonl"
    with path.open("w") as fh:
        for row, gold in zip(prompts, golds):
            messages = (
                json.loads(row["prompt"]) if isinstance(row["prompt"], str) else row["prompt"]
            )
            fh.write(json.dumps({"prompt_text": messages[-1]["content"], "answer": gold}) + "\n")
    config = yaml.safe_load((Path(lm_eval.__file__).parent / "tasks/gsm8k/gsm8k.yaml").read_text())
    for key in ("tag", "dataset_name", "training_split", "fewshot_split"):
        config.pop(key, None)
    config.update(
        task="gsm8k_grpo_prompts",
        dataset_path="json",
        dataset_kwargs={"data_files": {"test": str(path)}},
        test_split="test",
        doc_to_text="{{prompt_text}}",
        num_fewshot=0,
    )
    # The model's end-of-turn only: "Question:" would cut completions our engine lets run.
    config["generation_kwargs"] = {
        **config["generation_kwargs"],
        "until": ["<|im_end|>"],
        "max_gen_toks": max_tokens,
    }
    return config


def run_lm_eval(model: str, task: dict, batch: int) -> dict:
    """``lm_eval.simple_evaluate`` with its hf model; per (doc, filter) verdicts and seconds."""
    import lm_eval

    start = time.perf_counter()
    results = lm_eval.simple_evaluate(
        model="hf",
        model_args=f"pretrained={model},dtype=float32",
        tasks=[task],
        batch_size=batch,
        device="cpu",
        apply_chat_template=True,
        log_samples=True,
    )
    seconds = time.perf_counter() - start
    samples = results["samples"][task["task"]]
    texts: dict[int, str] = {}
    verdicts: dict[tuple[int, str], bool] = {}
    for s in samples:
        texts[s["doc_id"]] = s["resps"][0][0]
        verdicts[(s["doc_id"], s["filter"])] = bool(s["exact_match"])
    return {"seconds": seconds, "texts": texts, "verdicts": verdicts}


def _variants(solution: str) -> dict[str, tuple[str, bool]]:
    """Completions of one GSM8K item in answer styles models use, each with its true verdict."""
    from grpo_envs.envs.math_datasets import gsm8k_gold

    gold = gsm8k_gold(solution)
    body = solution.rsplit("####", 1)[0].strip()
    value = int(gold) if gold.lstrip("-").isdigit() else None
    out = {
        "reference (#### N)": (solution, True),
        "boxed": (f"{body}\nThe answer is \\boxed{{{gold}}}.", True),
        "prose": (f"{body}\nSo the answer is {gold}.", True),
        "a later number": (f"{body}\nThe answer is {gold}. I checked it in 2 steps.", True),
        "wrong (#### N+1)": (
            f"{body}\n#### {value + 1 if value is not None else gold + '1'}",
            False,
        ),
    }
    if value is not None and abs(value) >= 1000:
        out["thousands commas"] = (f"{body}\n#### {value:,}", True)
    return out


Row = tuple[str, int, float, float, float, float, float]


def grader_agreement(solutions: list[str]) -> list[Row]:
    """Our verifier and lm-eval's GSM8K filters + metric on the same labelled completions.

    lm-eval's side is its own code (``RegexFilter``, ``TakeFirstFilter``,
    ``exact_match_hf_evaluate``) with the settings read from its ``gsm8k.yaml``.
    Rows: (style, items, ours %, lm-eval flexible %, lm-eval strict %, ours = truth %,
    lm-eval flexible = truth %).
    """
    import lm_eval
    import yaml
    from lm_eval.api.metrics import exact_match_hf_evaluate
    from lm_eval.filters.extraction import RegexFilter

    from grpo_envs.envs.math_datasets import gsm8k_gold
    from grpo_envs.math import verify_batch

    cfg = yaml.safe_load((Path(lm_eval.__file__).parent / "tasks/gsm8k/gsm8k.yaml").read_text())
    metric = cfg["metric_list"][0]
    filters = {f["name"]: f["filter"][0] for f in cfg["filter_list"]}

    def lm_eval_correct(name: str, texts: list[str], refs: list[str]) -> list[bool]:
        spec = {k: v for k, v in filters[name].items() if k != "function"}
        picked = [r[0] for r in RegexFilter(**spec).apply([[t] for t in texts], None)]
        return [
            bool(
                exact_match_hf_evaluate(
                    [p], [ref], regexes_to_ignore=metric["regexes_to_ignore"],
                    ignore_case=metric["ignore_case"],
                    ignore_punctuation=metric["ignore_punctuation"],
                )["exact_match"]
            )
            for p, ref in zip(picked, refs)
        ]  # fmt: skip

    by_style: dict[str, list[tuple[str, str, bool]]] = {}
    for solution in solutions:
        for style, (text, truth) in _variants(solution).items():
            by_style.setdefault(style, []).append((solution, text, truth))
    rows = []
    for style, items in by_style.items():
        golds, texts, truths = [i[0] for i in items], [i[1] for i in items], [i[2] for i in items]
        ours = [r.correct for r in verify_batch(golds, texts)]
        flexible = lm_eval_correct("flexible-extract", texts, golds)
        strict = lm_eval_correct("strict-match", texts, golds)
        assert all(gsm8k_gold(g) for g in golds)
        m = len(items)
        rows.append((
            style, m, 100 * sum(ours) / m, 100 * sum(flexible) / m, 100 * sum(strict) / m,
            100 * sum(o == t for o, t in zip(ours, truths)) / m,
            100 * sum(f == t for f, t in zip(flexible, truths)) / m,
        ))  # fmt: skip
    return rows


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def main() -> None:
    args = _parse_args()
    from grpo_envs.envs.math_datasets import gsm8k_gold

    model = args.model
    if model is None:
        from grpo_train.models.loading import default_model_path

        model = str(default_model_path())
    all_rows = [json.loads(line) for line in (Path(args.data) / "test.jsonl").open()]
    start = time.perf_counter()
    table = grader_agreement([r["answer"] for r in all_rows[: args.graded]])
    print(f"\nGraders on the same labelled completions ({time.perf_counter() - start:.1f} s):\n")
    print("| answer style | items | ours correct % | lm-eval flexible % | lm-eval strict % "
          "| ours = truth % | lm-eval flexible = truth % |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for style, m, ours_pct, flex_pct, strict_pct, truth_pct, flex_truth in table:
        print(f"| {style} | {m} | {ours_pct:.1f} | {flex_pct:.1f} | {strict_pct:.1f} | "
              f"{truth_pct:.1f} | {flex_truth:.1f} |")  # fmt: skip
    if args.grader_only:
        return
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        rows = all_rows[: args.prompts]
        ours = run_ours(
            model, args.data, args.prompts, args.max_tokens, args.batch_size, folder / "ours"
        )
        golds = [r["answer"] for r in rows]
        theirs = run_lm_eval(
            model, lm_eval_task(ours["prompts"], golds, args.max_tokens, folder), args.batch_size
        )
    by_sample = {r["sample_id"]: r for r in ours["records"]}
    ids = [p["id"] for p in ours["prompts"]]
    same = [
        i
        for i, sid in enumerate(ids)
        if _norm(by_sample[sid]["completion"]) == _norm(theirs["texts"][i])
    ]
    ours_ok = [by_sample[sid]["success"] for sid in ids]
    flex = [theirs["verdicts"].get((i, "flexible-extract"), False) for i in range(len(ids))]
    strict = [theirs["verdicts"].get((i, "strict-match"), False) for i in range(len(ids))]
    agree = [i for i in same if ours_ok[i] == flex[i]]
    print(f"\nGSM8K test, first {len(ids)} prompts, greedy, max {args.max_tokens} new tokens, "
          f"model {Path(model).name}; load {os.getloadavg()[0]:.1f}\n")  # fmt: skip
    print("| harness | wall s (load + generate + grade) | accuracy % | strict % |")
    print("|---|---|---|---|")
    print(
        f"| grpo eval (hf engine) | {ours['seconds']:.1f} | {100 * sum(ours_ok) / len(ids):.1f} "
        f"| {100 * sum(bool(by_sample[s]['strict_correct']) for s in ids) / len(ids):.1f} |"
    )
    print(f"| lm-eval 0.4.13 (hf) | {theirs['seconds']:.1f} | {100 * sum(flex) / len(ids):.1f} "
          f"(flexible-extract) | {100 * sum(strict) / len(ids):.1f} (strict-match) |")  # fmt: skip
    overall = sum(o == f for o, f in zip(ours_ok, flex))
    print(f"\nidentical completions: {len(same)}/{len(ids)}; verdicts agree on {len(agree)}/"
          f"{len(same)} of them, {overall}/{len(ids)} in all (vs flexible-extract)")  # fmt: skip
    for i in same:
        if ours_ok[i] != flex[i]:
            rec = by_sample[ids[i]]
            tail = rec["completion"][-160:]
            print(f"- {ids[i]}: ours {rec['success']} (extracted {rec['extracted']!r}), lm-eval "
                  f"{flex[i]}; gold {gsm8k_gold(golds[i])}; tail {tail!r}")  # fmt: skip


if __name__ == "__main__":
    main()
