"""``grpo envs``: list, show and score registered environments (does not import torch).

    grpo envs list [--namespace math]
    grpo envs show ID [--kwargs '{"difficulty": 3}']
    grpo envs check ID [--kwargs '{"path": "data/questions.jsonl"}']
    grpo envs score ID --completions FILE.jsonl [--split test] [--out scores.jsonl]

``score`` reads one JSON object a line: ``{"id": ..., "completion": ...}`` (the row of that id in
``--split``) or ``{"completion": ..., "sample": {...}}`` (a full row). It prints accuracy, mean
reward and outcome counts, and writes one JSON line per completion (id, score) to ``--out``.
"""

from __future__ import annotations

import argparse
import difflib
import inspect
import json
import sys
import typing
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import NoReturn

from grpo_envs.registration import RegistryError, families, list_envs, make, spec
from grpo_envs.types import Outcome


class ShortErrorParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line, a "did you mean" and a pointer to --help.

    argparse prints the whole usage block (dozens of lines for ``grpo train``) before the line
    that matters; the usage is one ``--help`` away.
    """

    def error(self, message: str) -> NoReturn:
        """Print the error, the closest known flags to an unknown one, and exit 2."""
        lines = [f"{self.prog}: error: {message}"]
        if message.startswith("unrecognized arguments:"):
            known = sorted(_option_strings(self))
            for word in message.split(":", 1)[1].split():
                flag = word.split("=", 1)[0]
                if not flag.startswith("-"):
                    continue
                close = difflib.get_close_matches(flag, known, n=3, cutoff=0.6)
                if close:
                    lines.append(f"{self.prog}: {flag}: did you mean {' or '.join(close)}?")
        lines.append(f"{self.prog} --help lists every option")
        self.exit(2, "\n".join(lines) + "\n")


def _option_strings(parser: argparse.ArgumentParser) -> set[str]:
    """Every flag of ``parser`` and of its sub-commands (an unknown one is reported at the top)."""
    found: set[str] = set()
    for action in parser._actions:
        found.update(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                found |= _option_strings(child)
    return found


def _parser() -> argparse.ArgumentParser:
    parser = ShortErrorParser(
        prog="grpo envs", description=__doc__.split("\n")[0], allow_abbrev=False
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=ShortErrorParser)
    p_list = sub.add_parser("list", help="registered environment ids")
    p_list.add_argument("--namespace", help="only this namespace (e.g. math)")
    p_show = sub.add_parser(
        "show", help="spec, the arguments make() takes (with defaults), split sizes, a sample"
    )
    p_show.add_argument("id", help="an environment id, or MODULE:ID to import MODULE first")
    p_show.add_argument("--kwargs", default="{}", help="JSON object of make() overrides")
    p_check = sub.add_parser(
        "check",
        help="run the contract checker (check_env): splits, reference solutions, hostile "
        "completions, determinism; says what it checked",
    )
    p_check.add_argument("id", help="an environment id, or MODULE:ID to import MODULE first")
    p_check.add_argument("--kwargs", default="{}", help="JSON object of make() overrides")
    p_score = sub.add_parser("score", help="score a JSONL file of completions")
    p_score.add_argument("id")
    p_score.add_argument(
        "--completions",
        required=True,
        type=Path,
        help='JSONL, one object a line: {"id": ROW_ID, "completion": TEXT} (the row of that id '
        'in --split) or {"completion": TEXT, "sample": {...a full row...}}',
    )
    p_score.add_argument("--split", default="test", help="split that --completions ids refer to")
    p_score.add_argument("--out", type=Path, help="per-sample JSONL output")
    p_score.add_argument("--kwargs", default="{}", help="JSON object of make() overrides")
    p_score.add_argument("--workers", type=int, default=None, help="scoring processes")
    from grpo_envs.code.backend import add_sandbox_arguments

    add_sandbox_arguments(p_score)
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


def factory_arguments(factory: object) -> list[str]:
    """Describe the arguments an environment factory (function or class) takes, with defaults.

    A function that passes ``**kwargs`` on to the class it returns lists that class's too.

    >>> def demo(path: str, *, question: str = "question", limit: int | None = None, **options):
    ...     pass
    >>> factory_arguments(demo)
    ['path (required)', "question='question'", 'limit=None', '**options']
    """
    target = factory.__init__ if inspect.isclass(factory) else factory  # type: ignore[misc]
    try:
        params = list(inspect.signature(target).parameters.values())  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return []
    returned = None
    if not inspect.isclass(factory) and any(p.kind is p.VAR_KEYWORD for p in params):
        try:
            returned = typing.get_type_hints(factory).get("return")
        except Exception:  # an annotation that does not resolve: list what the function says
            returned = None
    if inspect.isclass(returned):
        named = {p.name for p in params}
        inner = factory_arguments(returned)
        params = [p for p in params if p.kind is not p.VAR_KEYWORD]
        extra = [a for a in inner if a.split("=")[0].split(" ")[0].lstrip("*") not in named]
        return _describe(params) + extra
    return _describe(params)


def _describe(params: list[inspect.Parameter]) -> list[str]:
    out = []
    for param in params:
        if param.name == "self":
            continue
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            out.append(f"**{param.name}")
        elif param.kind is inspect.Parameter.VAR_POSITIONAL:
            out.append(f"*{param.name}")
        elif param.default is inspect.Parameter.empty:
            out.append(f"{param.name} (required)")
        else:
            out.append(f"{param.name}={param.default!r}")
    return out


def _show(env_id: str, overrides: dict[str, object]) -> int:
    env_spec = spec(env_id)
    print(f"id:          {env_spec.id}")
    print(f"entry point: {env_spec.entry_point}")
    print(f"defaults:    {dict(env_spec.kwargs)}")
    if env_spec.description:
        print(f"description: {env_spec.description}")
    arguments = factory_arguments(env_spec.load())
    if arguments:
        print(f"arguments:   {', '.join(arguments)}")
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


def _check(env_id: str, overrides: dict[str, object]) -> int:
    from grpo_envs.checker import EnvCheckError, check_env

    env = make(env_id, **overrides)
    try:
        report = check_env(env)
    except EnvCheckError as exc:
        print(f"grpo envs: check failed: {exc}", file=sys.stderr)
        return 1
    print(report.describe())
    return 0


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
    from grpo_envs.code.backend import (
        check_sandbox_backend,
        sandbox_settings_from,
        use_remote_sandbox,
    )

    use_remote_sandbox(sandbox_settings_from(args))  # the code environments' sandbox
    env = make(args.id, **_kwargs(args.kwargs))
    check_sandbox_backend([env], args.split)
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
        if args.command == "check":
            return _check(args.id, _kwargs(args.kwargs))
        return _score(args)
    except ModuleNotFoundError as exc:
        print(
            f"grpo envs: {args.id}: cannot import module {exc.name!r}; put it on PYTHONPATH "
            "(or pip install it), or check the spelling of MODULE:ID",
            file=sys.stderr,
        )
        return 2
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
