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
earlier successful cells (their output discarded) and then the new cell. Rejected alternative: a
persistent interpreter per episode, which keeps a live process, its files and any child it spawned
between turns (a leak channel and a resource held across engine calls, lost on a worker crash).
Replay is isolated by construction (a run sees only the cells of its own episode, passed in
from outside), survives anything the code does (no process to corrupt), makes a tool call a pure
function of the episode's transcript (``check_env``'s determinism, exact resume), and batches
across episodes (``PythonTool.run_many``). Its cost: earlier cells re-run, so the time limit of a
call covers the replay too (the tool seconds an episode spends grow with its cells: tool-using
math episodes have a few short cells), and code whose results are random without a seed can differ
on replay (a replayed cell that now fails is reported as such).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

from grpo_envs.episode import EpisodeState, Step, StepFn, ToolRecord, ToolStatus
from grpo_envs.types import JSONValue, Message

if TYPE_CHECKING:
    from sandbox import ExecResult, Sandbox


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


# The program run in the sandbox. The cells arrive as a JSON literal (never spliced as code) and
# run in their own globals, so the wrapper's names are invisible to them. A cell whose last
# statement is an expression prints its repr, as a notebook does.
_RUNNER = """\
import ast as _ast, contextlib as _cl, io as _io, json as _json, linecache as _lc, sys as _sys
import traceback as _tb
_cells = _json.loads({cells!r})
_g = {{"__name__": "__main__"}}

def _run(source, name):
    _lc.cache[name] = (len(source), None, source.splitlines(True), name)
    tree = _ast.parse(source, name)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], _ast.Expr) else None
    exec(compile(tree, name, "exec"), _g)
    if last is not None:
        value = eval(compile(_ast.Expression(last.value), name, "eval"), _g)
        if value is not None:
            print(repr(value))

for _i, _cell in enumerate(_cells[:-1]):
    try:
        with _cl.redirect_stdout(_io.StringIO()), _cl.redirect_stderr(_io.StringIO()):
            _run(_cell, "<cell %d>" % (_i + 1))
    except Exception as _e:
        print("an earlier cell failed when replayed: %r" % (_e,), file=_sys.stderr)
        _sys.exit(1)
try:
    _run(_cells[-1], "<cell %d>" % len(_cells))
except Exception as _e:
    # Only the cells' own frames: the model should not see (or learn) this wrapper.
    _frames = [f for f in _tb.extract_tb(_e.__traceback__) if f.filename.startswith("<cell")]
    if _frames:
        _sys.stderr.write("Traceback (most recent call last):\\n")
        _sys.stderr.write("".join(_tb.format_list(_frames)))
    _sys.stderr.write("".join(_tb.format_exception_only(type(_e), _e)))
    _sys.exit(1)
"""


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

    def program(self, history: Sequence[str], code: str) -> str:
        """Return the sandboxed program that replays ``history`` and runs ``code``."""
        return _RUNNER.format(cells=json.dumps([*history, code]))

    def run(self, history: Sequence[str], code: str) -> ToolRecord:
        """Run ``code`` after replaying the episode's earlier cells ``history``."""
        return self.run_many([(history, code)])[0]

    def run_many(self, calls: Sequence[tuple[Sequence[str], str]]) -> list[ToolRecord]:
        """Run many calls (of different episodes) in parallel over the sandbox's workers."""
        from sandbox import Job, Limits

        box = self.sandbox if self.sandbox is not None else _shared()
        limits = Limits(
            timeout_s=self.timeout_s,
            memory_mb=self.memory_mb,
            output_bytes=max(64 * self.output_chars, 1 << 16),
        )
        results = box.run_many([Job(self.program(h, c), limits=limits) for h, c in calls])
        return [self._record(code, res) for (_, code), res in zip(calls, results, strict=True)]

    def _record(self, code: str, result: ExecResult) -> ToolRecord:
        from sandbox import Status

        output = result.stdout + result.stderr
        if result.status is Status.OK:
            status = ToolStatus.OK
        elif result.status is Status.TIMEOUT:
            status, output = ToolStatus.TIMEOUT, output + f"timed out after {self.timeout_s:g} s"
        elif result.status is Status.SANDBOX_ERROR:
            status, output = ToolStatus.SANDBOX_ERROR, f"the tool is unavailable ({result.detail})"
        else:
            status = ToolStatus.ERROR
            if result.status is not Status.RUNTIME_ERROR:
                output += f"({result.status.value}: {result.detail})"
        return ToolRecord(
            "python", code, status, result.wall_s, truncate_output(output, self.output_chars)
        )


def _shared() -> Sandbox:
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
) -> StepFn:
    """Return a step function running each turn's python calls; a turn without calls ends it.

    Every call's result (output, error, timeout, a malformed or unknown call) is a message the
    model sees next; the episode's final answer is the first turn that makes no call.
    """
    python = tool if tool is not None else PythonTool()

    def step(state: EpisodeState, turn: str) -> Step:
        calls = parse_calls(turn, fmt, max_calls=max_calls)
        if not calls:
            return Step.end()
        history = python_history(state)
        records: list[ToolRecord] = []
        for call in calls:
            record = _refused(call)
            if record is None:
                assert isinstance(call, ToolCall)
                record = python.run(history, str(call.arguments["code"]))
                if record.status is ToolStatus.OK:
                    history.append(record.code)
            records.append(record)
        messages = [tool_result_message(r, fmt) for r in records]
        return Step.reply(messages, tools=records)

    return step


def _refused(call: ParsedCall) -> ToolRecord | None:
    """Return a MALFORMED record for a call the python tool cannot run, else None."""
    if isinstance(call, MalformedCall):
        return ToolRecord(
            "?", call.raw, ToolStatus.MALFORMED, output=f"invalid tool call: {call.reason}"
        )
    if call.name != "python":
        return ToolRecord(
            call.name, "", ToolStatus.MALFORMED, output=f"unknown tool {call.name!r}; use 'python'"
        )
    if not isinstance(call.arguments.get("code"), str):
        return ToolRecord(
            "python", "", ToolStatus.MALFORMED, output='the python tool needs "code": a string'
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
    "ToolCall",
    "ToolFormat",
    "parse_calls",
    "parse_code_blocks",
    "parse_hermes",
    "python_history",
    "python_tool_step",
    "tool_result_message",
    "truncate_output",
]
