"""Tool calls: parsing never raises, the python tool keeps state by replay and leaks nothing."""

import json

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
    assert isinstance(calls[0], ToolCall) and isinstance(calls[1], MalformedCall)


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
