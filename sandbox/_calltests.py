"""``run_tests`` with CallTests, in the slot server: rounds of (program, verdict server).

A round spawns the program (a fresh child of the template) and hands the tests from ``first``
on to the verdict server, which reports one verdict per test; when a test kills the program,
the next round starts a new one for the remaining tests. Every verdict comes from the verdict
server (trusted test code against proxies), never from the program. Standard library only.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time

from sandbox import _codec, _runspec
from sandbox._slot_state import SlotState
from sandbox._supervise import OUTPUT_EXCERPT, Supervisor, classify, exit_code


class _Round:
    """One spawn of the program plus one verdict process, covering tests ``first`` onwards."""

    def __init__(self, results: dict[int, tuple[str, str]]) -> None:
        self.results = results
        self.done = False
        self.ready = False
        self.not_ready: tuple[str, str] | None = None
        self.setup_error: str | None = None
        self.died_at: list[int] = []
        self.sup: Supervisor | None = None

    def on_report(self, fd: int) -> bool:
        """Consume one message from V; False once V is done with this job (or gone)."""
        try:
            raw = os.read(fd, _codec.READ_CHUNK)  # V's reports are < 1 KiB packets
        except OSError:
            raw = b""
        if raw:
            msg = json.loads(raw)
            if msg == ["done"]:
                self.done = True
        if not raw or self.done:
            if self.sup is not None:
                self.sup.kill("verdict_done")  # V is finished: stop the program now
            return False
        if msg[0] == "ready":
            self.ready = True
        elif msg[0] == "not_ready":
            self.not_ready = (str(msg[1]), str(msg[2]))
        elif msg[0] == "setup_error":
            self.setup_error = str(msg[1])
        elif msg[0] == "result":
            index, status, detail = int(msg[1]), str(msg[2]), str(msg[3])
            if status == "died":
                self.died_at.append(index)
            self.results[index] = (status, detail)
        return True


def _death(run_status: str) -> str:
    """Return the status of a test during which the program died, given how the run ended."""
    if run_status in ("output_limit", "memory", "timeout", "sandbox_error"):
        return run_status
    return "runtime_error"


def handle_tests(server: SlotState, req: dict[str, object]) -> dict[str, object]:
    """Run CallTests: respawn the program after a test kills it; every verdict comes from V."""
    spec = _runspec.RunSpec(req)
    spec.entry_point = str(req.get("entry_point") or "")
    sources = req.get("tests")
    if not isinstance(sources, list):
        raise ValueError("tests must be a list")
    n = len(sources)
    per_test = float(str(req.get("per_test_timeout_s") or spec.timeout_s))
    spec.cpu_s = int(spec.timeout_s + n * per_test) + 1
    stop_first = bool(req.get("stop_on_first_failure"))
    stop_program = bool(req.get("stop_on_program_failure"))
    not_run = ("failed", "not run")
    start = time.monotonic()
    results: dict[int, tuple[str, str]] = {}
    out, err = bytearray(), bytearray()
    program_status, layers = "ok", []
    while len(results) < n:
        first = len(results)
        rnd = _Round(results)
        sup, run_status, run_detail = _run_round(server, spec, req, first, per_test, rnd)
        layers = sup.child.layers
        out += sup.out[: max(OUTPUT_EXCERPT - len(out), 0)]
        err += sup.err[: max(OUTPUT_EXCERPT - len(err), 0)]
        death = _death(run_status)
        for index in rnd.died_at:
            detail = results[index][1]
            results[index] = (death, f"{detail}; {run_detail}" if run_detail else detail)
        timed_out = any(results[i][0] == "timeout" for i in results if i >= first)
        if program_status == "ok":
            if timed_out:
                program_status = "timeout"
            elif rnd.died_at:
                program_status = death
        if rnd.setup_error is not None:
            for index in range(first, n):
                results[index] = ("sandbox_error", f"setup failed: {rnd.setup_error}")
            program_status = "sandbox_error"
            break
        if not rnd.ready:
            # The module level failed or hung: deterministic, so no respawn.
            kind, why = rnd.not_ready or ("error", "")
            status = "timeout" if kind == "timeout" or sup.killed_for == "timeout" else death
            why = why or run_detail or "the program exited before serving tests"
            if run_detail and run_detail not in why:
                why = f"{why}; {run_detail}"
            for index in range(first, n):
                results[index] = (status, why)
            if program_status == "ok":
                program_status = status
            break
        if len(results) == first:  # no progress: killed by the overall deadline
            for index in range(first, n):
                results[index] = ("timeout", "the overall time limit was reached")
            program_status = "timeout"
            break
        if stop_first and any(s != "passed" for s, _ in results.values()):
            not_run = ("failed", "not run: an earlier test failed (stop_on_first_failure)")
            break
        if stop_program and (rnd.died_at or timed_out):
            not_run = ("failed", "not run: the program failed in an earlier test")
            break
    return {
        "results": [[index, *results.get(index, not_run)] for index in range(n)],
        "status": program_status,
        "wall_s": time.monotonic() - start,
        "isolation": layers,
        "stdout": out.decode("utf-8", "replace"),
        "stderr": err.decode("utf-8", "replace"),
    }


def _run_round(
    server: SlotState,
    spec: _runspec.RunSpec,
    req: dict[str, object],
    first: int,
    per_test: float,
    rnd: _Round,
) -> tuple[Supervisor, str, str]:
    """Spawn the program and a verdict process for tests ``first``..; return how the run ended."""
    n = len(req["tests"])  # type: ignore[arg-type]
    verdict = server.verdict_server()
    chan_u, chan_v = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        child = server.spawn(spec, chan_u.fileno())
    finally:
        chan_u.close()
    job = {k: req.get(k) for k in ("tests", "setup", "entry_point", "per_test_timeout_s", "limits")}
    job["first"] = first
    job["stop_on_first_failure"] = bool(req.get("stop_on_first_failure"))
    try:
        verdict.start(job, chan_v.fileno())
    finally:
        chan_v.close()
    server.prepare_next(child)
    sup = Supervisor(child, spec.output_bytes, server.cleanup)
    rnd.sup = sup
    deadline = time.monotonic() + spec.timeout_s + (n - first) * per_test + 1.0
    vfd = verdict.sock.fileno()
    try:
        sup.loop(deadline, {vfd: None}, rnd.on_report, verdict.pid)
    finally:
        child.close()
        server.cleanup(child)
        if not rnd.done:  # V died, overran the deadline or broke protocol: replace it
            verdict.kill()
    killed_after_verdicts = sup.killed_for == "verdict_done"
    if killed_after_verdicts:
        sup.killed_for = ""  # our own kill after the verdicts says nothing about the program
        if not rnd.died_at and rnd.ready:
            child.status = 0
    run_status, run_detail, _code = classify(sup, spec, server.res.oom_kills_of_job())
    if run_status == "killed":
        run_status = "runtime_error"
        if killed_after_verdicts and exit_code(child.status) == -signal.SIGKILL:
            # Whether C exited by itself before our SIGKILL landed is a race: keep the detail
            # deterministic (V's own report says what went wrong).
            run_detail = ""
    return sup, run_status, run_detail
