"""Throughput: a 3-turn step against a single-turn step that samples the same number of tokens.

Both steps run in one process on the same engine (HF, and vLLM when installed), with the same
prompts, group size and sampling; the single-turn step samples ``turns x turn_tokens`` tokens per
completion in one call, the multi-turn step plays ``turns`` turns of ``turn_tokens`` tokens through
``grpo_train.episodes.driver.generate_episodes`` (one engine call per turn over every live
episode, the environment's replies stepped and rendered into the token history between calls)::

    python benchmarks/multiturn_bench.py                     # hf (+ vllm if installed)
    python benchmarks/multiturn_bench.py --engines hf --repeats 5

Same sampled tokens, by construction: the model has the embedded SmolLM2-135M-Instruct's
architecture and tokenizer with random weights (seeded), which almost never samples EOS, so
every turn runs to its token cap and every episode of ``math/add2-feedback-v0`` (the answer is
never right) plays all its turns. The compute per token is the real model's; the table shows the
sampled tokens of each step so that the premise is checked, not assumed. ``--weights trained``
uses the real weights instead (lengths then differ; compare the per-token column).

Where the time goes (columns): ``generate`` is the time inside the engine's calls, ``env`` the
environments' steps (scoring each turn, writing the feedback), ``render`` the chat-template
rendering and checking of each reply (``render_continuation``), ``other`` the rest (assembly).
The steps alternate ``--repeats`` times and the median of each is shown: the machine may be
shared, so say its load (printed) beside the numbers.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: The goal: a multi-turn step costs at most this much the single-turn step of the same tokens.
GOAL_RATIO = 1.3


@dataclass
class Clock:
    """Seconds spent per part of a step."""

    parts: dict[str, float] = field(default_factory=dict)
    calls: int = 0

    def add(self, part: str, seconds: float) -> None:
        """Add ``seconds`` to ``part``."""
        self.parts[part] = self.parts.get(part, 0.0) + seconds


class TimedEngine:
    """An engine whose ``generate`` calls are timed (everything else is passed through)."""

    def __init__(self, engine: Any, clock: Clock) -> None:
        self.engine, self.clock = engine, clock

    def generate(self, prompts: Sequence[Sequence[int]], sampling: Any) -> Any:
        """Time the inner engine's call."""
        start = time.perf_counter()
        try:
            return self.engine.generate(prompts, sampling)
        finally:
            self.clock.add("generate", time.perf_counter() - start)
            self.clock.calls += 1

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)


class TimedEpisodes:
    """An episodic environment whose steps are timed."""

    def __init__(self, env: Any, clock: Clock) -> None:
        self.env, self.clock, self.budget = env, clock, env.budget

    def start(self, sample: Any) -> Any:
        """Start an episode."""
        return self.env.start(sample)

    def step(self, state: Any, turn: str, *, tokens: int = 0) -> Any:
        """Time the inner step."""
        start = time.perf_counter()
        try:
            return self.env.step(state, turn, tokens=tokens)
        finally:
            self.clock.add("env", time.perf_counter() - start)

    def score_episode(self, state: Any) -> Any:
        """Score the episode."""
        return self.env.score_episode(state)


def timed_renderer(tokenizer: Any, clock: Clock) -> Any:
    """Return an ``EpisodeRenderer`` whose reply rendering is timed."""
    from grpo_train.episodes.driver import EpisodeRenderer

    class Timed(EpisodeRenderer):
        def continuation(self, state: Any, completions: Any) -> Any:
            start = time.perf_counter()
            try:
                return super().continuation(state, completions)
            finally:
                clock.add("render", time.perf_counter() - start)

    return Timed(tokenizer)


def model_folder(weights: str, out: Path) -> Path:
    """The embedded model's folder, or its architecture with seeded random weights."""
    from grpo_train.models.loading import default_model_path

    real = default_model_path()
    if weights == "trained":
        return real
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(real))
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(real).save_pretrained(out)
    return out


@dataclass(frozen=True)
class Run:
    """One timed step."""

    kind: str
    wall_s: float
    sampled_tokens: int
    engine_calls: int
    parts: dict[str, float]
    turns_mean: float = 1.0


def single_turn_step(engine: Any, prompt_ids: list[list[int]], sampling: Any) -> Run:
    """One call: every completion samples up to ``turns x turn_tokens`` tokens."""
    clock = Clock()
    start = time.perf_counter()
    groups = TimedEngine(engine, clock).generate(prompt_ids, sampling)
    wall = time.perf_counter() - start
    tokens = sum(len(c.token_ids) for g in groups for c in g)
    return Run("1 turn", wall, tokens, clock.calls, clock.parts)


def multi_turn_step(
    engine: Any, tokenizer: Any, env: Any, samples: list[Any], prompt_ids: list[list[int]],
    sampling: Any, turns: int,
) -> Run:  # fmt: skip
    """Play the group's episodes of ``turns`` turns of ``sampling.max_new_tokens`` tokens."""
    from grpo_envs.episode import episodic
    from grpo_train.episodes.driver import EpisodeSettings, generate_episodes

    clock = Clock()
    episodes = TimedEpisodes(episodic(env), clock)
    # Room for every turn and the environment's replies (about 30 ids each).
    settings = EpisodeSettings(max_episode_tokens=turns * (sampling.max_new_tokens + 64))
    start = time.perf_counter()
    groups = generate_episodes(
        TimedEngine(engine, clock),
        timed_renderer(tokenizer, clock),
        [episodes] * len(samples),
        samples,
        prompt_ids,
        sampling,
        settings,
    )
    wall = time.perf_counter() - start
    rollouts = [r for g in groups for r in g]
    tokens = sum(r.sampled_tokens for r in rollouts)
    turns_mean = sum(r.turns for r in rollouts) / len(rollouts)
    return Run(f"{turns} turns", wall, tokens, clock.calls, clock.parts, turns_mean)


def bench_engine(name: str, folder: Path, args: argparse.Namespace) -> list[Run]:
    """Alternate the two steps ``args.repeats`` times on one engine; return every run."""
    from dataclasses import replace

    import grpo_envs
    from grpo_envs.types import Sample
    from grpo_train.episodes.driver import EpisodeRenderer
    from grpo_train.rollout import make_engine
    from grpo_train.rollout.base import SamplingConfig

    budget = args.turns * (args.turn_tokens + 64) + 256
    extra = {"max_model_len": budget} if name == "vllm" else {}
    engine = make_engine(name, folder, dtype="float32", **extra)
    try:
        tokenizer = engine.tokenizer if hasattr(engine, "tokenizer") else None
        if tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(folder)
        env = grpo_envs.make("math/add2-feedback-v0", max_turns=args.turns, test_size=64)
        samples = [Sample.from_row(r) for r in env.dataset("test").select(range(args.prompts))]
        renderer = EpisodeRenderer(tokenizer)
        prompt_ids = [renderer.prompt_ids(s) for s in samples]
        turn = SamplingConfig(n=args.group, max_new_tokens=args.turn_tokens, temperature=1.0)
        whole = replace(turn, max_new_tokens=args.turns * args.turn_tokens)
        single_turn_step(engine, prompt_ids, replace(whole, n=1))  # warm-up (not timed)
        runs = []
        for i in range(args.repeats):
            order = ("single", "multi") if i % 2 == 0 else ("multi", "single")
            for kind in order:
                seeded_turn, seeded_whole = replace(turn, seed=i), replace(whole, seed=i)
                if kind == "single":
                    runs.append(single_turn_step(engine, prompt_ids, seeded_whole))
                else:
                    runs.append(
                        multi_turn_step(
                            engine, tokenizer, env, samples, prompt_ids, seeded_turn, args.turns
                        )
                    )
                done = runs[-1]
                print(f"{name} {done.kind}: {done.wall_s:.2f} s", file=sys.stderr, flush=True)
        return runs
    finally:
        engine.close()


def median_run(runs: Sequence[Run]) -> Run:
    """The run of median wall time (its parts are that run's)."""
    ordered = sorted(runs, key=lambda r: r.wall_s)
    return ordered[len(ordered) // 2]


def table(results: dict[str, list[Run]]) -> str:
    """The side-by-side table: per engine, the single-turn and multi-turn step and their ratio."""
    head = (
        "| engine | step | sampled tokens | turns | engine calls | wall s | generate s | env s "
        "| render s | other s | ms / token | ratio |\n"
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    )
    lines = [head]
    for engine, runs in results.items():
        single = median_run([r for r in runs if r.kind == "1 turn"])
        multi = median_run([r for r in runs if r.kind != "1 turn"])
        for run in (single, multi):
            parts = run.parts
            other = run.wall_s - sum(parts.values())
            ratio = run.wall_s / single.wall_s
            lines.append(
                f"| {engine} | {run.kind} | {run.sampled_tokens} | {run.turns_mean:.2f} "
                f"| {run.engine_calls} | {run.wall_s:.2f} | {parts.get('generate', 0.0):.2f} "
                f"| {parts.get('env', 0.0):.3f} | {parts.get('render', 0.0):.3f} | {other:.3f} "
                f"| {1000 * run.wall_s / max(run.sampled_tokens, 1):.2f} | {ratio:.2f}x |"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print the table."""
    from grpo_train.rollout.vllm_engine import vllm_available

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", nargs="+", default=None, choices=("hf", "vllm"))
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--turn-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (both steps)")
    parser.add_argument("--weights", choices=("random", "trained"), default="random")
    args = parser.parse_args(argv)
    engines = args.engines or (["hf", "vllm"] if vllm_available() else ["hf"])
    import torch

    torch.set_num_threads(args.threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    results: dict[str, list[Run]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = model_folder(args.weights, Path(tmp) / "model")
        for name in engines:
            results[name] = bench_engine(name, folder, args)
    load = os.getloadavg()
    print(
        f"\n{args.prompts} prompts x {args.group} samples, {args.turns} turns x "
        f"{args.turn_tokens} tokens vs 1 turn x {args.turns * args.turn_tokens} tokens, "
        f"{args.weights} weights, {args.threads} thread(s), median of {args.repeats}; "
        f"load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}\n"
    )
    print(table(results))
    for engine, runs in results.items():
        single = median_run([r for r in runs if r.kind == "1 turn"]).wall_s
        multi = median_run([r for r in runs if r.kind != "1 turn"]).wall_s
        verdict = "meets" if multi / single <= GOAL_RATIO else "misses"
        print(f"{engine}: {multi / single:.2f}x ({verdict} the {GOAL_RATIO}x goal)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
