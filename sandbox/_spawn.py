"""Spawning runs: the slot server's handles on its children, prepared ahead and handed a program.

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

from sandbox import _codec, _linux, _runspec
from sandbox._template import Template


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
