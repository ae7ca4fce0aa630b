"""Tool calls: parsing never raises, the python tool keeps state by replay and leaks nothing."""

import json
import re

import pytest

from grpo_envs.episode import (
    EpisodeBudget,
    EpisodeEnd,
    MultiTurnEnv,
    ToolRecord,
    ToolStatus,
    run_episode,
    scripted,
)
from grpo_envs.rubric import RewardComponent, Rubric
from grpo_envs.tools import (
    PYTHON_TOOL_SCHEMA,
    MalformedCall,
    PythonTool,
    ToolCall,
    ToolFormat,
    parse_code_blocks,
    parse_hermes,
    python_tool_step,
    tool_result_message,
    truncate_output,
)


def hermes(name="python", **arguments):
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


# --- parsing -----------------------------------------------------------------------------------


def test_hermes_calls_are_parsed_in_order_and_string_arguments_are_accepted():
    text = (
        "think "
        + hermes(code="a = 1")
        + " then "
        + ('<tool_call>{"name": "python", "arguments": "{\\"code\\": \\"a\\"}"}</tool_call>')
    )
    assert parse_hermes(text) == [
        ToolCall("python", {"code": "a = 1"}),
        ToolCall("python", {"code": "a"}),
    ]
    assert parse_hermes("no calls here") == []


@pytest.mark.parametrize(
    "text, reason",
    [
        ("<tool_call>{'name': 'python'}</tool_call>", "not JSON"),
        ("<tool_call>[1, 2]</tool_call>", '"name" string'),
        ('<tool_call>{"arguments": {}}</tool_call>', '"name" string'),
        ('<tool_call>{"name": "python", "arguments": 3}</tool_call>', '"arguments" must'),
        ('<tool_call>{"name": "python", "arguments": "{oops"}</tool_call>', '"arguments" must'),
        ('<tool_call>{"name": "python"', "not closed"),
        ("<tool_call>" + "[" * 100_000 + "</tool_call>", "not JSON"),
    ],
)
def test_malformed_hermes_calls_are_typed_never_raised(text, reason):
    (call,) = parse_hermes(text)
    assert isinstance(call, MalformedCall) and reason in call.reason


def test_a_closed_call_then_an_unclosed_one_gives_both():
    calls = parse_hermes(hermes(code="1") + " <tool_call>{")
    assert calls == [
        ToolCall("python", {"code": "1"}),
        MalformedCall("a <tool_call> tag was not closed with </tool_call>"),
    ]
    # The unclosed call does not swallow a closed one before it, nor the closed one after it.
    calls = parse_hermes(hermes(code="1") + hermes(code="2") + "<tool_call>{")
    assert calls[:2] == [ToolCall("python", {"code": "1"}), ToolCall("python", {"code": "2"})]
    assert len(calls) == 3 and isinstance(calls[2], MalformedCall)


def test_code_blocks_each_become_a_python_call_and_an_unclosed_block_is_malformed():
    text = "```python\nx = 2\n```\nand\n```py\nx * 3\n```\n```text\nnot code\n```"
    assert parse_code_blocks(text) == [
        ToolCall("python", {"code": "x = 2\n"}),
        ToolCall("python", {"code": "x * 3\n"}),
    ]
    calls = parse_code_blocks("```python\nx = 2\n```\n```python\nprint(x)")
    assert isinstance(calls[0], ToolCall) and isinstance(calls[1], MalformedCall)


def test_calls_beyond_the_cap_are_refused_with_a_message():
    calls = parse_code_blocks("```python\n1\n```" * 5, max_calls=2)
    assert len(calls) == 3 and isinstance(calls[2], MalformedCall) and "only 2" in calls[2].reason


def test_truncation_keeps_head_and_tail_within_the_budget():
    text = "".join(str(i % 10) for i in range(10_000))
    cut = truncate_output(text, 400)
    assert len(cut) <= 400 + 40 and cut.startswith(text[:100]) and cut.endswith(text[-100:])
    assert "9800 characters cut" in cut
    assert truncate_output("short", 400) == "short"


def test_tool_results_follow_the_format():
    record = ToolRecord("python", "1/0", ToolStatus.ERROR, output="ZeroDivisionError")
    assert tool_result_message(record, ToolFormat.HERMES).role == "tool"
    assert tool_result_message(record, ToolFormat.HERMES).content == "[error] ZeroDivisionError"
    message = tool_result_message(record, ToolFormat.CODE_BLOCK)
    assert message.role == "user" and message.content.startswith("```output\n[error] ")
    assert PYTHON_TOOL_SCHEMA["function"]["name"] == "python"  # type: ignore[index]


# --- the python tool ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tool():
    return PythonTool(timeout_s=2.0, output_chars=300)


def test_state_persists_across_calls_and_the_last_expression_is_shown(tool):
    first = tool.run([], "import math\nx = 6\nx * 7")
    assert (first.status, first.output) == (ToolStatus.OK, "42\n")
    second = tool.run(
        ["import math\nx = 6\nx * 7"], "print('replayed output is hidden')\nmath.factorial(x)"
    )
    assert second.output == "replayed output is hidden\n720\n"


def test_errors_show_the_cells_traceback_only(tool):
    record = tool.run(["def f(a):\n    return a / 0\n"], "f(1)")
    assert record.status is ToolStatus.ERROR
    assert "ZeroDivisionError" in record.output and '"<cell 2>"' in record.output
    assert "_run" not in record.output and "main.py" not in record.output
    syntax = tool.run([], "def f(:")
    assert syntax.status is ToolStatus.ERROR and "SyntaxError" in syntax.output


def test_timeouts_and_floods_are_typed_and_truncated(tool):
    slow = tool.run([], "while True:\n    pass")
    assert slow.status is ToolStatus.TIMEOUT and "timed out after 2 s" in slow.output
    flood = tool.run([], "print('y' * 50_000)")
    assert (
        flood.status is ToolStatus.OK
        and len(flood.output) < 400
        and "characters cut" in flood.output
    )


def test_no_state_leaks_between_episodes_of_one_group(tool):
    # Two episodes of one group, run side by side: the first plants everything it can.
    plant = (
        "import builtins, os\n"
        "secret = 41\n"
        "open('leak.txt', 'w').write('x')\n"
        "open('/tmp/leak.txt', 'w').write('x')\n"
        "for d in ('/dev/shm', os.path.expanduser('~'), '/var/tmp'):\n"
        "    try:\n"
        "        open(os.path.join(d, 'leak.txt'), 'w').write('x')\n"
        "    except OSError:\n"
        "        pass\n"
        "os.environ['LEAK'] = '1'\n"
        "builtins.len = lambda *_: -1\n"
        "if os.fork() == 0:\n"
        "    import time; time.sleep(0.3); open('/tmp/late.txt', 'w').write('x'); os._exit(0)\n"
    )
    probe = (
        "import os, time\n"
        "time.sleep(0.6)\n"
        "print([n for n in ('secret',) if n in globals()], len('abc'), os.environ.get('LEAK'),\n"
        "      [p for p in ('leak.txt', '/tmp/leak.txt', '/tmp/late.txt', '/dev/shm/leak.txt',\n"
        "                   os.path.expanduser('~/leak.txt'), '/var/tmp/leak.txt')\n"
        "       if os.path.exists(p)])\n"
    )
    planted, probed = tool.run_many([([], plant), ([], probe)])
    assert planted.status is ToolStatus.OK, planted.output
    assert probed.output == "[] 3 None []\n"
    # ... and a later episode (a new group) sees nothing either, while the planting episode's
    # next call still has its variables and files (replay recreates them).
    later, same_episode = tool.run_many(
        [([], probe), ([plant], "print(secret, open('leak.txt').read())")]
    )
    assert later.output == "[] 3 None []\n"
    assert same_episode.output == "41 x\n"


def test_a_cell_cannot_reach_the_history_of_another_episode(tool):
    # The spy walks up every frame's globals: it finds its episode's cells, never others'.
    spy = (
        "import sys\n"
        "f, seen = sys._getframe(), []\n"
        "while f:\n"
        "    seen.append(repr(f.f_globals))\n"
        "    cells = f.f_globals.get('_cells', cells if 'cells' in dir() else None)\n"
        "    f = f.f_back\n"
        "print(len(cells), any(('zebra' + '_secret') in g for g in seen))"
    )
    mine, _other = tool.run_many([(["a = 1"], spy), (["zebra_secret = 1"], "zebra_secret")])
    assert mine.output == "2 False\n"


# --- a tool-using episode ----------------------------------------------------------------------


def _boxed(ctx):
    return float(f"\\boxed{{{ctx.sample.answer}}}" in ctx.completion)


@pytest.mark.parametrize("fmt", list(ToolFormat))
def test_a_tool_using_episode_runs_calls_then_ends_on_the_answer(tool, fmt):
    def call(code):
        return hermes(code=code) if fmt is ToolFormat.HERMES else f"```python\n{code}\n```"

    env = MultiTurnEnv(
        [{"id": "q", "question": "What is 123 * 45?", "answer": "5535"}],
        Rubric([RewardComponent("correct", 1.0, _boxed)]),
        python_tool_step(tool, fmt),
        budget=EpisodeBudget(max_turns=5),
    )
    turns = [
        call("a = 123"),
        "<tool_call>{broken" if fmt is ToolFormat.HERMES else "```python\nb = 45",
        call("b = 45\na * b"),
        "The product is \\boxed{5535}.",
    ]
    result = run_episode(env, env.dataset("train")[0], scripted(turns))
    assert result.end is EpisodeEnd.DONE and result.score.correct
    statuses = [t.status for t in result.state.tools]
    assert statuses == [ToolStatus.OK, ToolStatus.MALFORMED, ToolStatus.OK]
    assert "invalid tool call" in result.state.observations[1].messages[0].content
    assert "5535" in result.state.observations[2].messages[0].content
    assert result.score.details["tool_calls"] == 3


def test_unknown_tools_and_bad_arguments_are_observations(tool):
    step = python_tool_step(tool)
    from grpo_envs.episode import EpisodeState
    from grpo_envs.types import Sample

    state = EpisodeState(Sample("0", (), "1"))
    reply = step(state, hermes("shell", cmd="ls") + hermes(code=3))
    assert reply.observation is not None
    assert [r.status for r in reply.tools] == [ToolStatus.MALFORMED, ToolStatus.MALFORMED]
    texts = [m.content for m in reply.observation.messages]
    assert "unknown tool 'shell'" in texts[0] and '"code": a string' in texts[1]


# --- each call shows its own output only, however it is written --------------------------------

# ``shape(k)`` writes MARK<k> one way; call k of an episode must show MARK<k> and no other mark.
OUTPUT_SHAPES = {
    "print": lambda k: f"print('MARK{k}')",
    "sys.stderr": lambda k: f"import sys\nsys.stderr.write('MARK{k}\\n')",
    "os.write(1)": lambda k: f"import os\nos.write(1, b'MARK{k}\\n')",
    "os.write(2)": lambda k: f"import os\nos.write(2, b'MARK{k}\\n')",
    "os.system": lambda k: f"import os\nrc = os.system('echo MARK{k}')",
    "subprocess stdout": lambda k: f"import subprocess\nr = subprocess.run(['echo', 'MARK{k}'])",
    "subprocess stderr": lambda k: (
        f"import subprocess\nr = subprocess.run('echo MARK{k} >&2', shell=True)"
    ),
    "libc printf + fflush": lambda k: (
        f"import ctypes\nlibc = ctypes.CDLL(None)\n"
        f"n = libc.printf(b'MARK{k}\\n')\nn = libc.fflush(None)"
    ),
    "libc puts, no fflush": lambda k: f"import ctypes\nn = ctypes.CDLL(None).puts(b'MARK{k}')",
    "threads": lambda k: (
        "import threading\n"
        f"ts = [threading.Thread(target=print, args=('MARK{k}',)) for _ in range(3)]\n"
        "for t in ts:\n    t.start()\nfor t in ts:\n    t.join()"
    ),
    "no newline": lambda k: f"print('MARK{k}', end='')",
    "last expression": lambda k: f"'MARK{k}'",
    "print, then raise": lambda k: f"print('MARK{k}')\nif {k} == 2:\n    raise ValueError('two')",
}


@pytest.mark.parametrize("shape", list(OUTPUT_SHAPES))
def test_each_call_shows_only_its_own_output(tool, shape):
    history: list[str] = []
    for k in (1, 2, 3, 4):
        record = tool.run(history, OUTPUT_SHAPES[shape](k))
        assert set(re.findall(r"MARK\d", record.output)) == {f"MARK{k}"}, (k, record.output)
        if record.status is ToolStatus.OK:
            history.append(record.code)
    assert len(history) >= 3


# Things an earlier call leaves running or registered; none may print into a later call.
LEFTOVERS = {
    "daemon thread": (
        "import threading, time\n"
        "def spam():\n    while True:\n"
        "        print('LEFTOVER', flush=True)\n        time.sleep(0.02)\n"
        "threading.Thread(target=spam, daemon=True).start()"
    ),
    "background process": (
        "import subprocess\n"
        "p = subprocess.Popen('for i in 1 2 3 4 5 6 7 8; do echo LEFTOVER; sleep 0.05; done',"
        " shell=True)"
    ),
    "forked child": (
        "import os, time\n"
        "if os.fork() == 0:\n    time.sleep(0.1)\n    os.write(1, b'LEFTOVER\\n')\n    os._exit(0)"
    ),
    "atexit": "import atexit\natexit.register(print, 'LEFTOVER')",
    "replaced sys.stdout": "import sys, io\nsys.stdout = io.StringIO()\nsys.stderr = io.StringIO()",
}


@pytest.mark.parametrize("leftover", list(LEFTOVERS))
def test_what_an_earlier_call_left_running_prints_nowhere_later(tool, leftover):
    first = tool.run([], LEFTOVERS[leftover])
    assert first.status is ToolStatus.OK, first.output
    later = tool.run([LEFTOVERS[leftover]], "import time\ntime.sleep(0.3)\nprint('two')")
    assert (later.status, later.output) == (ToolStatus.OK, "two\n")


# --- an exit or a crash ends that call, never the session ---------------------------------------

EXITS = {
    "import sys\nsys.exit()": "SystemExit",
    "import sys\nsys.exit(3)": "SystemExit(3)",
    "import sys\nsys.exit('msg')": "SystemExit('msg')",
    "raise SystemExit": "SystemExit",
    "exit()": "SystemExit",
    "quit()": "SystemExit",
    "import os\nos._exit(0)": "exit status 0",
    "import os\nos._exit(7)": "exit status 7",
    "raise KeyboardInterrupt": "KeyboardInterrupt",
    "import os, signal\nos.kill(os.getpid(), signal.SIGINT)": "KeyboardInterrupt",
    "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)": "SIGKILL",
    "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)": "SIGSEGV",
    "import signal\nsignal.raise_signal(signal.SIGTERM)": "SIGTERM",
    "import os\nos.abort()": "SIGABRT",
    "import ctypes\nctypes.string_at(0)": "SIGSEGV",
}


@pytest.mark.parametrize("code", list(EXITS))
def test_an_exit_or_crash_ends_that_call_and_the_session_goes_on(tool, code):
    ended = tool.run(["x = 41"], f"y = 1\nprint('before')\n{code}")
    assert ended.status is ToolStatus.EXITED, ended.output
    assert "before" in ended.output and EXITS[code] in ended.output
    assert "earlier calls are kept" in ended.output
    # The ended call is not part of the session: its variables are gone, earlier ones are kept.
    after = tool.run(["x = 41"], "print(x + 1, 'y' in globals())")
    assert (after.status, after.output) == (ToolStatus.OK, "42 False\n")


def test_an_ended_call_is_never_replayed_in_an_episode(tool):
    from grpo_envs.episode import EpisodeState
    from grpo_envs.tools import python_history
    from grpo_envs.types import Sample

    step = python_tool_step(tool)
    state = EpisodeState(Sample("0", (), "1"))
    turn = "".join(
        hermes(code=c) for c in ("x = 5", "import os\nos._exit(0)", "import sys\nsys.exit(0)", "x")
    )
    reply = step(state, turn)
    assert [r.status for r in reply.tools] == [
        ToolStatus.OK,
        ToolStatus.EXITED,
        ToolStatus.EXITED,
        ToolStatus.OK,
    ]
    assert reply.tools[3].output == "5\n"
    later = EpisodeState(state.sample, turns=(turn,), tools=reply.tools)
    assert python_history(later) == ["x = 5", "x"]
    assert reply.observation is not None
    assert "[exited] " in reply.observation.messages[1].content


@pytest.mark.parametrize(
    "history, says",
    [
        (["1/0"], "ZeroDivisionError"),  # a cell that fails when run again (non-determinism)
        (["import sys\nsys.exit(0)"], "SystemExit"),
        # A stored cell that ends the interpreter (it could only get stored by guessing the
        # exit code of its own call) ends the replay: that is reported, whatever its code.
        *[([f"import os\nos._exit({code})"], "could not be run again") for code in (0, 1, 255)],
    ],
)
def test_a_history_that_cannot_be_replayed_is_an_error_never_a_silent_ok(tool, history, says):
    record = tool.run(history, "print('new')")
    assert record.status is ToolStatus.ERROR and says in record.output, record.output
    assert "new" not in record.output


@pytest.mark.parametrize(
    "code",
    [
        "def f(a):\n    return a / 0\nf(1)",
        "def f(:",
        "def f():\n    f()\nf()",
        "class A:\n    def __repr__(self):\n        raise TypeError('no repr')\nA()",
        "import fractions\nfractions.Fraction('x')",
        "undefined_name",
        "raise MemoryError",
        "import os\nos._exit(3)",
        "import sys\nsys.exit('bye')",
        "import ctypes\nctypes.string_at(0)",
    ],
)
def test_no_message_shows_the_runners_frames_or_names(tool, code):
    record = tool.run(["a = 1"], code)
    assert record.status is not ToolStatus.OK
    for name in ("main.py", "_run", "_g", "_cells", "_flush", "_say", "_error_text", "waitpid"):
        assert name not in record.output, (name, record.output)
    frames = [line for line in record.output.splitlines() if line.startswith('  File "')]
    assert all('"<cell 2>"' in f or "/lib/" in f for f in frames), record.output


# --- budgets bound what they name ----------------------------------------------------------------


def _state_after(seconds: float):
    from grpo_envs.episode import EpisodeState
    from grpo_envs.types import Sample

    used = (ToolRecord("python", "pass", ToolStatus.OK, seconds),) if seconds else ()
    return EpisodeState(Sample("0", (), "1"), turns=("",), tools=used)


def test_a_reply_never_runs_past_the_episodes_tool_time():
    import time

    budget = EpisodeBudget(max_turns=4, max_tool_s=1.5)
    step = python_tool_step(PythonTool(timeout_s=2.0), budget=budget)
    sleep = hermes(code="import time\ntime.sleep(1.0)\nprint('slept')")
    began = time.perf_counter()
    reply = step(_state_after(0.0), sleep * 4)
    wall = time.perf_counter() - began
    statuses = "".join(r.status.value[0] for r in reply.tools)  # o(k), t(imeout), r(efused)
    # Unbounded, the four calls would take 4 s: the call that meets the budget is cut where it
    # ends, and the calls after it never start.
    assert re.fullmatch("o+tr+", statuses), reply.tools
    # Used: the whole budget, plus the sandbox's latency in killing the call that met it (a
    # loaded machine stretches it: the margin is wide, the unbounded reply far beyond it).
    assert 1.5 <= sum(r.seconds for r in reply.tools) <= 1.5 + 0.8, reply.tools
    assert wall <= 1.5 + 1.5, wall
    assert all(r.seconds == 0.0 for r in reply.tools if r.status is ToolStatus.REFUSED)
    assert reply.observation is not None
    assert "tool time is spent" in reply.observation.messages[-1].content


def test_a_call_gets_what_is_left_of_the_budget_and_none_once_spent(tool):
    budget = EpisodeBudget(max_tool_s=3.0)
    step = python_tool_step(PythonTool(timeout_s=3.0), budget=budget)
    long_sleep = hermes(code="import time\ntime.sleep(2.5)\nprint('slept')")
    cut = step(_state_after(2.7), long_sleep)
    assert [r.status for r in cut.tools] == [ToolStatus.TIMEOUT]
    assert "timed out after 0.3 s" in cut.tools[0].output
    # Cut at what was left (0.3 s plus the sandbox's kill latency, which a loaded machine
    # stretches), far from the 2.5 s the code sleeps or the tool's own 3 s limit.
    assert 0.3 <= cut.tools[0].seconds < 1.5
    sleep = hermes(code="import time\ntime.sleep(0.6)\nprint('slept')")
    spent = step(_state_after(3.0), sleep + hermes(code="print('x')"))
    assert [r.status for r in spent.tools] == [ToolStatus.REFUSED, ToolStatus.REFUSED]
    assert all(r.seconds == 0.0 and "slept" not in r.output for r in spent.tools)
    # Without a tool-time cap every call gets the tool's own limit.
    free = python_tool_step(PythonTool(timeout_s=3.0))(_state_after(100.0), sleep)
    assert [(r.status, r.output) for r in free.tools] == [(ToolStatus.OK, "slept\n")]


def test_calls_past_the_per_reply_limit_are_refused_and_said_so(tool):
    step = python_tool_step(tool, max_calls=2)
    reply = step(_state_after(0.0), "".join(hermes(code=f"print({i})") for i in range(6)))
    assert [r.status for r in reply.tools] == [ToolStatus.OK, ToolStatus.OK, ToolStatus.REFUSED]
    assert [r.output for r in reply.tools[:2]] == ["0\n", "1\n"]
    assert "only 2 tool calls per reply" in reply.tools[2].output
    with pytest.raises(ValueError, match="max_calls"):
        python_tool_step(tool, max_calls=0)


def test_the_runners_exit_codes_are_drawn_per_call():
    from grpo_envs.tools import RunnerExits, runner_program

    draws = {RunnerExits.draw() for _ in range(20)}
    assert len(draws) == 20
    for exits in draws:
        codes = [exits.ok, exits.raised, exits.ended, exits.crashed, exits.replay_failed]
        assert len(set(codes)) == 5 and all(64 <= c <= 250 for c in codes)
    program = runner_program(["x = 1", "x"], RunnerExits(70, 71, 72, 73, 74))
    assert "_os._exit(70)" in program and "__OK__" not in program
