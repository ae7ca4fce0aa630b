"""A Sandbox used after fork(), and closed while another thread is mid-run.

A forked child shares the parent's slot pipes and request ids: results used to come back ``ok``
with the other process's output. ``close()`` from another thread used to raise ``ValueError``
in the running thread and leave a process under a sandbox uid.
"""

from __future__ import annotations

import os
import select
import threading
import time
from pathlib import Path

import pytest
from sandbox_helpers import FAST, processes_of

from sandbox import CallTest, Sandbox, SandboxClosedError, SandboxForkedError, Status


def _in_child(body: object, timeout_s: float = 60.0) -> str:
    """Run ``body()`` in a forked child; return what it returned (a str), or fail on a hang."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        os.close(read_end)
        try:
            out = str(body())  # type: ignore[operator]
        except BaseException as exc:
            out = f"raised {type(exc).__name__}: {exc}"
        os.write(write_end, out.encode()[:60000])
        os._exit(0)
    os.close(write_end)
    try:
        ready, _, _ = select.select([read_end], [], [], timeout_s)
        if not ready:
            os.kill(pid, 9)
            pytest.fail(f"the forked child hung for {timeout_s} s")
        chunks = []
        while chunk := os.read(read_end, 65536):
            chunks.append(chunk)
        return b"".join(chunks).decode()
    finally:
        os.close(read_end)
        os.waitpid(pid, 0)


def test_a_forked_child_is_refused_and_the_parent_keeps_its_results() -> None:
    with Sandbox(limits=FAST, workers=1) as box:
        assert box.run("print('before')").stdout == "before\n"

        def child() -> str:
            results = []
            for call in (
                lambda: box.run("print('child')"),
                lambda: box.run_many(["print('child')"]),
                lambda: box.run_tests(
                    "def f():\n    return 1\n", [CallTest("f()")], entry_point="f"
                ),
            ):
                try:
                    call()
                    results.append("ran")
                except SandboxForkedError as exc:
                    results.append("refused" if "fork" in str(exc) else f"unclear: {exc}")
            box.close()  # must not stop the parent's slot servers
            return " ".join(results)

        assert _in_child(child) == "refused refused refused"
        for i in range(12):  # the parent's slot is untouched and answers its own jobs
            res = box.run(f"print({i})")
            assert (res.status, res.stdout) == (Status.OK, f"{i}\n")


def test_close_while_another_thread_runs() -> None:
    box = Sandbox(limits=FAST, workers=2)
    uids = box.uids
    errors: list[BaseException] = []

    def run(many: bool) -> None:
        code = "import time\ntime.sleep(30)"
        try:
            box.run_many([code, code, code]) if many else box.run(code)
        except BaseException as exc:
            errors.append(exc)

    # One thread calls run itself, one goes through the pool (run_many).
    threads = [threading.Thread(target=run, args=(many,)) for many in (False, True)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 10
    while not processes_of(uids) and time.monotonic() < deadline:
        time.sleep(0.02)  # until a run is under way
    box.close()
    for thread in threads:
        thread.join(20)
        assert not thread.is_alive()
    assert len(errors) == 2
    assert all(isinstance(e, SandboxClosedError) and "closed" in str(e) for e in errors), errors
    assert processes_of(uids) == []
    with pytest.raises(SandboxClosedError):
        box.run("print(1)")


def test_oom_killer_order_run_then_verdict_server_then_trusted(sb: Sandbox) -> None:
    """The run's child goes first (1000), the verdict server next (500), S and T last."""
    res = sb.run("print(open('/proc/self/oom_score_adj').read())")
    assert res.stdout.strip() == "1000"
    assert sb.run_tests("def f():\n    return 1\n", [CallTest("f()")], entry_point="f").all_passed
    if not sb.uids:
        pytest.skip("needs the per-slot uids (root)")
    verdict_uids = {uid + 1 for uid in sb.uids}  # each slot's second uid
    verdict, trusted = [], []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            status = Path(f"/proc/{entry}/status").read_text()
            adj = int(Path(f"/proc/{entry}/oom_score_adj").read_text())
        except (OSError, ValueError):
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if int(fields["Uid"].split()[0]) in verdict_uids:
            verdict.append(adj)
        elif int(entry) in {slot.proc.pid for slot in sb._all}:  # the slot servers
            trusted.append(adj)
    assert verdict and all(adj == 500 for adj in verdict), verdict
    assert trusted and all(adj <= 0 for adj in trusted), trusted
