"""The python tool's session: replay (what ships) against a persistent interpreter per episode.

Run: ``.venv/bin/python benchmarks/tool_session_bench.py [--calls 1 4 8] [--rounds 3]``

An episode of ``math/python-tool-v0`` makes N calls. Two ways to keep its variables:

1. replay (``grpo_envs.tools.PythonTool``, sandboxed): call k starts a fresh sandboxed process
   that re-runs calls 1..k-1 with their output on /dev/null, then runs call k in a forked child.
   An episode of N calls costs N process starts plus N(N+1)/2 cell runs;
2. persistent (a prototype, ``PersistentPrototype`` below): one plain ``python -I -S`` process
   per episode, kept alive across the calls, each cell sent over a pipe and its printed output
   captured at the Python level. One start plus N cell runs. It is NOT sandboxed and does not
   capture fd-level output, so it is a lower bound on what a sandboxed persistent session would
   cost (the sandbox's own start is cheaper than ``python -I -S``: a fork of a warm template).

Two workloads: ``tiny`` cells (an assignment and an expression, what tool-using math episodes
write) and ``compute`` cells (about 10 ms of arithmetic each, so that re-running them shows).
The two sides alternate, ``--rounds`` times, and the table shows the median seconds per episode;
``replay / persistent`` is their ratio, ``start`` the prototype's process start inside its
episode time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

#: The cells of each workload: ``cell(k)`` is the code of call k (1-based) of an episode.
WORKLOADS: dict[str, Callable[[int], str]] = {
    "tiny": lambda k: f"x{k} = {k} * 7\nx{k} + 1",
    "compute": lambda k: f"s{k} = sum(i * i % 7 for i in range(150_000))\ns{k} + {k}",
}

# The prototype's server: a cell per line of JSON on stdin, a JSON reply per line on stdout.
_SERVER = r"""
import ast, contextlib, io, json, sys
g = {"__name__": "__main__"}
for line in sys.stdin:
    source = json.loads(line)
    out = io.StringIO()
    ok = True
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            tree = ast.parse(source)
            last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
            exec(compile(tree, "<cell>", "exec"), g)
            if last is not None:
                value = eval(compile(ast.Expression(last.value), "<cell>", "eval"), g)
                if value is not None:
                    print(repr(value))
    except BaseException as e:
        ok = False
        out.write(repr(e))
    sys.stdout.write(json.dumps([ok, out.getvalue()]) + "\n")
    sys.stdout.flush()
"""


class PersistentPrototype:
    """One live interpreter per episode (unsandboxed; for the measurement only)."""

    def __init__(self) -> None:
        """Start the episode's interpreter."""
        self.process = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _SERVER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def call(self, code: str) -> tuple[bool, str]:
        """Run one cell; return (it ran without raising, its output)."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps(code) + "\n")
        self.process.stdin.flush()
        stray = ""  # lines something else wrote into the reply channel (a child process)
        while True:
            line = self.process.stdout.readline()
            if not line:
                return False, stray + "the interpreter ended"
            try:
                ok, output = json.loads(line)
            except (ValueError, TypeError):
                stray += line
                continue
            return bool(ok), stray + str(output)

    def close(self) -> None:
        """End the episode: the interpreter exits."""
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(timeout=10)


@dataclass(frozen=True)
class Row:
    """One line of the table: medians over the rounds, in seconds per episode."""

    workload: str
    calls: int
    replay_s: float
    persistent_s: float
    start_s: float

    @property
    def ratio(self) -> float:
        """How many times longer an episode takes by replay than with a live interpreter."""
        return self.replay_s / self.persistent_s


def replay_episode(tool: object, cells: Sequence[str]) -> float:
    """Run ``cells`` as one episode's calls through the shipped tool; return its seconds."""
    from grpo_envs.episode import ToolStatus
    from grpo_envs.tools import PythonTool

    assert isinstance(tool, PythonTool)
    history: list[str] = []
    began = time.perf_counter()
    for code in cells:
        record = tool.run(history, code)
        if record.status is not ToolStatus.OK:
            raise RuntimeError(f"replay: {code!r} ended {record.status}: {record.output}")
        history.append(code)
    return time.perf_counter() - began


def persistent_episode(cells: Sequence[str]) -> tuple[float, float]:
    """Run ``cells`` in one live interpreter; return (episode seconds, start seconds)."""
    began = time.perf_counter()
    session = PersistentPrototype()
    try:
        session.call("None")  # the interpreter is up once it answers
        started = time.perf_counter()
        for code in cells:
            ok, output = session.call(code)
            if not ok:
                raise RuntimeError(f"persistent: {code!r} failed: {output}")
    finally:
        session.close()
    return time.perf_counter() - began, started - began


def measure(
    workload: str, calls: int, rounds: int, tool: object
) -> tuple[list[float], list[float], list[float]]:
    """Alternate the two sides ``rounds`` times; return their episode and start seconds."""
    cells = [WORKLOADS[workload](k) for k in range(1, calls + 1)]
    replay, persistent, start = [], [], []
    for _ in range(rounds):
        replay.append(replay_episode(tool, cells))
        episode_s, start_s = persistent_episode(cells)
        persistent.append(episode_s)
        start.append(start_s)
    return replay, persistent, start


def row_of(
    workload: str,
    calls: int,
    replay: Sequence[float],
    persistent: Sequence[float],
    start: Sequence[float],
) -> Row:
    """The medians of one (workload, calls) measurement."""
    return Row(
        workload,
        calls,
        statistics.median(replay),
        statistics.median(persistent),
        statistics.median(start),
    )


def table(rows: Sequence[Row]) -> str:
    """The side-by-side table (markdown), one line per workload and number of calls."""
    lines = [
        "| workload | calls | replay s/episode | persistent s/episode | of which start |"
        " replay / persistent |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.workload} | {r.calls} | {r.replay_s:.3f} | {r.persistent_s:.3f} |"
            f" {r.start_s:.3f} | {r.ratio:.2f}x |"
        )
    return "\n".join(lines)


#: Hostile sessions whose last call must show only its own output: (name, cells). Something an
#: earlier call left running writes while the last call runs.
HOSTILE: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "a thread an earlier call started",
        (
            "import threading, time\n"
            "def spam():\n"
            "    for _ in range(400):\n"
            "        print('LEAK', flush=True)\n"
            "        time.sleep(0.005)\n"
            "threading.Thread(target=spam, daemon=True).start()",
            "import time\ntime.sleep(0.05)",
            "import time\ntime.sleep(0.1)\nprint('own')",
        ),
    ),
    (
        "a process an earlier call started",
        (
            "import subprocess, sys\n"
            "p = subprocess.Popen([sys.executable, '-c', "
            "'import time\\nfor _ in range(400): print(\"LEAK\", flush=True); time.sleep(0.005)'])",
            "import time\ntime.sleep(0.05)",
            "import time\ntime.sleep(0.1)\nprint('own')",
        ),
    ),
)


def own_output_only(outputs: Sequence[str]) -> bool:
    """Whether the last call showed exactly what it printed (``own``), nothing an earlier left.

    >>> own_output_only(["", "", "own\\n"]), own_output_only(["", "", "LEAK\\nown\\n"])
    (True, False)
    """
    return outputs[-1].strip() == "own"


def isolation(tool: object) -> list[tuple[str, bool, bool]]:
    """Run each hostile session both ways: (name, replay's last call clean, persistent's)."""
    from grpo_envs.tools import PythonTool

    assert isinstance(tool, PythonTool)
    rows = []
    for name, cells in HOSTILE:
        history: list[str] = []
        replayed = []
        for code in cells:
            record = tool.run(history, code)
            replayed.append(record.output)
            history.append(code)
        session = PersistentPrototype()
        try:
            persisted = [session.call(code)[1] for code in cells]
        finally:
            session.process.kill()
            session.process.wait(timeout=10)
        rows.append((name, own_output_only(replayed), own_output_only(persisted)))
    return rows


def isolation_table(rows: Sequence[tuple[str, bool, bool]]) -> str:
    """Whether the last call of each hostile session showed only its own output, per design."""
    lines = [
        "| left running by an earlier call | replay: own output only |"
        " persistent: own output only |",
        "|---|---|---|",
    ]
    lines += [f"| {n} | {'yes' if r else 'NO'} | {'yes' if p else 'NO'} |" for n, r, p in rows]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    """Measure and print the table."""
    from grpo_envs.tools import PythonTool
    from sandbox import Limits, Sandbox

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    args = parser.parse_args(argv)
    with Sandbox(limits=Limits(timeout_s=30), workers=1) as box:
        tool = PythonTool(timeout_s=30.0, sandbox=box)
        tool.run([], "1")  # the sandbox's first start is not an episode's
        rows = [
            row_of(w, n, *measure(w, n, args.rounds, tool))
            for w in args.workloads
            for n in args.calls
        ]
        hostile = isolation(tool)
    print(table(rows))
    print()
    print(isolation_table(hostile))


if __name__ == "__main__":
    main()
