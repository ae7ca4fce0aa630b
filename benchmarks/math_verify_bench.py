"""Score labeled math answers with grpo_envs.math and with Math-Verify, side by side.

Three sources of labeled (gold, completion, correct?) cases:

    .venv/bin/python benchmarks/math_verify_bench.py                     # the project's set
    .venv/bin/python benchmarks/math_verify_bench.py --suite PATH        # Math-Verify's own tests
    .venv/bin/python benchmarks/math_verify_bench.py --gsm8k PATH        # OpenAI's GSM8K labels
    .venv/bin/python benchmarks/math_verify_bench.py --gsm8k-reference train.jsonl  # no markers
    (add --only ours|math-verify, --show-errors, --no-batched)

* default: ``benchmarks/data/math_verify_cases.jsonl`` (GSM8K-style, MATH-style LaTeX, known
  false-positive traps, answer formats, hostile inputs).
* ``--suite PATH``: the ``tests/`` of a huggingface/Math-Verify checkout (or that folder itself),
  read as data by ``mv_suite.load_suite``. Golds and predictions go to both verifiers exactly as
  the suite gives them; Math-Verify runs each case with the options its test uses (match types,
  ``float_rounding``, ``strict``, ``allow_set_relation_comp``), ours with its defaults. Every
  disagreement with the suite's label is listed, and the cases whose label needs a non-default
  Math-Verify option are counted apart too.
* ``--gsm8k PATH``: ``example_model_solutions.jsonl`` of openai/grade-school-math (or a checkout):
  1,319 test problems x 4 model solutions, each labeled ``is_correct`` by OpenAI. Both verifiers
  get the gold's final answer (the text after its last ``A:``) and the solution text unchanged.

A false positive is a wrong completion judged correct (the costly error for RL); a false negative
a right one judged wrong. Throughput is items/s over the whole set, single process (one call after
another) and batched (2 processes: ``verify_batch(workers=2)`` for ours, a fork
``multiprocessing.Pool(2)`` for Math-Verify, whose SIGALRM timeouts need a main thread).
"""

from __future__ import annotations

import argparse
import importlib
import json
import multiprocessing
import re
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

DEFAULT_CASES = Path(__file__).parent / "data" / "math_verify_cases.jsonl"


@dataclass(frozen=True)
class Case:
    id: str
    category: str
    gold: str
    completion: str
    label: bool
    # How Math-Verify is called: its gold string and a compare_strings-style option tuple
    # (match types, float_rounding, strict, allow_set_relation_comp), or None for parse/verify
    # with defaults.
    mv_gold: str = ""
    mv_options: tuple[tuple[str, ...], int, bool, bool] | None = None
    default_options: bool = True


@dataclass(frozen=True)
class Run:
    name: str
    verdicts: list[bool]
    single_s: float | None
    batched_s: float | None


def load_cases(path: Path) -> list[Case]:
    cases = []
    with path.open() as f:
        for line in f:
            if line.strip():
                d = json.loads(line)
                cases.append(
                    Case(
                        d["id"],
                        d["category"],
                        d["gold"],
                        d["completion"],
                        bool(d["label"]),
                        mv_gold=mv_gold(d["gold"]),
                    )
                )
    return cases


def load_suite_cases(path: Path) -> list[Case]:
    from mv_suite import load_suite

    out = []
    for c in load_suite(path):
        options = (
            None
            if c.helper == "parse_verify"
            else (
                c.match_types,
                int(c.options["precision"]),  # type: ignore[call-overload]
                bool(c.options["strict"]),
                bool(c.options["allow_set_relation_comp"]),
            )
        )
        category = c.id.split("::")[0].removeprefix("test_")
        out.append(
            Case(
                c.id,
                category,
                c.gold,
                c.pred,
                c.label,
                mv_gold=c.gold,
                mv_options=options,
                default_options=c.default_options,
            )
        )
    return out


def load_gsm8k_cases(path: Path) -> list[Case]:
    """OpenAI's labeled GSM8K model solutions (1,319 problems x 4 models)."""
    if path.is_dir():
        found = sorted(path.rglob("example_model_solutions.jsonl"))
        if not found:
            raise FileNotFoundError(f"no example_model_solutions.jsonl under {path}")
        path = found[0]
    out = []
    with path.open() as f:
        for i, line in enumerate(f):
            if not line.strip():
                continue
            row = json.loads(line)
            final = row["ground_truth"].rsplit("A:", 1)[-1].strip()
            for model in (
                "6b_finetuning",
                "6b_verification",
                "175b_finetuning",
                "175b_verification",
            ):
                sol = row[model]
                out.append(
                    Case(
                        f"gsm8k-{i:04d}-{model}",
                        model,
                        final,
                        sol["solution"],
                        bool(sol["is_correct"]),
                        mv_gold=final,
                    )
                )
    return out


_CALCULATOR = re.compile(r"<<[^>]*>>")


def load_gsm8k_reference_cases(path: Path) -> list[Case]:
    """GSM8K's own reference solutions as completions with no answer marker, all labeled right.

    The ``#### N`` line is cut off and the calculator annotations (``<<48/2=24>>``) are removed,
    so what is left is worked prose whose final sentence states the answer: a measure of the
    loose rule's false negatives on real arithmetic chains of thought (checks, substitutions,
    ordinals, "or" in the last sentence).
    """
    out = []
    with path.open() as f:
        for i, line in enumerate(f):
            if not line.strip():
                continue
            row = json.loads(line)
            solution, _, final = row["answer"].rpartition("####")
            prose = _CALCULATOR.sub("", solution).strip()
            out.append(
                Case(f"gsm8k-ref-{i:04d}", "reference", final.strip(), prose, True, mv_gold=final)
            )
    return out


# --- Math-Verify --------------------------------------------------------------------------


def mv_gold(gold: str) -> str:
    if "####" in gold:
        return gold.split("####")[-1].strip()
    if "$" in gold or "\\boxed" in gold:
        return gold
    return f"${gold}$"


MVItem = tuple[str, str, tuple[tuple[str, ...], int, bool, bool] | None]


def mv_one(item: MVItem) -> bool:
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    gold, completion, options = item
    try:
        if options is None:
            return bool(verify(parse(gold), parse(completion)))
        match_types, precision, strict, allow_set_rel = options
        # The same extraction targets Math-Verify's own suite helper (compare_strings) builds.
        targets: list[LatexExtractionConfig | ExprExtractionConfig] = []
        for kind in match_types:
            if kind == "latex":
                targets.append(LatexExtractionConfig(boxed_match_priority=0))
            elif kind == "expr":
                targets.append(ExprExtractionConfig())
        return bool(
            verify(
                parse(gold, targets),
                parse(completion, targets),
                float_rounding=precision,
                strict=strict,
                allow_set_relation_comp=allow_set_rel,
            )
        )
    except Exception:
        return False


def run_math_verify(
    cases: list[Case], batched: bool, workers: int, *, suite_options: bool = False
) -> Run:
    """Math-Verify's parse/verify with its defaults, or (``suite_options``) as its suite does."""
    import math_verify  # noqa: F401 - imported before forking, so workers start warm

    items: list[MVItem] = [
        (c.mv_gold, c.completion, c.mv_options if suite_options else None) for c in cases
    ]
    mv_one(("1", "1", None))  # warm up its parser
    batched_s = None
    pooled: list[bool] = []
    if batched:
        # Forked before the single-process run, so no cache it fills is inherited.
        ctx = multiprocessing.get_context("fork")
        with ctx.Pool(workers) as pool:
            pool.map(mv_one, [("1", "1", None)] * workers)  # warm
            t0 = time.perf_counter()
            pooled = pool.map(mv_one, items, chunksize=4)
            batched_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    single = [mv_one(it) for it in items]
    single_s = time.perf_counter() - t0
    if batched and pooled != single:
        diff = sum(a != b for a, b in zip(pooled, single))
        print(f"note: math-verify pooled and single runs disagree on {diff} items (timeouts)")
    name = "mv, suite opts" if suite_options else "math-verify"
    return Run(name, single, single_s, batched_s)


# --- ours ---------------------------------------------------------------------------------


def _cold_start(workers: int) -> None:
    """Fresh workers and empty caches, so no run profits from the previous one."""
    from grpo_envs.math.pool import get_pool, shutdown_pool

    # (the submodule, not the function of the same name that grpo_envs.math exports)
    verify_module = importlib.import_module("grpo_envs.math.verify")
    shutdown_pool()
    verify_module._gold_node.cache_clear()
    get_pool(workers).warm_up()


def run_ours(cases: list[Case], batched: bool, workers: int, timeout_s: float) -> Run:
    from grpo_envs.math import verify, verify_batch

    _cold_start(workers)
    t0 = time.perf_counter()
    single = [verify(c.gold, c.completion, timeout_s).correct for c in cases]
    single_s = time.perf_counter() - t0
    batched_s = None
    if batched:
        _cold_start(workers)
        t0 = time.perf_counter()
        results = verify_batch(
            [c.gold for c in cases], [c.completion for c in cases], timeout_s, workers=workers
        )
        batched_s = time.perf_counter() - t0
        pooled = [r.correct for r in results]
        if pooled != single:
            diff = sum(a != b for a, b in zip(pooled, single))
            print(f"note: ours batched and single runs disagree on {diff} items (timeouts)")
    return Run("grpo_envs.math", single, single_s, batched_s)


# --- report -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Metrics:
    accuracy: float
    false_pos: int
    false_neg: int
    errors_by_category: dict[str, int]


def score(cases: list[Case], verdicts: list[bool]) -> Metrics:
    fp = sum(1 for c, v in zip(cases, verdicts) if v and not c.label)
    fn = sum(1 for c, v in zip(cases, verdicts) if c.label and not v)
    by_cat = Counter(c.category for c, v in zip(cases, verdicts) if v != c.label)
    acc = 1 - (fp + fn) / len(cases)
    return Metrics(acc, fp, fn, dict(by_cat))


def rate(n: int, seconds: float | None) -> str:
    return f"{n / seconds:,.0f}" if seconds else "-"


def print_table(cases: list[Case], runs: list[Run]) -> None:
    n = len(cases)
    cats = sorted({c.category for c in cases})
    n_right = sum(c.label for c in cases)
    print(
        f"\n{n} cases ({n_right} correct, {n - n_right} wrong); "
        f"categories: {dict(Counter(c.category for c in cases))}\n"
    )
    cols = ["accuracy", "errors", "FP", "FN", "items/s 1p", "items/s 2p"]
    widths = [9, 8, 5, 5, 12, 12]
    header = f"{'verifier':<16}" + "".join(f"{c:>{w}}" for c, w in zip(cols, widths))
    print(header)
    print("-" * len(header))
    for run in runs:
        m = score(cases, run.verdicts)
        cells = [
            f"{m.accuracy:.3f}",
            m.false_pos + m.false_neg,
            m.false_pos,
            m.false_neg,
            rate(n, run.single_s),
            rate(n, run.batched_s),
        ]
        print(f"{run.name:<16}" + "".join(f"{c:>{w}}" for c, w in zip(cells, widths)))
    for run in runs:
        errs = score(cases, run.verdicts).errors_by_category
        print(
            f"errors by category, {run.name}: " + ", ".join(f"{c}={errs.get(c, 0)}" for c in cats)
        )
    if len(runs) >= 2 and runs[0].batched_s and runs[1].batched_s:
        print(
            f"batched speed-up of {runs[0].name} over {runs[1].name}: "
            f"{runs[1].batched_s / runs[0].batched_s:.1f}x"
        )


def print_disagreements(cases: list[Case], runs: list[Run]) -> None:
    """Every case where a verifier differs from the label, with both verdicts."""
    print(
        "\ncases where a verifier differs from the label (label; "
        + ", ".join(r.name for r in runs)
        + "):"
    )
    for i, c in enumerate(cases):
        verdicts = [r.verdicts[i] for r in runs]
        if any(v != c.label for v in verdicts):
            marks = " ".join(("FP" if v else "FN") if v != c.label else "ok" for v in verdicts)
            opt = "" if c.default_options else " [non-default MV option]"
            print(
                f"  {c.id}{opt}: label={int(c.label)} -> {marks}\n"
                f"      gold={c.gold[-80:]!r}\n      pred={c.completion[-120:]!r}"
            )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--cases", type=Path, default=DEFAULT_CASES, help="labeled jsonl")
    src.add_argument("--suite", type=Path, help="huggingface/Math-Verify checkout or its tests/")
    src.add_argument("--gsm8k", type=Path, help="openai/grade-school-math checkout or jsonl")
    src.add_argument(
        "--gsm8k-reference", type=Path, help="GSM8K train/test jsonl: reference solutions, no ####"
    )
    ap.add_argument("--only", choices=["ours", "math-verify"], default=None)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=5.0, help="our per-item timeout (seconds)")
    ap.add_argument("--no-batched", action="store_true")
    ap.add_argument("--show-errors", action="store_true")
    args = ap.parse_args(argv)
    if args.suite is not None:
        cases = load_suite_cases(args.suite)
    elif args.gsm8k is not None:
        cases = load_gsm8k_cases(args.gsm8k)
    elif args.gsm8k_reference is not None:
        cases = load_gsm8k_reference_cases(args.gsm8k_reference)
    else:
        cases = load_cases(args.cases)
    runs = []
    if args.only in (None, "ours"):
        runs.append(run_ours(cases, not args.no_batched, args.workers, args.timeout))
    if args.only in (None, "math-verify"):
        runs.append(run_math_verify(cases, not args.no_batched, args.workers))
        if args.suite is not None:
            # Math-Verify passes its own suite by construction when each case gets the helper
            # and options its test uses; the row above is what a user of its defaults gets.
            runs.append(
                run_math_verify(cases, not args.no_batched, args.workers, suite_options=True)
            )
    print_table(cases, runs)
    subset = [i for i, c in enumerate(cases) if c.default_options]
    if len(subset) < len(cases):
        print(f"\nthe {len(subset)} cases whose label needs no non-default Math-Verify option:")
        print_table(
            [cases[i] for i in subset],
            [Run(r.name, [r.verdicts[i] for i in subset], None, None) for r in runs],
        )
    if args.suite is not None or args.show_errors:
        print_disagreements(cases, runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
