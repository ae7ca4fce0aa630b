"""Supervision of one run, outside the child: output caps, the wall clock, how the run ended.

The slot server drains the child's stdout/stderr with a shared cap (kill on overflow), enforces
the wall clock (SIGKILL through a pidfd of its own unreaped child), reaps it and reads its CPU
time. Only trusted facts classify a run: what this process did and saw, the kernel's wait status,
the run's CPU time and the cgroup's OOM-kill count for this job. Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import time
from collections.abc import Callable

from sandbox import _runspec
from sandbox._spawn import Child

#: Bytes of stdout/stderr kept in a ``run_tests`` report.
OUTPUT_EXCERPT = 64 << 10
#: The longest single wait (poll takes an int of milliseconds); longer waits loop.
MAX_WAIT_S = 3600.0


class Supervisor:
    """Drains a child's stdout/stderr with a shared cap and enforces a deadline."""

    def __init__(self, child: Child, cap: int, cleanup: Callable[[Child], None]) -> None:
        self.child = child
        self.cap = cap
        self.cleanup = cleanup
        self.killed_at = 0.0
        self.out = bytearray()
        self.err = bytearray()
        self.total = 0
        self.truncated = False
        self.killed_for = ""

    def kill(self, reason: str) -> None:
        """Kill the child's whole run, remembering why (the first reason wins)."""
        if not self.killed_for:
            self.killed_for = reason
            self.killed_at = time.monotonic()
        self.child.kill()

    def _drain(self, fd: int, buf: bytearray) -> bool:
        """Read what one pipe has; False at EOF."""
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return True
        except OSError:
            data = b""
        if not data:
            return False
        self._take(data, buf)
        return True

    def _take(self, data: bytes, buf: bytearray) -> None:
        room = self.cap - self.total
        if len(data) > room:
            buf += data[: max(room, 0)]
            self.total = self.cap
            self.truncated = True
            self.kill("output")
        else:
            buf += data
            self.total += len(data)

    def _drain_available(self, open_fds: dict[int, bytearray]) -> None:
        """Before giving up on the pipes, keep whatever is already in them."""
        for fd, buf in open_fds.items():
            for _ in range(64):  # bounded: the output is capped anyway
                try:
                    data = os.read(fd, 65536)
                except OSError:  # includes BlockingIOError: nothing more for now
                    break
                if not data:
                    break
                self._take(data, buf)

    def loop(
        self,
        deadline: float,
        extra: dict[int, object] | None = None,
        on_extra: Callable[[int], bool] | None = None,
        helper_pid: int = -1,
    ) -> None:
        """Run until the child has exited, its pipes are closed and the ``extra`` fds are done.

        ``extra`` fds (the verdict process's report pipe) are polled too; ``on_extra(fd)`` returns
        False once that fd is finished. At the deadline the child and ``helper_pid`` are killed.
        """
        child = self.child
        poller = select.poll()
        open_fds = {child.out_r: self.out, child.err_r: self.err}
        for fd in (*open_fds, child.pidfd, *(extra or {})):
            poller.register(fd, select.POLLIN)
        extra_open = set(extra or {})
        grace_deadline = 0.0
        while open_fds or child.status is None or extra_open:
            now = time.monotonic()
            if now >= deadline and not self.killed_for:
                self.kill("timeout")
                if helper_pid > 0:
                    with contextlib.suppress(OSError):
                        os.kill(helper_pid, signal.SIGKILL)
            if child.status is not None and not grace_deadline:
                # C is dead, and with a PID namespace so is everything it started: the pipes are
                # at EOF (5 s is only a safety net). Without one, escaped processes may still
                # hold them: kill them and drain briefly.
                self.cleanup(child)
                grace_deadline = now + (5.0 if child.pid_ns else 0.5)
            grace_over = grace_deadline and now >= grace_deadline and not extra_open
            # After a kill, give the kernel 5 s to tear the run down, then stop waiting.
            if grace_over or (self.killed_at and now >= self.killed_at + 5.0):
                # This process may itself have been descheduled past the grace period on a
                # loaded host: collect what the pipes already hold before returning.
                self._drain_available(open_fds)
                break
            wait = min(deadline, grace_deadline or deadline) - now
            events = poller.poll(min(max(0.0, wait), MAX_WAIT_S) * 1000 + 1)
            for fd, _ev in events:
                if fd in open_fds:
                    if not self._drain(fd, open_fds[fd]):
                        poller.unregister(fd)
                        del open_fds[fd]
                elif fd == child.pidfd:
                    poller.unregister(fd)
                    child.reap()
                elif fd in extra_open and on_extra is not None and not on_extra(fd):
                    poller.unregister(fd)
                    extra_open.discard(fd)


def classify(sup: Supervisor, spec: _runspec.RunSpec, oom_kills: int) -> tuple[str, str, int]:
    """Return (status, detail, exit_code) of a finished run.

    Only trusted facts decide, except that a final ``MemoryError`` line on stderr (the
    program's own) tells memory from other errors.
    """
    child = sup.child
    status = child.status
    if child.error:
        return "sandbox_error", child.error, 0
    if sup.killed_for == "output":
        return "output_limit", f"output exceeded {spec.output_bytes} bytes", exit_code(status)
    if sup.killed_for == "timeout":
        return "timeout", f"wall-clock limit of {spec.timeout_s:g} s", exit_code(status)
    if status is None:
        return "sandbox_error", "the run ended without a status", 0
    code = exit_code(status)
    if code != 0 and oom_kills:
        return "memory", "killed by the memory cgroup (OOM)", code
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu_limit_kill(child, spec)):
            return "timeout", f"CPU limit of {spec.cpu_s} s", code
        return "killed", f"killed by signal {signal.Signals(sig).name}", code
    if code == 0:
        # Exited 0 although one of its processes was OOM-killed: its own business, but said.
        oom_note = "a process of the run was killed by the memory cgroup (OOM)"
        return "ok", oom_note if oom_kills else "", 0
    tail = bytes(sup.err[-4096:]).decode("utf-8", "replace").strip().splitlines()
    if tail and tail[-1].startswith("MemoryError"):
        return "memory", f"MemoryError under the {spec.memory_mb} MB limit", code
    return "runtime_error", f"exit status {code}", code


def cpu_limit_kill(child: Child, spec: _runspec.RunSpec) -> bool:
    """Tell whether C's SIGKILL (not from the OOM killer) came from its RLIMIT_CPU.

    The CPU time C used is the evidence: rusage CPU time is tick-sampled and can read a little
    below the limit, hence the 0.8. Only when the sandbox never signalled C does a PID namespace
    settle it regardless: as pid 1 of its namespace the program cannot SIGKILL itself, so a
    SIGKILL that neither we nor the OOM killer sent is RLIMIT_CPU. Once we have sent one (after
    the verdicts, say) a SIGKILL is ours unless the CPU time says otherwise; reading it as the CPU
    limit reported a program without its entry point, killed as soon as the verdict process was
    done, as a timeout (a race with the program's own exit).
    """
    if child.cpu_s >= 0.8 * spec.cpu_s:
        return True
    return child.pid_ns and not child.killed_by_sandbox


def exit_code(status: int | None) -> int:
    if status is None:
        return 0
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 0


def decode_output(buf: bytearray, limit: int) -> str:
    return bytes(buf[:limit]).decode("utf-8", "replace")
