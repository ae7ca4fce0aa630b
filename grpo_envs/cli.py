"""``grpo envs``: list, show and score registered environments (does not import torch).

    grpo envs list [--namespace math]
    grpo envs show ID [--kwargs '{"difficulty": 3}']
    grpo envs score ID --completions FILE.jsonl [--split test] [--out scores.jsonl]

``score`` reads one JSON object a line: ``{"id": ..., "completion": ...}`` (the row of that id in
``--split``) or ``{"completion": ..., "sample": {...}}`` (a full row). It prints accuracy, mean
reward and outcome counts, and writes one JSON line per completion (id, score) to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

from grpo_envs.registration import RegistryError, families, list_envs, make, spec
from grpo_envs.types import Outcome


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="grpo envs", description=__doc__.split("\n")[0], allow_abbrev=False
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p_list = sub.add_parser("list", help="registered environment ids")
    p_list.add_argument("--namespace", help="only this namespace (e.g. math)")
    p_show = sub.add_parser("show", help="spec, split sizes and a sample prompt")
    p_show.add_argument("id")
    p_show.add_argument("--kwargs", default="{}", help="JSON object of make() overrides")
    p_score = sub.add_parser("score", help="score a JSONL file of completions")
    p_score.add_argument("id")
    p_score.add_argument("--completions", required=True, type=Path)
    p_score.add_argument("--split", default="test", help="split that --completions ids refer to")
    p_score.add_argument("--out", type=Path, help="per-sample JSONL output")
    p_score.add_argument("--kwargs", default="{}", help="JSON object of make() overrides")
    p_score.add_argument("--workers", type=int, default=None, help="scoring processes")
    return parser


def _kwargs(text: str) -> dict[str, object]:
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError(f"--kwargs must be a JSON object, got {text!r}")
    return value


def _list(namespace: str | None) -> int:
    specs = list_envs(namespace)
    width = max((len(s.id) for s in specs), default=10)
    for s in specs:
        defaults = ", ".join(f"{k}={v!r}" for k, v in s.kwargs)
        print(f"{s.id:<{width}}  {s.description}" + (f"  [{defaults}]" if defaults else ""))
    for hint in families().values():
        if namespace is None or hint.startswith(f"{namespace}/"):
            print(f"{hint:<{width}}  (family: any task name)")
    return 0


def _show(env_id: str, overrides: dict[str, object]) -> int:
    env_spec = spec(env_id)
    print(f"id:          {env_spec.id}")
    print(f"entry point: {env_spec.entry_point}")
    print(f"defaults:    {dict(env_spec.kwargs)}")
    if env_spec.description:
        print(f"description: {env_spec.description}")
    env = make(env_id, **overrides)
    first = None
    unavailable = 0
    for split in env.splits:
        try:
            ds = env.dataset(split)
        except Exception as exc:
            print(f"split {split}: unavailable ({type(exc).__name__}: {exc})")
            unavailable += 1
            continue
        print(f"split {split}: {len(ds)} rows")
        first = first or ds[0]
    if first is not None:
        print("\nsample:")
        print(f"  id:     {first['id']}")
        for message in first["prompt"]:
            print(f"  [{message['role']}] {message['content']}")
        print(f"  answer: {first['answer']}")
    return 1 if unavailable and first is None else 0


def _load_lines(path: Path) -> list[Mapping[str, object]]:
    items: list[Mapping[str, object]] = []
    with path.open(encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            item = json.loads(line)
            if not isinstance(item, dict) or "completion" not in item:
                raise ValueError(f"{path}:{number}: each line needs a 'completion' key")
            if "sample" not in item and "id" not in item:
                raise ValueError(f"{path}:{number}: each line needs an 'id' or a 'sample'")
            items.append(item)
    return items


def _score(args: argparse.Namespace) -> int:
    env = make(args.id, **_kwargs(args.kwargs))
    items = _load_lines(args.completions)
    by_id: dict[str, Mapping[str, object]] = {}
    if any("sample" not in item for item in items):
        by_id = {row["id"]: row for row in env.dataset(args.split)}
    samples: list[Mapping[str, object]] = []
    for item in items:
        if "sample" in item:
            samples.append(item["sample"])  # type: ignore[arg-type]
        elif str(item["id"]) in by_id:
            samples.append(by_id[str(item["id"])])
        else:
            raise KeyError(f"id {item['id']!r} is not in split {args.split!r} of {args.id}")
    completions = [item["completion"] for item in items]
    scores = env.score_batch(completions, samples, workers=args.workers)  # type: ignore[arg-type]
    outcomes = Counter(s.outcome.value for s in scores)
    n = len(scores)
    accuracy = sum(s.correct for s in scores) / n if n else 0.0
    mean_reward = sum(s.reward for s in scores) / n if n else 0.0
    print(f"{args.id}: {n} completions, accuracy {accuracy:.4f}, mean reward {mean_reward:.4f}")
    for outcome, count in outcomes.most_common():
        print(f"  {outcome:<14} {count}")
    # A row the scorer could not read is a problem with the input, not a wrong answer: say
    # which and why here (not only in --out), and exit non-zero so scripts notice.
    failed = [
        (number, sample, score)
        for number, (sample, score, completion) in enumerate(zip(samples, scores, completions), 1)
        if score.outcome is Outcome.ERROR or not isinstance(completion, str)
    ]
    for number, sample, score in failed[:10]:
        reason = score.details.get("reason", "no reason given")
        print(
            f"grpo envs: line {number} (id {sample.get('id')!r}) could not be scored: {reason}",
            file=sys.stderr,
        )
    if len(failed) > 10:
        print(f"grpo envs: ... and {len(failed) - 10} more such lines", file=sys.stderr)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with args.out.open("w", encoding="utf-8") as fh:
            for sample, score in zip(samples, scores):
                fh.write(json.dumps({"id": sample.get("id"), **score.to_json()}) + "\n")
        print(f"per-sample scores: {args.out}")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    """Run ``grpo envs ...``; returns the exit status (2 for usage or input errors)."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "list":
            return _list(args.namespace)
        if args.command == "show":
            return _show(args.id, _kwargs(args.kwargs))
        return _score(args)
    except (
        RegistryError,
        ValueError,
        KeyError,
        TypeError,
        FileNotFoundError,
        RuntimeError,
        json.JSONDecodeError,
    ) as exc:
        print(f"grpo envs: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
