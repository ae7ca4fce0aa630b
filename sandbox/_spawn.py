"""The slot server's handles on the processes it starts: T, each run's child C, and V.

``Template`` drives T (``_template.py``, T's own code), ``Child`` and ``Spawner`` the children
T clones for runs, ``VerdictServer`` the verdict server V (``_verdict_server.py``, V's own code).

A child is cloned by the template (``_template.py``) and is this process's own child. This
process then sends it, over its own socket, the kind of run (network or not, ``/tmp`` size),
its stdout/stderr pipes, and later the program itself. One child is prepared ahead, right after
each reply, so a request only pays for sending the program, its rlimits, its files and running
it. Standard library only.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import socket
import sys
from collections.abc import Callable

from sandbox import _codec, _linux, _runspec
from sandbox._child import RunContext

#: The verdict server is replaced after this many jobs, bounding state left by trusted test code.
VERDICT_SERVER_JOBS = 500
#: T's script, started by ``Template`` (a fresh interpreter, never a fork of this process).
TEMPLATE_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_template.py")


class Child:
    """The slot server's handle on one untrusted child C (its own child: ``CLONE_PARENT``)."""

    def __init__(self, pid: int, ctl: socket.socket, out_r: int, err_r: int) -> None:
        self.pid = pid
        self.pidfd = os.pidfd_open(pid)  # our unreaped child: this is exactly that process
        self.ctl = ctl
        self.out_r = out_r
        self.err_r = err_r
        self.layers: list[str] = []
        self.error = ""
        self.status: int | None = None  # C's raw wait status once reaped
        self.cpu_s = 0.0
        # Set once the sandbox itself has sent C a SIGKILL: from then on a SIGKILL exit status
        # may be ours, and is not by itself evidence of RLIMIT_CPU (see ``_supervise``).
        self.killed_by_sandbox = False
        self.key: tuple[bool, int] = (False, 0)  # (network, max_file_mb) it was prepared for
        self.host_workdir = ""  # only without a mount namespace
        self.pid_ns = False  # cloned into a new PID namespace (pid 1 there)

    def kill(self) -> None:
        """SIGKILL C and with it its whole PID namespace; harmless once it has exited."""
        self.killed_by_sandbox = True
        with contextlib.suppress(OSError):
            signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)

    def reap(self) -> None:
        """Collect C's exit status and CPU time (call once its pidfd is readable)."""
        if self.status is None:
            _, status, usage = os.wait4(self.pid, 0)
            self.status, self.cpu_s = status, usage.ru_utime + usage.ru_stime
        self.read_ctl()

    def read_ctl(self) -> None:
        """Read the setup report(s) C sent before running the program."""
        while True:
            try:
                msg = self.ctl.recv(65536, socket.MSG_DONTWAIT)
            except OSError:
                return
            if not msg:
                return
            kind, body = msg[:1], msg[1:]
            if kind == b"L" and len(msg) == _runspec.LAYERS_REPORT.size:
                self.layers = _runspec.layer_names(_runspec.LAYERS_REPORT.unpack(msg)[1])
            elif kind == b"E":
                self.error = body.decode("utf-8", "replace")

    def close(self) -> None:
        """Kill and reap C if still needed, close every fd held for it, remove its work dir."""
        if self.status is None:
            self.kill()
            self.reap()
        for fd in (self.out_r, self.err_r, self.pidfd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.out_r = self.err_r = self.pidfd = -1
        self.ctl.close()
        if self.host_workdir:
            shutil.rmtree(self.host_workdir, ignore_errors=True)
            self.host_workdir = ""


class Spawner:
    """Prepares children through the template and hands them their programs."""

    def __init__(self, template: Template, uid: int) -> None:
        self.template = template
        self.uid = uid
        self.use_mount_ns = True  # switched off if the start-up probe shows mounts do not work
        self.raise_oom_score = os.geteuid() == 0  # only root may write another's oom_score_adj
        self.warm: Child | None = None  # a prepared child waiting for its program
        self.last_key: tuple[bool, int] | None = None
        self.run_counter = 0

    def prepare(self, network: bool, max_file_mb: int) -> Child:
        """Have the template clone a child that finds its kind of run (from us) waiting for it.

        The kind and the pipes are queued on the child's socket before the clone is asked for,
        so the child never waits for them (the template never reads that socket).
        """
        ctl, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        host_workdir = ""
        try:
            host_workdir = "" if self.use_mount_ns else self._host_workdir()
            kind = _runspec.Kind(network, max_file_mb, self.use_mount_ns, host_workdir)
            socket.send_fds(ctl, [kind.pack()], [out_w, err_w])
            pid, pid_ns = self.template.fork_run_child(theirs.fileno())
            if self.raise_oom_score:
                # The OOM killer must pick the run, never the slot's trusted processes (-1000,
                # which the child inherits). Written here, before its program is even sent,
                # rather than by the child: there it cost ~50 us of copy-on-write faults.
                with contextlib.suppress(OSError):
                    _linux.write_file(f"/proc/{pid}/oom_score_adj", "1000")
        except BaseException:
            ctl.close()
            for fd in (out_r, err_r):
                os.close(fd)
            if host_workdir:
                shutil.rmtree(host_workdir, ignore_errors=True)
            raise
        finally:
            theirs.close()
            os.close(out_w)
            os.close(err_w)
        child = Child(pid, ctl, out_r, err_r)
        child.key = (network, max_file_mb)
        child.pid_ns = pid_ns
        child.host_workdir = host_workdir
        for fd in (out_r, err_r):
            os.set_blocking(fd, False)
        return child

    def prewarm(self) -> None:
        """Prepare the next child now, while idle, for the last request's kind of run."""
        if self.warm is None and self.last_key is not None:
            with contextlib.suppress(OSError):
                self.warm = self.prepare(*self.last_key)

    def discard_warm(self, keep: Child | None = None) -> None:
        """Take the prepared child out of the pool; stop it unless it is ``keep``."""
        warm, self.warm = self.warm, None
        if warm is not None and warm is not keep:
            warm.close()

    def spawn(self, spec: _runspec.RunSpec, chan: int = -1) -> Child:
        """Start ``spec``'s program in a prepared child (made now if none matches); no waiting."""
        key = (spec.network, spec.max_file_mb)
        texts = [spec.code, spec.stdin]
        for name, content in spec.files.items():
            texts += (name, content)
        message = _codec.Message(b"R", spec.program_meta(), texts)
        del texts
        try:
            self.last_key = key
            child = self.warm if self.warm is not None and self.warm.key == key else None
            self.discard_warm(keep=child)
            for _attempt in range(2):
                if child is None:
                    child = self.prepare(*key)
                try:
                    message.send(child.ctl, [chan] if chan >= 0 else [])
                    return child
                except OSError:  # the prepared child died while waiting: use a fresh one
                    child.close()
                    child = None
        finally:
            message.close()
        raise OSError(errno.ECHILD, "could not start a child")

    def workdir_base(self) -> str:
        """Return the host folder of the work dirs of runs without a mount namespace."""
        return f"/tmp/grpo-sandbox-{self.uid if self.uid > 0 else os.getuid()}"

    def _host_workdir(self) -> str:
        """Without a mount namespace: a fresh private directory on the host, removed after."""
        base = self.workdir_base()
        os.makedirs(base, mode=0o711, exist_ok=True)
        self.run_counter += 1
        path = f"{base}/run-{os.getpid()}-{self.run_counter}"
        os.mkdir(path, 0o700)
        if self.uid > 0:
            os.chown(path, self.uid, self.uid)
        return path

    def close(self) -> None:
        """Stop the prepared child and remove the work-dir base."""
        self.discard_warm()
        with contextlib.suppress(OSError):
            os.rmdir(self.workdir_base())


class Template:
    """The slot server's handle on its template process T (``_template.py``)."""

    def __init__(self, ctx: RunContext) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            # A fresh interpreter with an empty environment, its socket on fd 3; our child,
            # so that what it clones with CLONE_PARENT is our child too.
            self.pid = os.posix_spawn(
                sys.executable,
                [sys.executable, "-I", "-S", TEMPLATE_SCRIPT],
                {},
                file_actions=[(os.POSIX_SPAWN_DUP2, theirs.fileno(), 3)],
            )
        finally:
            theirs.close()
        self.sock = ours
        try:
            ours.send(_codec.dumps(ctx.to_config()))  # one packet (a few KiB)
            hello = self.sock.recv(4096)
        except OSError:
            hello = b""
        if not hello.startswith(b"H"):
            self.close()
            raise OSError(errno.ECHILD, "the template process failed to start")
        self.host_dirs_hidden = hello[1:2] == b"1"
        self.landlock = hello[2:3] == b"1"

    def fork(self, kind: bytes, fd: int) -> tuple[int, bool]:
        """Clone a child of ours (C or V) that holds ``fd``; return (pid, in a new PID ns)."""
        socket.send_fds(self.sock, [kind], [fd])
        reply = self.sock.recv(_runspec.TEMPLATE_REPLY.size)
        if len(reply) != _runspec.TEMPLATE_REPLY.size:
            raise OSError(errno.ECHILD, "the template process is gone")
        what, value, pid_ns = _runspec.TEMPLATE_REPLY.unpack(reply)
        if what != b"P":
            raise OSError(value, f"clone failed: {os.strerror(value)}")
        return value, bool(pid_ns)

    def fork_run_child(self, fd: int) -> tuple[int, bool]:
        """Clone a run's child holding ``fd`` (its socket to us)."""
        return self.fork(b"C", fd)

    def fork_verdict_server(self, fd: int) -> int:
        """Clone a verdict server holding ``fd``."""
        return self.fork(b"V", fd)[0]

    def kill_uid(self) -> None:
        """Kill every process of the slot uid (``kill(-1)`` as that uid, in a helper)."""
        self.sock.send(b"U")
        self.sock.recv(_runspec.TEMPLATE_REPLY.size)

    def close(self) -> None:
        """Stop the template (its children are ours and stopped by the slot server)."""
        self.sock.close()
        with contextlib.suppress(OSError):
            os.kill(self.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)


class VerdictServer:
    """The slot server's handle on its verdict server V (``_verdict_server.py``).

    Killed and replaced when in doubt.

    Forking a fresh one per job would copy its working set every time; instead each job runs in a
    fresh namespace dict of this warm process. It is replaced when a job overruns its deadline,
    breaks the protocol, or after ``VERDICT_SERVER_JOBS`` jobs.
    """

    def __init__(self, fork: Callable[[int], int]) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        for sock in (ours, theirs):
            for opt, force in ((socket.SO_SNDBUF, 32), (socket.SO_RCVBUF, 33)):  # *BUFFORCE
                try:
                    sock.setsockopt(socket.SOL_SOCKET, force, 1 << 20)
                except OSError:  # not root: the largest unprivileged size
                    sock.setsockopt(socket.SOL_SOCKET, opt, 1 << 20)
        try:
            self.pid = fork(theirs.fileno())
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.pidfd = os.pidfd_open(self.pid)  # our own unreaped child (CLONE_PARENT)
        self.sock = ours
        self.jobs = 0
        self.alive = True

    def start(self, job: dict[str, object], chan: int) -> None:
        """Hand one job and V's end of the channel to the program's process to V."""
        tests = job.pop("tests", None)
        texts = [str(job.pop("setup", "") or ""), *(tests if isinstance(tests, list) else [])]
        if _codec.texts_size(texts) > _codec.MAX_REQUEST:  # the library refuses these first
            raise ValueError("setup + tests exceed the request size limit")
        message = _codec.Message(b"J", job, texts)
        try:
            message.send(self.sock, [chan])
        finally:
            message.close()
        self.jobs += 1

    def kill(self) -> None:
        """Stop V and reap it (it is replaced on the next job)."""
        if self.alive:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, 0)
            os.close(self.pidfd)
            self.sock.close()
            self.alive = False
