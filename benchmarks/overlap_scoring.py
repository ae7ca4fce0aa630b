"""Scoring overlapped with generation: one collection step with slow code tests, both ways.

The step is the trainer's (``Collector.sample_batch``): ``--prompts`` tasks x ``--generations``
completions, scored by the real code environment (``code/mbpp-v0`` on local rows, in the sandbox
with ``--workers`` workers) whose test calls a function that sleeps ``--test_seconds``; every
completion is a distinct program, so each runs (a group's repeated programs would run once).
The completions come from an engine that finishes one prompt's group every ``--group_seconds``,
as an engine decoding at a steady rate reports them (the hf engine per chunk of rows, a server
per replica's share); a stand-in so that the ratio shows the scoring, not this machine's
decoding speed.

Each round runs the step with ``overlap_scoring`` off, then on (alternating, after one warm-up
step that starts the sandbox), and the table shows medians over ``--rounds``: ``generate``, the
engine's call; ``score``, the wait for scores after it; ``hidden``, scoring seconds that ran
under generation (``time/score_overlapped``); ``step``, the wall time; and the ratio to the
step without overlap::

    python benchmarks/overlap_scoring.py                        # 4 x 4, 1 s tests, 2 s a group
    python benchmarks/overlap_scoring.py --group_seconds 0.5    # generation shorter than scoring

The expected step: max(generation, scoring) + scoring one group, against their sum. Tests that
sleep leave the CPUs to the engine; CPU-bound tests compete with a CPU engine (not a GPU one).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from grpo_train.rollout.base import Completion, SamplingConfig  # noqa: E402

ENTRY = "slow_id"


def program(seconds: float, tag: str, right: bool) -> str:
    """A completion: a fenced function that sleeps ``seconds`` (``tag`` makes it distinct)."""
    value = "x" if right else "x + 1"
    return (
        f"```python\ndef {ENTRY}(x):\n    import time\n\n    time.sleep({seconds})  # {tag}\n"
        f"    return {value}\n```"
    )


class SteadyEngine:
    """Reports one prompt's group every ``group_seconds``: ``n`` distinct slow programs each."""

    name = "steady"
    last_sync_seconds = 0.0

    def __init__(self, group_seconds: float, test_seconds: float) -> None:
        self.group_seconds, self.test_seconds = group_seconds, test_seconds
        self.calls = 0

    def generate(
        self,
        prompt_token_ids: Sequence[Sequence[int]],
        sampling: SamplingConfig,
        on_done: Callable[[int, list[Completion]], None] | None = None,
    ) -> list[list[Completion]]:
        """Sleep ``group_seconds`` per prompt, then report its group."""
        self.calls += 1
        results: list[list[Completion]] = []
        for i in range(len(prompt_token_ids)):
            time.sleep(self.group_seconds)
            group = [
                Completion(
                    i,
                    program(self.test_seconds, f"call {self.calls} prompt {i} sample {j}", j != 0),
                    (1,),
                    (-0.1,),
                    "stop",
                )
                for j in range(sampling.n)
            ]
            results.append(group)
            if on_done is not None:
                on_done(i, group)
        return results


def write_tasks(path: Path, count: int) -> None:
    """``count`` MBPP-shaped rows whose one test calls ``slow_id``."""
    rows = [
        {
            "task_id": k,
            "text": f"Return x (task {k}).",
            "code": f"def {ENTRY}(x):\n    return x\n",
            "test_list": [f"assert {ENTRY}({k}) == {k}"],
        }
        for k in range(count)
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


@dataclass(frozen=True)
class Step:
    """One measured step."""

    generate: float
    score: float
    hidden: float
    wall: float
    rewards: tuple[float, ...]


def make_collector(args: argparse.Namespace, tasks: Path, tokenizer: Any, overlap: bool) -> Any:
    """A ``Collector`` over the slow MBPP rows with the steady engine."""
    from grpo_envs.envs.mbpp import MBPPEnv
    from grpo_train.collect.collector import Collector, CollectorSettings
    from grpo_train.collect.training_prompts import PromptSettings, TrainingPrompts
    from grpo_train.episodes.prompts import PromptFormat
    from grpo_train.parallel.distributed import RankInfo

    env = MBPPEnv(
        data_files={"train": str(tasks)},
        calibrate=False,
        default_test_timeout_s=4 * args.test_seconds + 2,
        workers=args.workers,
    )
    settings = CollectorSettings(
        prompts_per_step=args.prompts, num_generations=args.generations,
        max_prompt_length=256, max_completion_length=64, max_turn_tokens=0, temperature=1.0,
        top_p=1.0, seed=0, seed_per_prompt=False, tensor_parallel=1, history_policy="keep",
        fatal_template_breaks=False, dynamic_sampling_rounds=0, curriculum_threshold=0.6,
        max_reward_errors=0.5, overlap_scoring=overlap,
    )  # fmt: skip
    prompts = TrainingPrompts([[env]], [0], ["slow-mbpp"], [1.0], PromptSettings(), seed=0)
    engine = SteadyEngine(args.group_seconds, args.test_seconds)
    rank = RankInfo(rank=0, world_size=1, local_rank=0)
    return Collector(settings, prompts, engine, tokenizer, PromptFormat(), rank, tasks.parent)


def run_step(collector: Any, step: int) -> Step:
    """Collect one step's groups; its times and rewards."""
    times: defaultdict[str, float] = defaultdict(float)
    collector.score_overlapped_s = 0.0
    start = time.perf_counter()
    groups = collector.collect(collector.settings.prompts_per_step, step, 0, times)
    wall = time.perf_counter() - start
    rewards = tuple(s.reward for g in groups for s in g.scores)
    return Step(times["generate"], times["score"], collector.score_overlapped_s, wall, rewards)


def main(argv: Sequence[str] | None = None) -> int:
    """Print the side-by-side table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--generations", type=int, default=4)
    parser.add_argument("--test_seconds", type=float, default=1.0)
    parser.add_argument("--group_seconds", type=float, default=2.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the medians here")
    args = parser.parse_args(argv)

    from grpo_train.models.loading import build_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(build_tiny_model(Path(tmp) / "tiny", seed=0))
        tasks = Path(tmp) / "tasks.jsonl"
        write_tasks(tasks, 4 * args.prompts)
        collectors = {mode: make_collector(args, tasks, tokenizer, mode) for mode in (False, True)}
        run_step(collectors[False], 0)  # warm-up: the sandbox starts
        steps: dict[bool, list[Step]] = {False: [], True: []}
        for round_ in range(1, args.rounds + 1):
            for overlap in (False, True):  # the same prompts and programs for both
                steps[overlap].append(run_step(collectors[overlap], round_))
        load = os.getloadavg()[0]

    rows = {}
    for overlap, measured in steps.items():
        rows[overlap] = {
            key: statistics.median(getattr(s, key) for s in measured)
            for key in ("generate", "score", "hidden", "wall")
        }
    same = all(a.rewards == b.rewards for a, b in zip(steps[False], steps[True]))
    completions = args.prompts * args.generations
    print(
        f"{args.prompts} prompts x {args.generations} completions, tests of "
        f"{args.test_seconds:g} s on {args.workers} sandbox workers, a group every "
        f"{args.group_seconds:g} s; medians of {args.rounds} rounds; load {load:.1f}"
    )
    print(f"rewards equal with and without overlap: {same} ({completions} per step)")
    print("| overlap_scoring | generate s | score s (wait) | hidden s | step s | vs off |")
    print("|---|---:|---:|---:|---:|---:|")
    for overlap in (False, True):
        r = rows[overlap]
        ratio = r["wall"] / rows[False]["wall"]
        print(
            f"| {'on' if overlap else 'off'} | {r['generate']:.2f} | {r['score']:.2f} | "
            f"{r['hidden']:.2f} | {r['wall']:.2f} | {ratio:.2f}x |"
        )
    if args.json:
        record = {"args": {k: str(v) for k, v in vars(args).items()}, "load": load, "same": same}
        record["medians"] = {("on" if k else "off"): v for k, v in rows.items()}
        args.json.write_text(json.dumps(record, indent=1) + "\n")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
