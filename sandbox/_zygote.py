"""The fork server ("zygote") and everything that runs below it.

Started by ``sandbox.core`` as ``/usr/bin/python3 -I -S _zygote.py CONFIG`` with an EMPTY
environment, so no process below it can inherit a secret. Standard library only (plus pyseccomp,
loaded by file path). It serves one request at a time over length-prefixed JSON frames on
stdin/stdout.

At start-up the zygote moves itself into its slot's cgroups and into an empty network and UTS
namespace (keeping a handle on the host's network namespace for ``network=True`` runs), so none
of that costs anything per run, and forks its long-lived verdict server. Per run it forks C:

    zygote (trusted, root)          supervises: output caps, wall clock, reaping, verdicts
      C (untrusted after setup)     forked right after unshare(CLONE_NEWPID), so it is pid 1 of a
                                    fresh PID namespace; then (``_child.py``): setsid,
                                    unshare(mount|ipc), fresh /proc + tmpfs /tmp + /dev/shm,
                                    hidden homes, drop to the slot uid, no_new_privs, Landlock,
                                    seccomp; waits for its program; rlimits; runs the program.
                                    The next C is prepared right after each reply.
      V "verdict server" (trusted)  run_tests only, unprivileged uid, long-lived: runs the TRUSTED
                                    test code (``_verdict.py``) against proxies that call C's
                                    function over a private socket

C is the zygote's own unreaped child, and it is killed through a pidfd, so a recycled pid can
never be hit; killing it tears down its whole PID namespace, which is how double-forked daemons
die with the run.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import gc
import importlib.util
import json
import os
import resource
import select
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING

_HERE = os.path.dirname(os.path.abspath(__file__))


def _load(name: str, path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


if TYPE_CHECKING:
    from sandbox import _child, _codec, _landlock, _verdict
else:  # by file path: this process runs with -I -S, the package is not importable
    _codec = _load("_sandbox_codec", os.path.join(_HERE, "_codec.py"))
    _landlock = _load("_sandbox_landlock", os.path.join(_HERE, "_landlock.py"))
    _child = _load("_sandbox_child", os.path.join(_HERE, "_child.py"))
    _verdict = _load("_sandbox_verdict", os.path.join(_HERE, "_verdict.py"))

CGROUP_ROOT = "/sys/fs/cgroup"
#: Syscalls no test program needs and every container escape wants (EPERM).
DENIED_SYSCALLS = (
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
    "mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree", "fsopen", "fsmount",
    "fsconfig", "fspick", "mount_setattr", "unshare", "setns",
    "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load", "reboot",
    "swapon", "swapoff", "acct", "quotactl", "keyctl", "add_key", "request_key", "bpf",
    "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
    "open_by_handle_at", "name_to_handle_at", "lookup_dcookie", "syslog", "settimeofday",
    "clock_settime", "clock_adjtime", "adjtimex", "sethostname", "setdomainname", "iopl",
    "ioperm", "fanotify_init", "personality", "vhangup", "uselib", "nfsservctl",
)  # fmt: skip
OUTPUT_EXCERPT = 64 << 10
#: Standard-library modules model-written code and test code often import. Imported once in the
#: zygote, they cost a child nothing (an import in the child reads, unmarshals and executes the
#: module, ~1.6 ms measured for random+heapq+copy+string); forked children do not share their
#: state (copy-on-write), and ``random`` reseeds itself in every child (its at-fork hook).
PRELOAD = (
    "array", "bisect", "collections", "copy", "dataclasses", "datetime", "decimal", "fractions",
    "functools", "hashlib", "heapq", "itertools", "math", "operator", "random", "re",
    "statistics", "string", "typing",
)  # fmt: skip


def _compile_bpf(pyseccomp_path: str, network: bool) -> bytes:
    """Compile one seccomp policy to a BPF program with libseccomp (via pyseccomp)."""
    seccomp = _load("pyseccomp", pyseccomp_path)
    filt = seccomp.SyscallFilter(seccomp.ALLOW)
    for name in DENIED_SYSCALLS:
        # A name that is not a syscall on this architecture is skipped.
        with contextlib.suppress(OSError, ValueError, RuntimeError):
            filt.add_rule(seccomp.ERRNO(errno.EPERM), name)
    # clone: no new namespaces. clone3 passes flags in memory where BPF cannot look, so it
    # gets ENOSYS and glibc falls back to clone (documented glibc behaviour).
    for flag in (
        _child.CLONE_NEWNS, _child.CLONE_NEWUTS, _child.CLONE_NEWIPC, _child.CLONE_NEWUSER,
        _child.CLONE_NEWPID, _child.CLONE_NEWNET, _child.CLONE_NEWCGROUP,
    ):  # fmt: skip
        filt.add_rule(
            seccomp.ERRNO(errno.EPERM), "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag)
        )
    filt.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
    if not network:
        filt.add_rule(
            seccomp.ERRNO(errno.EAFNOSUPPORT),
            "socket",
            seccomp.Arg(0, seccomp.NE, socket.AF_UNIX),
        )
    fd = os.memfd_create("bpf")
    with os.fdopen(fd, "w+b") as handle:
        filt.export_bpf(handle)
        handle.seek(0)
        return handle.read()


def _build_seccomp(pyseccomp_path: str | None) -> dict[bool, _child.SeccompFilter]:
    """Compile the two seccomp policies (network allowed or not) to BPF once, at start-up.

    Children only load the ready program with one prctl. The compilation runs in a throw-away
    child: pyseccomp imports ``ctypes.util``, hence ``subprocess`` and ``threading``, which would
    add ~1 MB to this process (copied at every fork) and a Python at-fork hook that every run's
    child would execute.
    """
    if not pyseccomp_path or not os.path.exists(pyseccomp_path):
        return {}
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_fd)
            for network in (False, True):
                _codec.write_frame(write_fd, _compile_bpf(pyseccomp_path, network))
        finally:
            os._exit(0)
    os.close(write_fd)
    programs: dict[bool, _child.SeccompFilter] = {}
    try:
        for network in (False, True):
            program = _codec.read_frame(read_fd, 1 << 20)
            if not program:  # the helper failed: no seccomp layer
                return {}
            programs[network] = _child.SeccompFilter(bytes(program))
    finally:
        os.close(read_fd)
        os.waitpid(pid, 0)
    return programs


# ---------------------------------------------------------------------------------------------
# Zygote state
# ---------------------------------------------------------------------------------------------


class Zygote:
    """Per-slot state: the uid pair, cgroups, compiled seccomp policies, detected layers."""

    def __init__(self, config: dict[str, object]) -> None:
        self.is_root = os.geteuid() == 0
        self.uid = -1
        self.lock_fd = -1
        if self.is_root:
            self._allocate_uid(int(str(config.get("uid_base", 60000))))
        self.cgroups: list[str] = []
        self.cgroup_limits: tuple[int, int] | None = None
        if self.is_root and self.uid > 0:
            self._setup_cgroups()
        self.oom_seen = 0
        self.oom_killed_since_last_check()
        pyseccomp_path = config.get("pyseccomp")
        self.seccomp = _build_seccomp(pyseccomp_path if isinstance(pyseccomp_path, str) else None)
        self.landlock_abi = _landlock.abi_version()
        self.run_counter = 0
        # The environment this process was started with (os.environ may hold LC_CTYPE, which the
        # interpreter itself sets under PEP 538); /proc shows the original block.
        try:
            with open("/proc/self/environ", "rb") as handle:
                self.env_empty = handle.read() == b""
        except OSError:
            self.env_empty = set(os.environ) <= {"LC_CTYPE"}
        self.verdict: VerdictServer | None = None
        self.warm: Child | None = None  # a prepared child waiting for its program
        self.last_key: tuple[bool, int] | None = None
        self.use_mount_ns = True  # switched off if the start-up probe shows mounts do not work
        # Namespaces entered once, here, instead of per run (a new network namespace per run
        # costs ~1 ms plus asynchronous teardown). Runs never share anything through them: every
        # process of a run dies with its PID namespace, and the empty network namespace has no
        # interface that an unprivileged uid could configure.
        self.own_pid_ns = -1
        self.host_net = -1
        self.net_isolated = False
        _child.libc.prctl(_child.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        if self.is_root:
            try:
                self.own_pid_ns = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
                self.host_net = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                pass
            self.net_isolated = _child.libc.unshare(_child.CLONE_NEWNET) == 0
            _child.libc.unshare(_child.CLONE_NEWUTS)
            with contextlib.suppress(OSError):
                _child.write_file("/proc/self/oom_score_adj", "-1000")
        # Interpreter paths the children must keep reading (stdlib, extension modules).
        self.stdlib_dirs = sorted(
            {
                os.path.dirname(os.__file__),
                os.path.dirname(getattr(select, "__file__", os.__file__)),
            }
        )
        self.landlock_reads = _minimal_paths(
            [*_child.READ_DIRS, *self.stdlib_dirs, *_child.READ_FILES, "/sys/devices/system/cpu"]
        )
        self.host_dirs_hidden = False
        if self.is_root:
            self.enter_mount_ns()
        # Rules for the paths every run shares, prepared once (after the mounts above: the rules
        # hold the inodes seen here). /proc is a fresh mount per run, so each child adds it.
        self.landlock: _landlock.Rules | None = None
        if self.landlock_abi > 0:
            with contextlib.suppress(OSError):
                fixed = [p for p in self.landlock_reads if p != "/proc"]
                self.landlock = _landlock.Rules(fixed, ["/dev/null"])

    # -- uid pair: lock files make the pair unique across every Sandbox on this machine --------
    def _allocate_uid(self, base: int) -> None:
        lock_dir = "/run/grpo-sandbox"
        try:
            os.makedirs(lock_dir, mode=0o700, exist_ok=True)
        except OSError:
            lock_dir = "/tmp/grpo-sandbox-locks"
            os.makedirs(lock_dir, mode=0o700, exist_ok=True)
        for uid in range(base, base + 4000, 2):
            fd = os.open(f"{lock_dir}/{uid}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                continue
            self.uid, self.lock_fd = uid, fd
            return

    def enter_mount_ns(self) -> None:
        """Hide the host's homes and checkouts once, in a mount namespace of our own.

        Runs copy this namespace (``unshare(CLONE_NEWNS)``) and add only their per-run mounts.
        Everything this process reads from hidden paths (its own modules, pyseccomp) is loaded
        by now; the verdict server, forked from here, sees the same hidden view.
        """
        if _child.libc.unshare(_child.CLONE_NEWNS) != 0:
            return
        with contextlib.suppress(OSError):
            _child.hide_host_dirs(self)
            self.host_dirs_hidden = True

    @property
    def verdict_uid(self) -> int:
        """The uid of the verdict process: the slot's second uid."""
        return self.uid + 1

    def _setup_cgroups(self) -> None:
        for controller in ("memory", "pids"):
            path = f"{CGROUP_ROOT}/{controller}/grpo-sandbox/u{self.uid}"
            try:
                os.makedirs(path, exist_ok=True)
                self._kill_cgroup(path)  # a stale one from a crashed zygote
                # Join once: every child inherits it. Moving each run in instead costs an RCU
                # grace period per write to cgroup.procs (3-25 ms measured here).
                _child.write_file(f"{path}/cgroup.procs", str(os.getpid()))
                self.cgroups.append(path)
            except OSError:
                self.cgroups = []
                return

    def set_cgroup_limits(self, memory_mb: int, max_processes: int, input_bytes: int = 0) -> None:
        """Set this run's cgroup limits (written only when they change: each write costs).

        The memory limit is ``memory_mb`` + 128 MB of headroom for the zygote and verdict process
        (also members) + 4x the run's inputs when they exceed 1 MiB, rounded up to 16 MiB: on
        their way in they are held by the zygote (a str), a memfd, the child (bytes, then str)
        and the files/stdin they become, and the program must still get its ``memory_mb``.
        """
        extra_mb = 0 if input_bytes <= 1 << 20 else 4 * (-(-input_bytes // (16 << 20)) * 16)
        limits = (memory_mb + 128 + extra_mb, max_processes)
        if limits == self.cgroup_limits:
            return
        self.cgroup_limits = limits
        for path in self.cgroups:
            try:
                if "/memory/" in path:
                    _child.write_file(f"{path}/memory.limit_in_bytes", str(limits[0] << 20))
                else:
                    _child.write_file(
                        f"{path}/pids.max", str(max_processes + 3)
                    )  # + zygote, V, spare
            except OSError:  # e.g. EBUSY when lowering below the current usage: retry next run
                self.cgroup_limits = None

    def oom_killed_since_last_check(self) -> bool:
        """Return True when the memory cgroup's OOM-kill counter grew since the last check.

        Only failed runs are checked (reading cgroup files costs); the counter is this slot's
        alone, so a kill is attributed to the run whose failure first observes it.
        """
        count = sum(_oom_kills(p) for p in self.cgroups if "/memory/" in p)
        grew, self.oom_seen = count > self.oom_seen, count
        return grew

    @staticmethod
    def _kill_cgroup(path: str, keep: frozenset[int] = frozenset()) -> None:
        """Kill every member of the cgroup but this process and ``keep``."""
        for _ in range(50):
            try:
                with open(f"{path}/cgroup.procs") as handle:
                    pids = [int(line) for line in handle if line.strip()]
                    pids = [pid for pid in pids if pid != os.getpid() and pid not in keep]
            except OSError:
                return
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.001)

    def cleanup(self, child: Child) -> None:
        """Kill anything the run left behind.

        With a PID namespace nothing can be left; without one, kill the run's cgroup members
        (but the verdict server), and as the slot uid ``kill(-1, SIGKILL)``, which reaches every
        process of that uid (POSIX kill semantics). Whether the run had a PID namespace is what
        this process did when forking it, not the child's report: a run killed before reporting
        its layers (its wall clock can run out while it is still being set up on a loaded host)
        once took this path and killed the verdict server with the cgroup.
        """
        if child.pid_ns:
            return
        keep = frozenset(v.pid for v in (self.verdict,) if v is not None and v.alive)
        for path in self.cgroups:
            self._kill_cgroup(path, keep)
        self._kill_orphans()
        if self.uid > 0:
            pid = os.fork()
            if pid == 0:
                try:
                    os.setresgid(self.uid, self.uid, self.uid)
                    os.setresuid(self.uid, self.uid, self.uid)
                    os.kill(-1, signal.SIGKILL)
                finally:
                    os._exit(0)
            os.waitpid(pid, 0)

    def _kill_orphans(self) -> None:
        """Kill (and reap) every child of ours but the verdict server and the prepared child.

        The zygote is a child subreaper, so daemons a run double-forked were reparented to it
        instead of to init; this is the cleanup that works without root.
        """
        keep = {c.pid for c in (self.verdict, self.warm) if c is not None}
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

    def prewarm(self) -> None:
        """Prepare the next child now, while idle, for the last request's kind of run."""
        if self.warm is None and self.last_key is not None:
            with contextlib.suppress(OSError):
                self.warm = _fork_child(self, *self.last_key)

    def discard_warm(self, keep: Child | None = None) -> None:
        """Take the prepared child out of the pool; stop it unless it is ``keep``."""
        warm, self.warm = self.warm, None
        if warm is not None and warm is not keep:
            warm.close()
            if warm.host_workdir:
                _rmtree(warm.host_workdir)

    def close(self) -> None:
        """Stop the verdict server, remove the cgroups and work-dir base, release the uid lock."""
        self.discard_warm()
        if self.verdict is not None:
            self.verdict.kill()
        with contextlib.suppress(OSError):
            os.rmdir(_host_workdir_base(self))
        for path in self.cgroups:
            self._kill_cgroup(path)
            with contextlib.suppress(OSError):
                os.rmdir(path)


def _minimal_paths(paths: list[str]) -> list[str]:
    """Resolve symlinks and drop paths inside another one (merged /usr: /bin -> /usr/bin, ...).

    Computed once in the zygote, so each child adds only the Landlock rules that matter.
    """
    resolved = sorted({os.path.realpath(p) for p in paths if os.path.exists(p)})
    kept: list[str] = []
    for path in resolved:
        if not any(path == k or path.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(path)
    return kept


def _oom_kills(path: str) -> int:
    try:
        with open(f"{path}/memory.oom_control") as handle:
            for line in handle:
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


# ---------------------------------------------------------------------------------------------
# Spawning one untrusted child
# ---------------------------------------------------------------------------------------------


class Child:
    """The zygote's handle on one running untrusted child C."""

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
        # may be ours, and is not by itself evidence of RLIMIT_CPU (see ``_classify``).
        self.killed_by_sandbox = False
        self.key: tuple[bool, int] = (False, 0)  # (network, max_file_mb) it was prepared for
        self.host_workdir = ""  # only without a mount namespace
        self.pid_ns = False  # forked into a new PID namespace (pid 1 there)

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
            if kind == b"L":
                self.layers = [str(x) for x in json.loads(body)]
            elif kind == b"E":
                self.error = body.decode("utf-8", "replace")

    def close(self) -> None:
        """Kill and reap C if still needed, and close every fd held for it."""
        if self.status is None:
            self.kill()
            self.reap()
        for fd in (self.out_r, self.err_r, self.pidfd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.out_r = self.err_r = self.pidfd = -1
        self.ctl.close()


def _fork_child(z: Zygote, network: bool, max_file_mb: int) -> Child:
    """Fork a child into a fresh PID namespace and isolate it; it then waits for its program.

    Everything that does not depend on the program (namespaces, mounts, uid, Landlock, seccomp)
    happens here, so a child can be prepared ahead of the request (``Zygote.prewarm``).
    """
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    # Default buffers: requests over INLINE_MAX travel in a memfd (``_codec.Message``).
    ctl_z, ctl_c = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    host_workdir = "" if z.use_mount_ns else _host_workdir(z)
    layers = ["empty_env"] if z.env_empty else []
    if z.cgroups:
        layers.append("cgroup")
    if not network and z.net_isolated:
        layers.append("net_ns")
    pid_ns = z.own_pid_ns >= 0 and _child.libc.unshare(_child.CLONE_NEWPID) == 0
    try:
        pid = os.fork()
    except OSError:
        pid = -1
    # Point our own future children (the verdict process, the next run) back at the zygote's
    # PID namespace; unshare(_child.CLONE_NEWPID) only affects children. If this failed every later
    # fork would fail, so the zygote exits and the library restarts it.
    if pid != 0 and pid_ns and _child.libc.setns(z.own_pid_ns, _child.CLONE_NEWPID) != 0:
        os._exit(70)
    if pid < 0:
        raise OSError(errno.EAGAIN, "fork failed")
    if pid == 0:  # the program process (pid 1 of its namespace)
        try:
            if pid_ns:
                layers.append("pid_ns")
            keep = {out_w, err_w, ctl_c.fileno()}
            if z.landlock is not None:
                keep.update(z.landlock.fds)  # closed with the rest before the program runs
            if network and z.host_net >= 0:
                keep.add(z.host_net)
            _child.close_all_except(keep)
            workdir = _child.isolate(z, network, max_file_mb, host_workdir, layers, ctl_c)
            _child.await_program(z, workdir, layers, out_w, err_w, ctl_c)
        except BaseException as exc:
            _child.report_error(ctl_c, f"setup: {exc!r}")
        os._exit(125)
    os.close(out_w)
    os.close(err_w)
    ctl_c.close()
    for fd in (out_r, err_r):
        os.set_blocking(fd, False)
    child = Child(pid, ctl_z, out_r, err_r)
    child.key = (network, max_file_mb)
    child.pid_ns = pid_ns
    child.host_workdir = host_workdir
    return child


def spawn(z: Zygote, spec: _child.RunSpec, chan: int = -1) -> Child:
    """Start ``spec``'s program in a prepared child (pre-forked if one matches); no waiting."""
    key = (spec.network, spec.max_file_mb)
    meta = {
        "cpu_s": spec.cpu_s,
        "memory_mb": spec.memory_mb,
        "max_file_mb": spec.max_file_mb,
        "max_processes": spec.max_processes,
        "entry_point": spec.entry_point,
        "required": spec.required,
    }
    texts = [spec.code, spec.stdin]
    for name, content in spec.files.items():
        texts += (name, content)
    size = _codec.texts_size(texts)
    if size > _codec.MAX_REQUEST:  # the library refuses these first (ValueError)
        raise ValueError(f"the request takes {size} bytes, over {_codec.MAX_REQUEST}")
    z.set_cgroup_limits(spec.memory_mb, spec.max_processes, size)
    message = _codec.Message(b"R", meta, texts)
    del texts
    try:
        z.last_key = key
        child = z.warm if z.warm is not None and z.warm.key == key else None
        z.discard_warm(keep=child)
        for _attempt in range(2):
            if child is None:
                child = _fork_child(z, *key)
            try:
                message.send(child.ctl, [chan] if chan >= 0 else [])
                return child
            except OSError:  # the prepared child died while waiting: use a fresh one
                child.close()
                if child.host_workdir:
                    _rmtree(child.host_workdir)
                child = None
    finally:
        message.close()
    raise OSError(errno.ECHILD, "could not start a child")


def _host_workdir_base(z: Zygote) -> str:
    return f"/tmp/grpo-sandbox-{z.uid if z.uid > 0 else os.getuid()}"


def _host_workdir(z: Zygote) -> str:
    """Without a mount namespace: a fresh private directory on the host, removed after the run."""
    base = _host_workdir_base(z)
    os.makedirs(base, mode=0o711, exist_ok=True)
    z.run_counter += 1
    path = f"{base}/run-{os.getpid()}-{z.run_counter}"
    os.mkdir(path, 0o700)
    if z.uid > 0:
        os.chown(path, z.uid, z.uid)
    return path


# ---------------------------------------------------------------------------------------------
# Supervision: output caps and the wall clock, enforced here, outside the child
# ---------------------------------------------------------------------------------------------


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
            events = poller.poll(max(0.0, wait) * 1000 + 1)
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


# ---------------------------------------------------------------------------------------------
# Requests
# ---------------------------------------------------------------------------------------------


def _classify(z: Zygote, sup: Supervisor, spec: _child.RunSpec) -> tuple[str, str, int]:
    """Return (status, detail, exit_code) of a finished run.

    Only trusted facts decide, except that a final ``MemoryError`` line on stderr (the
    program's own) tells memory from other errors.
    """
    child = sup.child
    status = child.status
    if child.error:
        return "sandbox_error", child.error, 0
    if sup.killed_for == "output":
        return "output_limit", f"output exceeded {spec.output_bytes} bytes", _exit_code(status)
    if sup.killed_for == "timeout":
        return "timeout", f"wall-clock limit of {spec.timeout_s:g} s", _exit_code(status)
    if status is None:
        return "sandbox_error", "the run ended without a status", 0
    code = _exit_code(status)
    if code != 0 and z.oom_killed_since_last_check():
        return "memory", "killed by the memory cgroup (OOM)", code
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig == signal.SIGXCPU or (sig == signal.SIGKILL and _cpu_limit_kill(child, spec)):
            return "timeout", f"CPU limit of {spec.cpu_s} s", code
        return "killed", f"killed by signal {signal.Signals(sig).name}", code
    if code == 0:
        return "ok", "", 0
    tail = bytes(sup.err[-4096:]).decode("utf-8", "replace").strip().splitlines()
    if tail and tail[-1].startswith("MemoryError"):
        return "memory", f"MemoryError under the {spec.memory_mb} MB limit", code
    return "runtime_error", f"exit status {code}", code


def _cpu_limit_kill(child: Child, spec: _child.RunSpec) -> bool:
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


def _exit_code(status: int | None) -> int:
    if status is None:
        return 0
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 0


def _decode_output(buf: bytearray, limit: int) -> str:
    return bytes(buf[:limit]).decode("utf-8", "replace")


def handle_run(z: Zygote, req: dict[str, object]) -> dict[str, object]:
    """Run one program; the reply mirrors ``sandbox.ExecResult``."""
    spec = _child.RunSpec(req)
    start = time.monotonic()
    child = spawn(z, spec)
    # The child has its own copy now: free ours (up to 64 MiB, charged to the run's cgroup).
    req.clear()
    spec.code = spec.stdin = ""
    spec.files = {}
    sup = Supervisor(child, spec.output_bytes, z.cleanup)
    try:
        sup.loop(start + spec.timeout_s)
    finally:
        child.close()
        z.cleanup(child)
        if child.host_workdir:
            _rmtree(child.host_workdir)
    status, detail, code = _classify(z, sup, spec)
    return {
        "status": status,
        "stdout": _decode_output(sup.out, spec.output_bytes),
        "stderr": _decode_output(sup.err, spec.output_bytes),
        "exit_code": code if status != "sandbox_error" else None,
        "wall_s": time.monotonic() - start,
        "isolation": child.layers,
        "truncated": sup.truncated,
        "detail": detail,
    }


def _rmtree(path: str) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# run_tests: the verdict server (its job logic is in _verdict.py)
# ---------------------------------------------------------------------------------------------


#: Largest job message (setup, test sources and their metadata) the verdict server accepts.
MAX_VERDICT_MESSAGE = _codec.MAX_REQUEST + _codec.MAX_META + (1 << 10)
#: The verdict server is replaced after this many jobs, bounding state left by trusted test code.
VERDICT_SERVER_JOBS = 500


class VerdictServer:
    """A long-lived verdict process per slot (trusted test code, unprivileged uid, no network).

    Forking a fresh one per job would copy its working set every time; instead each job runs in a
    fresh namespace dict of this warm process. It is killed and replaced when a job overruns its
    deadline or after ``VERDICT_SERVER_JOBS`` jobs.
    """

    def __init__(self, z: Zygote) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        for sock in (ours, theirs):
            for opt, force in ((socket.SO_SNDBUF, 32), (socket.SO_RCVBUF, 33)):  # *BUFFORCE
                try:
                    sock.setsockopt(socket.SOL_SOCKET, force, 1 << 20)
                except OSError:  # not root: the largest unprivileged size
                    sock.setsockopt(socket.SOL_SOCKET, opt, 1 << 20)
        pid = os.fork()
        if pid == 0:
            with contextlib.suppress(BaseException):
                ours.close()
                _child.close_all_except({theirs.fileno()})
                _verdict_server(z, theirs)
            os._exit(0)
        theirs.close()
        self.pid = pid
        self.sock = ours
        self.jobs = 0
        self.alive = True

    def start(self, job: dict[str, object], chan: int) -> None:
        """Hand one job (and the program's end of nothing: V's end of the channel) to V."""
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
        """Stop V (it is replaced on the next job)."""
        if self.alive:
            with contextlib.suppress(OSError):
                os.kill(self.pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, 0)
            self.sock.close()
            self.alive = False


def _verdict_server(z: Zygote, sock: socket.socket) -> None:
    """V's main loop: drop privileges once, then run jobs until the zygote goes away."""
    _child.set_pdeathsig()
    if z.uid > 0:
        os.setgroups([])
        os.setresgid(z.verdict_uid, z.verdict_uid, z.verdict_uid)
        os.setresuid(z.verdict_uid, z.verdict_uid, z.verdict_uid)
        _child.set_pdeathsig()
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
    _child.libc.prctl(_child.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)

    def report(message: list[object]) -> None:
        sock.send(_codec.dumps(message))

    while True:
        kind, payload, fds = _codec.recv_message(sock, MAX_VERDICT_MESSAGE, maxfds=1)
        if kind != b"J" or not fds:
            return
        chan = socket.socket(fileno=fds[0])
        try:
            job, texts = _codec.unpack_texts(payload)
            del payload
            job["setup"], job["tests"] = texts[0], texts[1:]
            _verdict.run_job(job, int(job["first"]), chan, report)
        except Exception as exc:
            report(["setup_error", f"verdict server: {type(exc).__name__}: {exc}"[:500]])
        finally:
            chan.close()
        report(["done"])


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


def handle_tests(z: Zygote, req: dict[str, object]) -> dict[str, object]:
    """Run CallTests: respawn the program after a test kills it; every verdict comes from V."""
    spec = _child.RunSpec(req)
    spec.entry_point = str(req.get("entry_point") or "")
    sources = req.get("tests")
    if not isinstance(sources, list):
        raise ValueError("tests must be a list")
    n = len(sources)
    per_test = float(str(req.get("per_test_timeout_s") or spec.timeout_s))
    spec.cpu_s = int(spec.timeout_s + n * per_test) + 1
    stop_first = bool(req.get("stop_on_first_failure"))
    start = time.monotonic()
    results: dict[int, tuple[str, str]] = {}
    out, err = bytearray(), bytearray()
    program_status, layers = "ok", []
    while len(results) < n:
        first = len(results)
        rnd = _Round(results)
        sup, run_status, run_detail = _run_round(z, spec, req, first, per_test, rnd)
        layers = sup.child.layers
        out += sup.out[: max(OUTPUT_EXCERPT - len(out), 0)]
        err += sup.err[: max(OUTPUT_EXCERPT - len(err), 0)]
        death = _death(run_status)
        for index in rnd.died_at:
            detail = results[index][1]
            results[index] = (death, f"{detail}; {run_detail}" if run_detail else detail)
        if program_status == "ok":
            if any(results[i][0] == "timeout" for i in results if i >= first):
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
            break
    not_run = ("failed", "not run: an earlier test failed (stop_on_first_failure)")
    return {
        "results": [[index, *results.get(index, not_run)] for index in range(n)],
        "status": program_status,
        "wall_s": time.monotonic() - start,
        "isolation": layers,
        "stdout": out.decode("utf-8", "replace"),
        "stderr": err.decode("utf-8", "replace"),
    }


def _run_round(
    z: Zygote,
    spec: _child.RunSpec,
    req: dict[str, object],
    first: int,
    per_test: float,
    rnd: _Round,
) -> tuple[Supervisor, str, str]:
    """Spawn the program and a verdict process for tests ``first``..; return how the run ended."""
    n = len(req["tests"])  # type: ignore[arg-type]
    if z.verdict is None or not z.verdict.alive or z.verdict.jobs >= VERDICT_SERVER_JOBS:
        if z.verdict is not None:
            z.verdict.kill()
        z.verdict = VerdictServer(z)
    verdict = z.verdict
    chan_u, chan_v = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    child = spawn(z, spec, chan_u.fileno())
    chan_u.close()
    job = {k: req.get(k) for k in ("tests", "setup", "entry_point", "per_test_timeout_s", "limits")}
    job["first"] = first
    job["stop_on_first_failure"] = bool(req.get("stop_on_first_failure"))
    try:
        verdict.start(job, chan_v.fileno())
    finally:
        chan_v.close()
    sup = Supervisor(child, spec.output_bytes, z.cleanup)
    rnd.sup = sup
    deadline = time.monotonic() + spec.timeout_s + (n - first) * per_test + 1.0
    vfd = verdict.sock.fileno()
    try:
        sup.loop(deadline, {vfd: None}, rnd.on_report, verdict.pid)
    finally:
        child.close()
        z.cleanup(child)
        if not rnd.done:  # V died, overran the deadline or broke protocol: replace it
            verdict.kill()
        if child.host_workdir:
            _rmtree(child.host_workdir)
    killed_after_verdicts = sup.killed_for == "verdict_done"
    if killed_after_verdicts:
        sup.killed_for = ""  # our own kill after the verdicts says nothing about the program
        if not rnd.died_at and rnd.ready:
            child.status = 0
    run_status, run_detail, _code = _classify(z, sup, spec)
    if run_status == "killed":
        run_status = "runtime_error"
        if killed_after_verdicts and _exit_code(child.status) == -signal.SIGKILL:
            # Whether C exited by itself before our SIGKILL landed is a race: keep the detail
            # deterministic (V's own report says what went wrong).
            run_detail = ""
    return sup, run_status, run_detail


# ---------------------------------------------------------------------------------------------
# Main loop
# ---------------------------------------------------------------------------------------------


_PROBE_LIMITS = {
    "timeout_s": 10, "cpu_s": 5, "memory_mb": 512, "output_bytes": 1024,
    "max_processes": 8, "max_file_mb": 1, "network": False,
}  # fmt: skip


def main() -> None:
    """Serve requests until stdin closes."""
    config = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    # Keep the protocol on private fds; 0/1 become /dev/null so nothing can corrupt the stream.
    req_fd = fcntl.fcntl(0, fcntl.F_DUPFD_CLOEXEC, 10)
    rep_fd = fcntl.fcntl(1, fcntl.F_DUPFD_CLOEXEC, 10)
    null = os.open("/dev/null", os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    if not config.get("debug"):
        os.dup2(null, 2)
    os.close(null)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    for name in PRELOAD:  # before forking anything: children inherit them for free
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    z = Zygote(config)
    probe = handle_run(z, {"code": "pass", "limits": _PROBE_LIMITS})
    if probe["status"] != "ok":
        # Most likely mounts are refused here: retry without the mount namespace.
        z.use_mount_ns = False
        probe = handle_run(z, {"code": "pass", "limits": _PROBE_LIMITS})
    layers = list(probe["isolation"])  # type: ignore[call-overload]
    # The programs' environment, set once here (children inherit it): nothing from the library.
    os.environ.clear()
    os.environ.update(_child.CHILD_ENV)
    hello = {
        "op": "hello",
        "layers": layers,
        "probe_status": probe["status"],
        "probe_detail": probe["detail"],
        "uid": z.uid,
        "landlock_abi": z.landlock_abi,
        "pid": os.getpid(),
    }
    # Children fork from here: freeze the heap so that the cyclic GC in a child never touches
    # (and so copies) the zygote's objects (the "gc.freeze before fork" recipe, Python docs).
    default = config.get("default_limits")
    if isinstance(default, dict):
        z.last_key = (bool(default.get("network")), int(default.get("max_file_mb", 64)))
        z.prewarm()
    z.verdict = VerdictServer(z)
    gc.collect()
    gc.freeze()
    _codec.write_frame(rep_fd, _codec.dumps(hello))
    try:
        while True:
            raw = _codec.read_frame(req_fd, 1 << 30)
            if raw is None:
                break
            req = json.loads(raw)
            del raw  # up to 64 MiB of request: not kept while the run is served
            op = req.get("op")
            try:
                if op == "run":
                    reply = handle_run(z, req)
                elif op == "tests":
                    reply = handle_tests(z, req)
                else:
                    reply = {"error": f"unknown op {op!r}"}
            except Exception as exc:
                reply = {"error": f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"[:4000]}
            _codec.write_frame(rep_fd, _codec.dumps(reply))
            z.prewarm()  # off the critical path: the library is busy reading the reply
    finally:
        z.close()


if __name__ == "__main__":
    main()
