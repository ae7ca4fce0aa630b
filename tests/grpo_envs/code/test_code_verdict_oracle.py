"""A program cannot learn its own verdict, so a group of copies cannot converge on the answers.

The attack: a program that never looks at its input guesses each answer, and keeps a board
between runs (bits in the page cache of a file every run can read). If it is called again (or
run again, for stdin/stdout tasks) only after its last answer passed, it learns which guesses
were right: each copy of a GRPO group keeps the confirmed guesses and changes the first one
that was not, and a later copy passes everything. Measured before the fix: on HumanEval/0,
copies 4-8 of 8 scored 1. Both halves are closed: every test runs whatever the verdicts, and
the board is refused (seccomp). Run through ``grpo_envs.make`` on one worker, so that every
copy follows the one before it on the same slot.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

import grpo_envs
from grpo_envs.types import Sample

BITS = 64
STRIDE_PAGES = 16

#: The board (set a bit: read its page; clear it: evict the page; read it: a read that fails
#: instead of waiting for the disk), then the learner's state on it.
LEARNER = r"""
import os
PAGE = 4096
def _open():
    fd = os.open(BOARD, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
    except OSError:
        pass
    return fd
def _evict(fd, off):
    try:
        os.posix_fadvise(fd, off, PAGE, os.POSIX_FADV_DONTNEED)
    except OSError:
        pass
def read_bits():
    fd, buf, bits = _open(), bytearray(1), []
    for i in range(64):
        off = i * STRIDE * PAGE
        try:
            os.preadv(fd, [buf], off, os.RWF_NOWAIT)
            bits.append(1)
        except OSError:
            bits.append(0)
            os.pread(fd, 1, off)
            _evict(fd, off)
    os.close(fd)
    return bits
def write_bits(bits):
    fd = _open()
    for i, bit in enumerate(bits):
        off = i * STRIDE * PAGE
        if bit:
            os.pread(fd, 1, off)
        else:
            _evict(fd, off)
    os.close(fd)
FIELDS = {"k": (0, 5), "pending": (5, 1), "guess": (6, 2), "first": (8, 8), "last": (16, 5)}
def load():
    bits = read_bits()
    num = lambda lo, n: sum(bits[lo + j] << j for j in range(n))
    state = {name: num(lo, n) for name, (lo, n) in FIELDS.items()}
    state["confirmed"] = [num(24 + 2 * j, 2) for j in range(min(state["k"], 20))]
    return state
def save(state):
    bits = [0] * 64
    def put(lo, n, value):
        for j in range(n):
            bits[lo + j] = (value >> j) & 1
    for name, (lo, n) in FIELDS.items():
        put(lo, n, state[name])
    for j, choice in enumerate(state["confirmed"][:20]):
        put(24 + 2 * j, 2, choice)
    write_bits(bits)
def answer(state, i):
    # Asked again right after guessing at position k: that guess passed.
    if state["pending"] and i == state["k"] + 1:
        state["confirmed"].append(state["guess"])
        state["k"] += 1
        state["pending"] = 0
    if i < state["k"]:
        return CHOICES[state["confirmed"][i]]
    if i == state["k"]:
        state["guess"] = (state["guess"] + 1) % len(CHOICES) if state["pending"] else 0
        state["pending"] = 1
        save(state)
        return CHOICES[state["guess"]]
    return CHOICES[0]
"""

CALL_LEARNER = r"""
STATE = load()
CALLS = [0]
def ENTRY(*args):
    CALLS[0] += 1
    return answer(STATE, CALLS[0] - 1)
"""

STDIO_LEARNER = r"""
import sys
STATE = load()
data = sys.stdin.read()
mark = sum(data.encode()) % 251 + 1
if STATE["first"] in (0, mark):  # the first test of a job (its input is remembered)
    STATE["first"], i = mark, 0
else:
    i = STATE["last"] + 1
STATE["last"] = i
out = answer(STATE, i)
save(STATE)
print(out)
"""

PRIMES = [
    (2, True),
    (4, False),
    (3, True),
    (9, False),
    (13, True),
    (25, False),
    (1, False),
    (29, True),
]
IS_PRIME = (
    "def is_prime(n):\n    return n > 1 and all(n % d for d in range(2, int(n ** 0.5) + 1))\n"
)


@pytest.fixture
def board() -> Iterator[Path]:
    base = Path("/usr/local/share")
    if not os.access(base, os.W_OK):
        pytest.skip("needs a writable folder under /usr (the runs can read /usr)")
    path = base / f"grpo-verdict-board-{os.getpid()}.bin"
    with open(path, "wb") as handle:
        handle.write(b"\0" * (BITS * STRIDE_PAGES * 4096))
        handle.flush()
        os.fsync(handle.fileno())
        os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)  # all bits 0
    path.chmod(0o644)
    yield path
    path.unlink()


def _copies(program: str, n: int = 10) -> list[str]:
    """``n`` textually different copies (identical programs run once per group)."""
    return [f"```python\n# copy {i}\n{program}\n```" for i in range(n)]


def _learner(board: Path, choices: list[object], body: str, entry: str = "") -> str:
    head = f"BOARD = {str(board)!r}\nSTRIDE = {STRIDE_PAGES}\nCHOICES = {choices!r}\n"
    return head + LEARNER + body.replace("ENTRY", entry)


def _rewards(env: grpo_envs.Environment, sample: Sample, group: list[str]) -> list[float]:
    return [s.reward for s in env.score_batch(group, [sample] * len(group))]


@pytest.mark.parametrize("reward", ["binary", "fraction"])
def test_humaneval_group_of_guessers_scores_zero(board: Path, reward: str) -> None:
    env = grpo_envs.make("code/humaneval-v0", workers=1, reward=reward)
    sample = Sample.from_row(env.dataset("test")[0])
    assert sample.metadata["entry_point"] == "has_close_elements"
    learner = _learner(board, [True, False], CALL_LEARNER, "has_close_elements")
    honest = f"```python\n{sample.answer}\n```"
    rewards = _rewards(env, sample, [honest, *_copies(learner)])
    assert rewards[0] == 1.0
    assert max(rewards[1:]) < 1.0, rewards
    if reward == "binary":
        assert rewards[1:] == [0.0] * 10


def test_mbpp_group_of_guessers_scores_zero(board: Path, tmp_path: Path) -> None:
    row = {
        "task_id": 901,
        "text": "Write a function that tells whether n is a prime number.",
        "code": IS_PRIME,
        "test_list": [f"assert is_prime({n}) == {want}" for n, want in PRIMES],
        "test_setup_code": "",
        "challenge_test_list": [],
    }
    data = tmp_path / "mbpp.jsonl"
    data.write_text(json.dumps(row) + "\n")
    env = grpo_envs.make("code/mbpp-v0", data_files=str(data), workers=1)
    sample = Sample.from_row(env.dataset("test")[0])
    learner = _learner(board, [True, False], CALL_LEARNER, "is_prime")
    rewards = _rewards(env, sample, [f"```python\n{IS_PRIME}```", *_copies(learner)])
    assert rewards == [1.0] + [0.0] * 10


def test_stdio_group_of_guessers_scores_zero(board: Path, tmp_path: Path) -> None:
    row = {
        "id": "prime",
        "prompt": "Read n; print YES if n is prime, else NO.",
        "tests": [{"input": f"{n}\n", "output": "YES\n" if want else "NO\n"} for n, want in PRIMES],
        "solution": IS_PRIME + "print('YES' if is_prime(int(input())) else 'NO')\n",
    }
    data = tmp_path / "stdio.jsonl"
    data.write_text(json.dumps(row) + "\n")
    env = grpo_envs.make("code/stdio-v0", data_files=str(data), workers=1)
    sample = Sample.from_row(env.dataset("test")[0])
    learner = _learner(board, ["YES", "NO"], STDIO_LEARNER)
    rewards = _rewards(env, sample, [f"```python\n{row['solution']}```", *_copies(learner)])
    assert rewards == [1.0] + [0.0] * 10


@pytest.mark.parametrize("reward", ["binary", "fraction"])
@pytest.mark.parametrize("kind", ["asserts", "io"])
def test_dataset_group_of_guessers_scores_zero(
    board: Path, tmp_path: Path, kind: str, reward: str
) -> None:
    solution = IS_PRIME + (
        "" if kind == "asserts" else "print('YES' if is_prime(int(input())) else 'NO')\n"
    )
    if kind == "asserts":
        tests: list[object] = [f"assert is_prime({n}) == {want}" for n, want in PRIMES]
        learner = _learner(board, [True, False], CALL_LEARNER, "is_prime")
    else:
        tests = [{"input": f"{n}\n", "output": "YES\n" if want else "NO\n"} for n, want in PRIMES]
        learner = _learner(board, ["YES", "NO"], STDIO_LEARNER)
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({"question": "Is n prime?", "tests": tests, "solution": solution}))
    env = grpo_envs.make(
        "code/dataset-v0",
        path=str(data),
        solution="solution",
        splits="test",
        workers=1,
        reward=reward,
    )
    sample = Sample.from_row(env.dataset("test")[0])
    rewards = _rewards(env, sample, [f"```python\n{solution}```", *_copies(learner)])
    assert rewards[0] == 1.0
    assert max(rewards[1:]) < 1.0, rewards
    if reward == "binary":
        assert rewards[1:] == [0.0] * 10
