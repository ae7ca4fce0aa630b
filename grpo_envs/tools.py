r"""Tool calls in model turns, and a ``python`` tool run in the sandbox.

Two call formats (``ToolFormat``):

- ``HERMES``: the format of the chat templates that have tool calling (Hermes, Qwen2.5/Qwen3):
  ``<tool_call>{"name": "python", "arguments": {"code": "..."}}</tool_call>``; results go back as
  ``role="tool"`` messages, which those templates render as ``<tool_response>`` blocks (the
  trainer renders them with ``apply_chat_template(..., tools=...)``);
- ``CODE_BLOCK``: for small models without tool calling: every fenced python block of a turn is
  run, and its output comes back as a user message holding an ``output`` block (the
  convention of tool-integrated reasoning: ToRA, arXiv:2309.17452).

Whatever the model writes, parsing never raises and takes time linear in the turn: a call that
cannot be parsed (not JSON, integers past Python's int-string limit, nesting deeper than the
decoder's stack, a name or arguments of the wrong type, an unclosed tag) is a ``MalformedCall``,
which the step function turns into an observation (the model sees what was wrong and may retry);
a failing or timed-out tool call is an observation too, with a typed ``ToolStatus``. Model text
thus never ends an episode as an environment error, which the trainer would drop from its
baseline and loss.

How the python tool keeps state. An episode's variables must persist across calls and nothing may
leak between episodes. We REPLAY: each call runs, in a fresh sandboxed process, the episode's
earlier successful cells and then the new cell. The replayed cells write to /dev/null at the fd
level (print, ``sys.stderr``, ``os.write(1/2)``, subprocesses, C code's stdio are all silenced,
and the C buffers are flushed there), so each call shows only its own output. The new cell runs
in a forked child with the real stdout/stderr; its parent, the runner, runs no model code after
the replay and reads how the child ended: a ``SystemExit`` of any code, ``exit()``/``quit()``,
``KeyboardInterrupt``, ``os._exit`` or a fatal signal (a segfault, ``os.abort``, ``SIGKILL``)
ends THAT call with ``ToolStatus.EXITED`` and a message saying so, and the cell is not kept: the
next call replays the earlier cells only. The parent keeps /dev/null on its own fds, so threads
and processes that replayed cells left running print nowhere, and ``atexit`` handlers never run
(the session has not ended). Tracebacks start at the cell's own frame: the runner's frames and
names never reach the model. The runner reports the outcome by exit codes drawn afresh for each
call (``RunnerExits``), so a stored cell cannot end a later replay with the code that means
success; a replay that fails or dies is an ``ERROR`` naming the call, never a silent ``ok``.

Budgets (``python_tool_step``): at most ``max_calls`` calls of a reply run, and with the
episode's ``EpisodeBudget.max_tool_s`` a call starts only while tool seconds are left, its limit
the smaller of ``PythonTool.timeout_s`` and what is left (a timed-out call counts its whole
limit). Calls that do not run get a ``REFUSED`` record the model sees.

Why replay rather than a persistent interpreter per episode (kept alive across turns, forked
for branches). Measured with ``benchmarks/tool_session_bench.py`` (2 shared vCPUs, load 10,
medians of 5): tiny cells 0.037 / 0.120 / 0.307 s per episode of 1 / 4 / 8 calls by replay
against 0.092 / 0.075 / 0.090 s for an unsandboxed persistent prototype (0.41x / 1.60x /
3.43x); cells of ~10 ms of work 0.064 / 0.426 / 1.087 s against 0.119 / 0.214 / 0.308 s
(0.54x / 1.99x / 3.53x). Persistent wins from 4 calls on, by tens to hundreds of
milliseconds per episode: small next to the seconds a turn of sampling takes, and bounded by
``max_tool_s``. Keeping it
would need what the sandbox does not have: a run held open across engine calls and fed cells
one at a time, reaped when the episode ends or its worker dies, and forked per branch; and it
would make a call's result depend on a live process rather than on the transcript, losing what
replay gives by construction: isolation (a run sees only its own episode's cells, passed in from
outside), survival of anything the code does (no process to corrupt; one exit costs one call),
a call that is a pure function of the episode's transcript (``check_env``'s determinism, exact
resume) and batching across episodes (``PythonTool.run_many``). A live interpreter also cannot keep
each call's output its own: a thread or process an earlier call started keeps writing while the
next call runs, and Python cannot stop a thread (the benchmark's isolation table: replay shows
only the last call's output, the persistent prototype does not). Replay's costs: earlier cells
re-run (side effects included: a file written by cell 1 is written again each call), the time
limit of a call covers the replay, and code whose results are random without a seed can differ
on replay (a replayed cell that now fails is reported as such).
"""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

from grpo_envs.episode import EpisodeBudget, EpisodeState, Step, StepFn, ToolRecord, ToolStatus
from grpo_envs.types import JSONValue, Message

if TYPE_CHECKING:
    from sandbox import ExecResult, Sandbox
    from sandbox.remote import RemoteSandbox


class ToolFormat(StrEnum):
    """How a model writes tool calls (see the module docstring)."""

    HERMES = "hermes"
    CODE_BLOCK = "code_block"


@dataclass(frozen=True)
class ToolCall:
    """A parsed call: the tool's name and its JSON arguments."""

    name: str
    arguments: Mapping[str, JSONValue] = field(default_factory=dict)


@dataclass(frozen=True)
class MalformedCall:
    """A call that could not be parsed; ``reason`` is shown to the model."""

    reason: str
    raw: str = ""


ParsedCall = ToolCall | MalformedCall

_OPEN_TAG, _CLOSE_TAG = "<tool_call>", "</tool_call>"
_CODE_BLOCK = re.compile(r"```(?:python|py)[ \t]*\n(.*?)```", re.DOTALL)
_OPEN_CODE_BLOCK = re.compile(r"```(?:python|py)[ \t]*\n")


def parse_hermes(text: str, *, max_calls: int = 8) -> list[ParsedCall]:
    """Return the ``<tool_call>`` JSON calls of ``text`` in order (at most ``max_calls``).

    ``arguments`` may be an object or a JSON string holding one (models write both). An opening
    tag without its closing one is a ``MalformedCall``. The scan is linear in ``text`` (tags are
    found with ``str.find``: a lazy regex is quadratic on many unclosed ``<tool_call>`` tags), and
    at most ``max_calls + 1`` bodies are decoded.

    >>> parse_hermes('<tool_call>{"name": "python", "arguments": {"code": "1+1"}}</tool_call>')
    [ToolCall(name='python', arguments={'code': '1+1'})]
    >>> parse_hermes("<tool_call>{name: python}</tool_call>")[0].reason[:22]
    'the call is not JSON: '
    >>> parse_hermes("<tool_call>" * 3)[0].reason
    'a <tool_call> tag was not closed with </tool_call>'
    """
    calls: list[ParsedCall] = []
    position = 0
    while len(calls) <= max_calls:
        start = text.find(_OPEN_TAG, position)
        if start == -1:
            break
        end = text.find(_CLOSE_TAG, start + len(_OPEN_TAG))
        if end == -1:
            calls.append(MalformedCall("a <tool_call> tag was not closed with </tool_call>"))
            break
        calls.append(_hermes_call(text[start + len(_OPEN_TAG) : end].strip()))
        position = end + len(_CLOSE_TAG)
    return _capped(calls, max_calls)


def _hermes_call(body: str) -> ParsedCall:
    raw = body[:200]
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError) as exc:
        # ValueError: JSONDecodeError, and integers past Python's int-string conversion limit
        # (4300 digits); RecursionError: nesting deeper than the decoder's stack.
        return MalformedCall(f"the call is not JSON: {str(exc)[:200]}", raw)
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return MalformedCall('a call must be a JSON object with a "name" string', raw)
    arguments = obj.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            return MalformedCall('"arguments" must be a JSON object', raw)
    if not isinstance(arguments, dict):
        return MalformedCall('"arguments" must be a JSON object', raw)
    return ToolCall(obj["name"], arguments)


def parse_code_blocks(text: str, *, max_calls: int = 8) -> list[ParsedCall]:
    r"""Return a ``python`` call per fenced python block of ``text``; unclosed ones are malformed.

    >>> parse_code_blocks("Let me compute.\n```python\nprint(6 * 7)\n```")
    [ToolCall(name='python', arguments={'code': 'print(6 * 7)\n'})]
    """
    calls: list[ParsedCall] = [
        ToolCall("python", {"code": m[1]}) for m in _CODE_BLOCK.finditer(text)
    ]
    closed_end = 0
    for match in _CODE_BLOCK.finditer(text):
        closed_end = match.end()
    if _OPEN_CODE_BLOCK.search(text, closed_end):
        calls.append(MalformedCall("a ```python block was not closed with ```"))
    return _capped(calls, max_calls)


def _capped(calls: list[ParsedCall], max_calls: int) -> list[ParsedCall]:
    if len(calls) <= max_calls:
        return calls
    return [*calls[:max_calls], MalformedCall(f"only {max_calls} tool calls per turn are run")]


def parse_calls(text: str, fmt: ToolFormat, *, max_calls: int = 8) -> list[ParsedCall]:
    """Parse the tool calls of one turn in format ``fmt``."""
    if fmt is ToolFormat.HERMES:
        return parse_hermes(text, max_calls=max_calls)
    return parse_code_blocks(text, max_calls=max_calls)


def truncate_output(text: str, budget: int) -> str:
    r"""Keep ``text`` within ``budget`` characters: its head and tail, saying how much was cut.

    The tail is kept because that is where a traceback's error line is.

    >>> truncate_output("a" * 50 + "b" * 50, 40)
    'aaaaaaaaaa\n[... 80 characters cut ...]\nbbbbbbbbbb'
    """
    if len(text) <= budget:
        return text
    keep = max(budget // 4, 1)
    return f"{text[:keep]}\n[... {len(text) - 2 * keep} characters cut ...]\n{text[-keep:]}"


def tool_result_message(record: ToolRecord, fmt: ToolFormat) -> Message:
    """Return the message that carries one tool call's result to the model.

    HERMES: a ``tool`` message (the chat template wraps it in ``<tool_response>``). CODE_BLOCK: a
    user message with an ``output`` block.
    """
    status = "" if record.status is ToolStatus.OK else f"[{record.status.value}] "
    if fmt is ToolFormat.HERMES:
        return Message("tool", status + record.output)
    return Message("user", f"```output\n{status}{record.output}\n```")


@dataclass(frozen=True)
class RunnerExits:
    """The exit codes by which the runner says how a call ended; drawn afresh for every call.

    A replayed cell runs in the runner's own process, so it could end that process with the code
    that means "done" (``os._exit(code)``) and be stored as a success that, replayed, silently
    ends every later call before it runs. Codes drawn per call (never 0-2, which code exits with
    by itself) make such a cell end a later call with a code that means nothing there, which is
    reported as a failed replay. Any other ending means the runner died while replaying.
    """

    ok: int
    raised: int
    ended: int
    crashed: int
    replay_failed: int

    @classmethod
    def draw(cls) -> RunnerExits:
        """Five distinct codes in [64, 250]."""
        codes = _EXIT_DRAW.sample(range(64, 251), 5)
        return cls(*codes)


_EXIT_DRAW = random.SystemRandom()

# The program run in the sandbox. The cells arrive as a JSON literal (never spliced as code) and
# run in their own globals, so the runner's names are invisible to them. A cell whose last
# statement is an expression prints its repr, as a notebook does. The earlier cells are replayed
# with fds 1 and 2 on /dev/null (whatever writes there: print, os.write, subprocesses, C code);
# the new cell runs in a forked child with the real fds, and the runner (its parent, which runs no
# model code after the replay) reads how the child ended: a SystemExit or KeyboardInterrupt, an
# os._exit or a fatal signal ends that call only. The parent keeps /dev/null on its own fds, so
# threads and processes that replayed cells left running print nowhere.
_RUNNER = """\
import ast as _ast, builtins as _bi, json as _json, linecache as _lc, os as _os, sys as _sys
import _sitebuiltins, signal as _signal
# Ctrl-C's handler as in any interpreter, whatever disposition the sandbox inherited (a process
# started in the background inherits SIGINT ignored, and Python then installs no handler): a cell
# that sends itself SIGINT gets KeyboardInterrupt wherever it runs.
_signal.signal(_signal.SIGINT, _signal.default_int_handler)
# What ``site`` gives an interactive interpreter (the sandbox starts without site).
_bi.exit = _sitebuiltins.Quitter("exit", "Ctrl-D (i.e. EOF)")
_bi.quit = _sitebuiltins.Quitter("quit", "Ctrl-D (i.e. EOF)")
_cells = _json.loads(__CELLS__)
_g = {"__name__": "__main__", "__builtins__": _bi}
_OUT, _ERR = _sys.stdout, _sys.stderr

def _run(source, name):
    _sys.stdout, _sys.stderr = _OUT, _ERR
    _lc.cache[name] = (len(source), None, source.splitlines(True), name)
    tree = _ast.parse(source, name)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], _ast.Expr) else None
    exec(compile(tree, name, "exec"), _g)
    if last is not None:
        value = eval(compile(_ast.Expression(last.value), name, "eval"), _g)
        if value is not None:
            print(repr(value))

def _flush():
    for stream in (_sys.stdout, _sys.stderr, _OUT, _ERR):
        try:
            stream.flush()
        except BaseException:
            pass
    ctypes = _sys.modules.get("ctypes")
    if ctypes is not None:  # C code's buffered stdio (printf without fflush)
        try:
            ctypes.CDLL(None).fflush(None)
        except BaseException:
            pass

def _say(fd, text):
    data = text.encode("utf-8", "backslashreplace")
    while data:
        try:
            data = data[_os.write(fd, data):]
        except OSError:
            return

def _error_text(e):
    import traceback as tb
    frames = tb.extract_tb(e.__traceback__)
    first = next((i for i, f in enumerate(frames) if f.filename.startswith("<cell")), len(frames))
    frames = frames[first:]  # from the cell's own frame on: the runner's frames are not shown
    head = "".join(tb.format_list(frames))
    if head:
        head = "Traceback (most recent call last):\\n" + head
    return head + "".join(tb.format_exception_only(type(e), e))

_flush()
_real_out, _real_err = _os.dup(1), _os.dup(2)
_null = _os.open(_os.devnull, _os.O_WRONLY)
_os.dup2(_null, 1)
_os.dup2(_null, 2)
for _i, _cell in enumerate(_cells[:-1]):
    try:
        _run(_cell, "<cell %d>" % (_i + 1))
    except BaseException as _e:
        _flush()
        _say(_real_err, "call %d of this session failed when run again, so this call did not"
             " run:\\n%s" % (_i + 1, _error_text(_e)))
        _os._exit(__REPLAY__)
    _flush()
_pid = _os.fork()
if _pid == 0:
    _os.dup2(_real_out, 1)
    _os.dup2(_real_err, 2)
    for _fd in (_real_out, _real_err, _null):
        _os.close(_fd)
    _OUT.reconfigure(line_buffering=True)  # what was printed survives a crash
    try:
        _run(_cells[-1], "<cell %d>" % len(_cells))
    except (SystemExit, KeyboardInterrupt) as _e:
        _flush()
        _what = type(_e).__name__
        if isinstance(_e, SystemExit) and _e.code is not None:
            _what += "(%r)" % (_e.code,)
        _say(2, "%s: the code stopped the interpreter; this call ended there and its variables"
             " are lost; the variables of earlier calls are kept\\n" % _what)
        _os._exit(__ENDED__)
    except BaseException as _e:
        _flush()
        _say(2, _error_text(_e))
        _os._exit(__RAISED__)
    _flush()
    _os._exit(__OK__)
_status = _os.waitpid(_pid, 0)[1]
if _os.WIFEXITED(_status) and _os.WEXITSTATUS(_status) in (__OK__, __RAISED__, __ENDED__):
    _os._exit(_os.WEXITSTATUS(_status))
if _os.WIFSIGNALED(_status):
    _n = _os.WTERMSIG(_status)
    try:
        _how = "killed by signal %s" % _signal.Signals(_n).name
    except ValueError:
        _how = "killed by signal %d" % _n
else:
    _how = "exit status %d, from os._exit or C code" % _os.WEXITSTATUS(_status)
_say(_real_err, "the interpreter ended during this call (%s); this call's variables are lost;"
     " the variables of earlier calls are kept\\n" % _how)
_os._exit(__CRASHED__)
"""


def runner_program(cells: Sequence[str], exits: RunnerExits) -> str:
    """Return the sandboxed program that replays ``cells[:-1]`` silently and runs ``cells[-1]``."""
    codes = {
        "__OK__": exits.ok,
        "__RAISED__": exits.raised,
        "__ENDED__": exits.ended,
        "__CRASHED__": exits.crashed,
        "__REPLAY__": exits.replay_failed,
    }
    program = _RUNNER
    for name, code in codes.items():
        program = program.replace(name, str(code))
    return program.replace("__CELLS__", repr(json.dumps(list(cells))))


@dataclass(frozen=True)
class PythonTool:
    """Runs python cells in the sandbox, stateful within an episode by replay (module docstring).

    Attributes:
        timeout_s: the wall-clock limit of one call (replay included).
        output_chars: the most characters of output the model sees per call (head + tail kept).
        memory_mb: the memory limit of one call.
        sandbox: the sandbox to use; None -> the process's shared one (started on first use).
    """

    timeout_s: float = 5.0
    output_chars: int = 2000
    memory_mb: int = 512
    sandbox: Sandbox | None = field(default=None, compare=False)

    def program(self, history: Sequence[str], code: str, exits: RunnerExits) -> str:
        """Return the sandboxed program that replays ``history`` and runs ``code``."""
        return runner_program([*history, code], exits)

    def run(
        self, history: Sequence[str], code: str, *, timeout_s: float | None = None
    ) -> ToolRecord:
        """Run ``code`` after replaying the episode's earlier cells ``history``.

        ``timeout_s`` lowers the call's time limit below ``self.timeout_s`` (what is left of the
        episode's tool budget); it never raises it.
        """
        return self.run_many([(history, code)], timeout_s=timeout_s)[0]

    def run_many(
        self, calls: Sequence[tuple[Sequence[str], str]], *, timeout_s: float | None = None
    ) -> list[ToolRecord]:
        """Run many calls (of different episodes) in parallel over the sandbox's workers."""
        from sandbox import Job, Limits

        limit = self.timeout_s if timeout_s is None else min(self.timeout_s, timeout_s)
        if not limit > 0:
            raise ValueError(f"a tool call needs a positive time limit, got {limit}")
        box = self.sandbox if self.sandbox is not None else _shared()
        limits = Limits(
            timeout_s=limit,
            memory_mb=self.memory_mb,
            output_bytes=max(64 * self.output_chars, 1 << 16),
        )
        exits = [RunnerExits.draw() for _ in calls]
        jobs = [Job(self.program(h, c, e), limits=limits) for (h, c), e in zip(calls, exits)]
        results = box.run_many(jobs)
        return [
            self._record(code, res, limit, e)
            for (_, code), res, e in zip(calls, results, exits, strict=True)
        ]

    def _record(
        self, code: str, result: ExecResult, limit: float, exits: RunnerExits
    ) -> ToolRecord:
        from sandbox import Status

        output = result.stdout + result.stderr
        seconds = result.wall_s
        if result.status is Status.TIMEOUT:
            status, output = ToolStatus.TIMEOUT, output + f"timed out after {limit:g} s"
            seconds = max(seconds, limit)  # a call that timed out used its whole limit
        elif result.status is Status.SANDBOX_ERROR:
            status, output = ToolStatus.SANDBOX_ERROR, f"the tool is unavailable ({result.detail})"
        elif result.status in (Status.MEMORY, Status.OUTPUT_LIMIT):
            status, output = ToolStatus.ERROR, output + f"({result.status.value}: {result.detail})"
        elif result.exit_code == exits.ok:
            status = ToolStatus.OK
        elif result.exit_code in (exits.raised, exits.replay_failed):
            status = ToolStatus.ERROR
        elif result.exit_code in (exits.ended, exits.crashed):
            status = ToolStatus.EXITED
        else:
            # The runner itself died while replaying (a replayed cell ended the interpreter).
            status = ToolStatus.ERROR
            output += (
                "the earlier calls of this session could not be run again"
                f" (the interpreter ended: {result.detail or result.status.value})"
            )
        return ToolRecord(
            "python", code, status, seconds, truncate_output(output, self.output_chars)
        )


def _shared() -> Sandbox | RemoteSandbox:
    from grpo_envs.code.scoring import shared_sandbox

    return shared_sandbox()


def python_history(state: EpisodeState) -> list[str]:
    """Return the code of the episode's successful python calls in order (what a call replays)."""
    return [t.code for t in state.tools if t.name == "python" and t.status is ToolStatus.OK]


def python_tool_step(
    tool: PythonTool | None = None,
    fmt: ToolFormat = ToolFormat.HERMES,
    *,
    max_calls: int = 4,
    budget: EpisodeBudget | None = None,
) -> StepFn:
    """Return a step function running each turn's python calls; a turn without calls ends it.

    Every call's result (output, error, timeout, a malformed or unknown call, a call refused for
    budget) is a message the model sees next; the episode's final answer is the first turn that
    makes no call.

    Budgets: at most ``max_calls`` calls of a reply run (the rest get one ``REFUSED`` record).
    With ``budget.max_tool_s``, a call starts only while the episode has tool seconds left
    (``EpisodeState.tool_s`` plus this reply's calls so far), and its time limit is the smaller of
    ``tool.timeout_s`` and what is left; a call that cannot start is ``REFUSED``. Pass the
    environment's own ``EpisodeBudget`` so that one reply never runs past the episode's budget.
    """
    if max_calls < 1:
        raise ValueError(f"max_calls must be >= 1, got {max_calls}")
    python = tool if tool is not None else PythonTool()
    limits = budget if budget is not None else EpisodeBudget()

    def step(state: EpisodeState, turn: str) -> Step:
        calls = parse_calls(turn, fmt, max_calls=max_calls)
        if not calls:
            return Step.end()
        history = python_history(state)
        records: list[ToolRecord] = []
        for index, call in enumerate(calls):
            left = limits.tool_s_left(state.tool_s + math.fsum(r.seconds for r in records))
            record = _refused(call, index, max_calls, left)
            if record is None:
                assert isinstance(call, ToolCall)
                record = python.run(history, str(call.arguments["code"]), timeout_s=left)
                if record.status is ToolStatus.OK:
                    history.append(record.code)
            records.append(record)
        messages = [tool_result_message(r, fmt) for r in records]
        return Step.reply(messages, tools=records)

    return step


def _refused(
    call: ParsedCall, index: int, max_calls: int, tool_s_left: float | None
) -> ToolRecord | None:
    """Return the record of a call that is not run (malformed, unknown, over budget), else None.

    ``index`` is the call's place in the reply: the parsers put their one marker for the calls
    past ``max_calls`` at index ``max_calls``.
    """
    if index >= max_calls:
        return ToolRecord(
            "python",
            "",
            ToolStatus.REFUSED,
            output=f"not run: only {max_calls} tool calls per reply are run",
        )
    if isinstance(call, MalformedCall):
        return ToolRecord(
            "?", call.raw, ToolStatus.MALFORMED, output=f"invalid tool call: {call.reason}"
        )
    if call.name != "python":
        return ToolRecord(
            call.name, "", ToolStatus.MALFORMED, output=f"unknown tool {call.name!r}; use 'python'"
        )
    code = call.arguments.get("code")
    if not isinstance(code, str):
        return ToolRecord(
            "python", "", ToolStatus.MALFORMED, output='the python tool needs "code": a string'
        )
    if tool_s_left is not None and tool_s_left <= 0:
        return ToolRecord(
            "python",
            code,
            ToolStatus.REFUSED,
            output="not run: this episode's tool time is spent",
        )
    return None


#: The tool schema to pass to ``apply_chat_template(..., tools=[PYTHON_TOOL_SCHEMA])``.
PYTHON_TOOL_SCHEMA: Mapping[str, JSONValue] = {
    "type": "function",
    "function": {
        "name": "python",
        "description": "Run Python code. Variables persist between calls within this task. "
        "The value of a final expression and anything printed are returned.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "the Python code to run"}},
            "required": ["code"],
        },
    },
}


__all__ = [
    "PYTHON_TOOL_SCHEMA",
    "MalformedCall",
    "ParsedCall",
    "PythonTool",
    "RunnerExits",
    "ToolCall",
    "ToolFormat",
    "parse_calls",
    "parse_code_blocks",
    "parse_hermes",
    "python_history",
    "python_tool_step",
    "runner_program",
    "tool_result_message",
    "truncate_output",
]
