"""The slot server's state: its resources, template, verdict server and prepared child.

``SlotState`` ties together what one slot owns (``_slot``: uid pair, cgroups; ``_template``: the
pristine process its children are cloned from; ``_spawn``: the prepared child;
``_verdict_server``: the trusted verdict process) and cleans up after runs and at exit.
Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal

from sandbox import _child, _codec, _linux, _runspec, _seccomp, _slot
from sandbox._spawn import VERDICT_SERVER_JOBS, Child, Spawner, Template, VerdictServer

#: The standard library's folders, which a run may read (``select``: the extension modules').
STDLIB_DIRS = sorted(
    {os.path.dirname(os.__file__), os.path.dirname(getattr(select, "__file__", os.__file__))}
)


class SlotState:
    """Per-slot state.

    Everything it starts is stopped, and everything it makes removed, by ``close``.
    """

    def __init__(self, pyseccomp_path: str | None, expose_dirs: list[str] | None = None) -> None:
        self.is_root = os.geteuid() == 0
        self.res = _slot.SlotResources(self.is_root)
        _linux.libc.prctl(_linux.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        if self.is_root:
            with contextlib.suppress(OSError):
                _linux.write_file(
                    "/proc/self/oom_score_adj", "-1000"
                )  # inherited by T (V raises its own)
        # The environment this process was started with (os.environ may hold LC_CTYPE, which the
        # interpreter itself sets under PEP 538); /proc shows the original block.
        try:
            with open("/proc/self/environ", "rb") as handle:
                env_empty = handle.read() == b""
        except OSError:
            env_empty = set(os.environ) <= {"LC_CTYPE"}
        self.ctx = _child.RunContext(
            uid=self.res.uid,
            env_empty=env_empty,
            cgroup=bool(self.res.cgroups),
            stdlib_dirs=list(STDLIB_DIRS),
            seccomp=_seccomp.build(pyseccomp_path),
            is_root=self.is_root,
            expose_dirs=expose_dirs,
        )
        self.template = Template(self.ctx)
        self.spawner = Spawner(self.template, self.res.uid)
        self.verdict: VerdictServer | None = None

    def verdict_server(self) -> VerdictServer:
        """Return the live verdict server (replaced after a kill, or after its job quota)."""
        if (
            self.verdict is None
            or not self.verdict.alive
            or (self.verdict.jobs >= VERDICT_SERVER_JOBS)
        ):
            if self.verdict is not None:
                self.verdict.kill()
            self.verdict = VerdictServer(self.template.fork_verdict_server)
        return self.verdict

    def spawn(self, spec: _runspec.RunSpec, chan: int = -1) -> Child:
        """Start a run: its cgroup limits, a fresh OOM baseline, then its program in a child."""
        texts = [spec.code, spec.stdin, *spec.files, *spec.files.values()]
        size = _codec.texts_size(texts)
        if size > _codec.MAX_REQUEST:  # the library refuses these first (ValueError)
            raise ValueError(f"the request takes {size} bytes, over {_codec.MAX_REQUEST}")
        self.res.set_limits(spec.memory_mb, spec.max_processes, size)
        self.res.start_job()
        return self.spawner.spawn(spec, chan)

    def prepare_next(self, running: Child) -> None:
        """Prepare the next run's child now, while ``running`` runs.

        The new child isolates itself (~2.5 ms of CPU: namespaces, mounts, Landlock, seccomp)
        on another core while this run executes, exits and is reported, instead of after it,
        on the next request's path: measured, this is what kept a 2-core machine from being
        busy with two slots. It holds nothing of either job: its program comes later, over
        its own socket. Only when ``running`` has a PID namespace: without one, the clean-up
        after a run kills every process of the slot uid, which would include it.
        """
        if running.pid_ns:
            self.spawner.prewarm()

    def cleanup(self, child: Child) -> None:
        """Kill anything the run left behind.

        With a PID namespace nothing can be left; without one, kill the run's cgroup members
        (but our own trusted processes), every process of the slot uid (``kill(-1)`` as that
        uid, done by the template), and every other child of ours (we are a child subreaper:
        orphaned daemons are re-parented to us; this works without root too). Whether the run
        had a PID namespace is what the template did when cloning it, not the child's report.
        """
        if child.pid_ns:
            return
        keep = self._trusted_pids()
        self.res.kill_members(frozenset(keep))
        self.template.kill_uid()
        self._kill_orphans(keep | {child.pid})

    def _trusted_pids(self) -> set[int]:
        pids = {self.template.pid}
        if self.verdict is not None and self.verdict.alive:
            pids.add(self.verdict.pid)
        if self.spawner.warm is not None:
            pids.add(self.spawner.warm.pid)
        return pids

    def _kill_orphans(self, keep: set[int]) -> None:
        """Kill (and reap) every child of ours but ``keep``."""
        for _ in range(20):
            try:
                with open(f"/proc/self/task/{os.getpid()}/children") as handle:
                    stray = [int(pid) for pid in handle.read().split() if int(pid) not in keep]
            except OSError:
                return
            if not stray:
                return
            for pid in stray:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            for pid in stray:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)

    def close(self) -> None:
        """Stop every process of the slot and remove the cgroups, work dirs and uid lock."""
        self.spawner.close()
        if self.verdict is not None:
            self.verdict.kill()
        self.template.close()
        self._kill_orphans(set())
        self.res.close()
