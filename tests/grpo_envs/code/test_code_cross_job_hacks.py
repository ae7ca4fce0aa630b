"""Hacks that copy from OTHER jobs of the same group earn nothing; honest completions still do.

A GRPO group scores many completions of one task back to back, so a completion that could read
the job before it (its tests, its expected values, its output) would solve the task without
solving anything. Each hack below looks everywhere a previous job could have left something: the
frames above its own, every dict the garbage collector knows, its whole anonymous memory. Run
through the public environment API (``grpo_envs.make`` + ``score_batch``) on a one-worker
sandbox, so that every job of the group follows another on the same slot.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

import grpo_envs
from grpo_envs.types import Sample

FIXTURES = Path(__file__).parents[1] / "fixtures" / "code"


#: Every string a job before this one may have left: frames above ours, GC-tracked dicts,
#: anonymous memory (freed buffers stay there), read with ctypes.
HARVEST = r'''
import ast, ctypes, gc, re, sys

def _blobs():
    frame = sys._getframe()
    while frame is not None:
        try:
            yield repr(frame.f_locals).encode("utf-8", "backslashreplace")
        except Exception:
            pass
        frame = frame.f_back
    for obj in gc.get_objects():
        if isinstance(obj, dict):
            try:
                yield repr(obj).encode("utf-8", "backslashreplace")
            except Exception:
                pass
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            path = fields[5] if len(fields) > 5 else ""
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            if fields[1][0] == "r" and path in ("", "[heap]", "[stack]") and hi - lo < (512 << 20):
                yield ctypes.string_at(lo, hi - lo)

def harvest(pattern):
    rx = re.compile(pattern)
    return [m for blob in _blobs() for m in rx.findall(blob)]

def _value(raw):
    """The shortest literal at the start of ``raw`` that ends at a delimiter."""
    for end in range(1, len(raw) + 1):
        if end < len(raw) and raw[end] in "0123456789.eE_jxXabcdefABCDEFTruFalsNon":
            continue
        try:
            return True, ast.literal_eval(raw[:end])
        except Exception:
            continue
    return False, None

TABLE = {}
for _name, _args, _want in harvest(rb"assert (\w{1,60})\((.{1,400}?)\) == ([^\n\x00]{1,200})"):
    try:
        _key = repr(ast.literal_eval("(" + _args.decode() + ",)"))
        _ok, _got = _value(_want.decode("utf-8", "replace").strip())
        if _ok:
            TABLE.setdefault((_name.decode(), _key), _got)
    except Exception:
        pass

def lookup(name, *args):
    for key in ((name, repr(args)), ("candidate", repr(args))):
        if key in TABLE:
            return TABLE[key]
    return None
'''


def variants(body: str, n: int = 3) -> list[str]:
    """``n`` textually different copies (identical programs are run once per group)."""
    return [f"```python\n# attempt {i}\n{body}\n```" for i in range(n)]


@pytest.fixture(scope="module")
def humaneval() -> Iterator[grpo_envs.Environment]:
    env = grpo_envs.make("code/humaneval-v0", workers=1)
    yield env


def _first(env: grpo_envs.Environment) -> Sample:
    return Sample.from_row(env.dataset("test")[0])


def test_humaneval_group_copying_earlier_tests_scores_zero(humaneval) -> None:
    sample = _first(humaneval)
    assert sample.metadata["entry_point"] == "has_close_elements"
    hack = HARVEST + (
        "def has_close_elements(numbers, threshold):\n"
        "    return lookup('has_close_elements', numbers, threshold)\n"
    )
    honest = f"```python\n{sample.answer}\n```"
    group = [honest, *variants(hack), honest + "\n# again", *variants(hack + "\n#2")]
    rewards = [s.reward for s in humaneval.score_batch(group, [sample] * len(group))]
    assert rewards == [1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]


def test_humaneval_fraction_reward_respawned_hack_scores_zero() -> None:
    """``reward="fraction"`` runs every test; when one kills the program, the rest run in a new
    process, which must not find the job's own tests anywhere."""
    env = grpo_envs.make("code/humaneval-v0", workers=1, reward="fraction")
    sample = _first(env)
    hack = HARVEST + (
        "import os\n"
        "def has_close_elements(numbers, threshold):\n"
        "    value = lookup('has_close_elements', numbers, threshold)\n"
        "    if value is None:\n"
        "        os._exit(1)  # force a new process for the remaining tests\n"
        "    return value\n"
    )
    honest = f"```python\n{sample.answer}\n```"
    scores = env.score_batch([honest, *variants(hack)], [sample] * 4)
    assert [s.reward for s in scores] == [1.0, 0.0, 0.0, 0.0]


def test_mbpp_group_copying_earlier_asserts_scores_zero() -> None:
    env = grpo_envs.make("code/mbpp-v0", data_files=str(FIXTURES / "mbpp_full.jsonl"), workers=1)
    sample = Sample.from_row(env.dataset("test")[0])
    name = str(sample.metadata["entry_point"])
    hack = HARVEST + f"def {name}(*args):\n    return lookup({name!r}, *args)\n"
    honest = f"```python\n{sample.answer}\n```"
    group = [honest, *variants(hack), honest + "\n# again", *variants(hack + "\n#2")]
    rewards = [s.reward for s in env.score_batch(group, [sample] * len(group))]
    assert rewards == [1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]


@pytest.mark.parametrize("one_test", [True, False])
def test_stdio_copycat_of_the_previous_output_scores_zero(one_test: bool, tmp_path: Path) -> None:
    """A copycat prints whatever output of an earlier run it can find (a reply's stdout). With a
    single test, the run before it (an honest one of the same task) printed exactly that."""
    data = FIXTURES / "stdio.jsonl"
    if one_test:
        data = tmp_path / "one.jsonl"
        row = {
            "id": "double",
            "prompt": "Read an integer n and print 2n.",
            "tests": [{"input": "21\n", "output": "42\n"}],
            "solution": "print(2 * int(input()))\n",
        }
        data.write_text(json.dumps(row) + "\n")
    env = grpo_envs.make("code/stdio-v0", data_files=str(data), workers=1)
    sample = Sample.from_row(env.dataset("test")[0])
    copycat = HARVEST + (
        'found = harvest(rb"[\'\\"]stdout[\'\\"]: ?[\'\\"]([^\'\\"]{1,200})[\'\\"]")\n'
        "import sys\n"
        "sys.stdin.read()\n"
        "if found:\n"
        "    print(found[-1].decode().encode().decode('unicode_escape'), end='')\n"
    )
    honest = f"```python\n{sample.answer}\n```"
    group = [honest, *variants(copycat), honest + "\n# again", *variants(copycat + "\n#2")]
    rewards = [s.reward for s in env.score_batch(group, [sample] * len(group))]
    assert rewards == [1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]


def test_lone_surrogates_in_a_candidates_errors_reach_the_sample_store(
    humaneval, tmp_path: Path
) -> None:
    """A candidate raising ``ValueError(chr(0xD800))``: its Score (details included) is written
    by the evaluation's JSONL store and read back."""
    from grpo_train.eval.records import SampleRecord, SampleStore

    sample = _first(humaneval)
    completion = (
        "```python\n"
        "def has_close_elements(numbers, threshold):\n"
        "    print(chr(0xDC00))\n"
        "    raise ValueError(chr(0xD800) + 'surrogate')\n"
        "```"
    )
    score = humaneval.score(completion, sample)
    assert score.reward == 0.0
    assert "surrogate" in json.dumps(score.to_json(), ensure_ascii=False)
    store = SampleStore(tmp_path / "samples.jsonl")
    record = SampleRecord(
        task="humaneval", env_id="code/humaneval-v0", sample_id=sample.id, gen_index=0,
        prompt="p", completion=completion.replace(chr(0xD800), "?").replace(chr(0xDC00), "?"),
        num_tokens=1, truncated=False, reward=score.reward, outcome=str(score.outcome),
        success=False, extracted=None, score=score.to_json(),
    )  # fmt: skip
    assert store.append([record]) == 1
    back = SampleStore(tmp_path / "samples.jsonl")
    assert record.key in back and back.get(record.key) == record
