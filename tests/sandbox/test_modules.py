"""The sandbox's internal modules: one concern each, no import circles, the clone helper."""

from __future__ import annotations

import ast
import os
import signal
from pathlib import Path

import sandbox_helpers  # noqa: F401  (imports the real package first)

import sandbox
from sandbox import _linux

PACKAGE = Path(sandbox.__file__).parent


def import_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.glob("*.py"):
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.ImportFrom)
                and node.module
                and node.module.startswith("sandbox")
            ):
                if node.module == "sandbox":
                    deps |= {alias.name for alias in node.names}
                else:
                    deps.add(node.module.split(".")[1])
            elif isinstance(node, ast.Import):
                deps |= {a.name.split(".")[1] for a in node.names if a.name.startswith("sandbox.")}
        graph[path.stem] = deps & {p.stem for p in PACKAGE.glob("*.py")}
    return graph


def test_no_import_cycles_and_small_modules() -> None:
    graph = import_graph()
    assert "_spawn" in graph["_slot_state"] and "_runspec" in graph["_spawn"]  # the graph is real
    done: set[str] = set()

    def visit(name: str, path: tuple[str, ...]) -> None:
        assert name not in path, f"import cycle: {' -> '.join((*path, name))}"
        if name in done:
            return
        for dep in graph.get(name, ()):
            visit(dep, (*path, name))
        done.add(name)

    for name in graph:
        visit(name, ())
    sizes = {p.name: len(p.read_text().splitlines()) for p in PACKAGE.glob("_*.py")}
    assert max(sizes.values()) < 500, sizes


def _clone_and_wait(raw: bool) -> int:
    """In a helper process S (a child subreaper) fork T; T clones C with ``ParentClone``; C
    exits 7 if ``raise()`` works in it (glibc's cached thread id was set). Return the exit code
    S saw when waiting for C, which only a parent can (1 if S could not)."""
    read_fd, write_fd = os.pipe()
    helper = os.fork()
    if helper == 0:  # S
        code = 1
        try:
            _linux.libc.prctl(_linux.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
            template = os.fork()
            if template == 0:  # T
                try:
                    cloner = _linux.ParentClone()
                    if not raw:
                        cloner.clone_nr = -1  # force the portable double fork
                    pid = cloner.clone(0)
                    if pid == 0:  # C
                        result = 3
                        try:
                            signal.signal(signal.SIGUSR1, signal.SIG_IGN)
                            signal.raise_signal(signal.SIGUSR1)
                            result = 7
                        finally:
                            os._exit(result)
                    os.write(write_fd, pid.to_bytes(4, "little"))
                finally:
                    os._exit(0)
            os.waitpid(template, 0)
            pid = int.from_bytes(os.read(read_fd, 4), "little")
            _, status = os.waitpid(pid, 0)  # ChildProcessError unless C is S's child
            code = os.waitstatus_to_exitcode(status)
        finally:
            os._exit(code)
    os.close(write_fd)
    _, status = os.waitpid(helper, 0)
    os.close(read_fd)
    return os.waitstatus_to_exitcode(status)


def test_parent_clone_makes_children_of_the_callers_parent() -> None:
    assert _linux.ParentClone().usable  # x86_64/aarch64 with glibc: the raw clone is used
    assert _clone_and_wait(raw=True) == 7
    assert _clone_and_wait(raw=False) == 7


def test_each_process_imports_its_own_code_not_the_others() -> None:
    """The slot server's modules hold handles on T and V, never T's or V's own code."""
    graph = import_graph()

    def reach(name: str) -> set[str]:
        seen: set[str] = set()
        todo = [name]
        while todo:
            for dep in graph.get(todo.pop(), ()):
                if dep not in seen:
                    seen.add(dep)
                    todo.append(dep)
        return seen

    server = reach("_slot_server")
    assert {"_slot_state", "_spawn", "_calltests", "_supervise"} <= server
    assert not server & {"_template", "_verdict_server", "_verdict"}, server
    assert {"_verdict_server", "_mounts", "_child"} <= reach("_template")
