"""Code that runs inside the untrusted child, from its clone to the program's exit.

The template process (``_template.py``) clones a child for each run and hands it nothing but
one socket to the slot server; the child is born pristine (the template never held any job's
data). ``main`` then waits for the kind of run (network or not, the size of its ``/tmp``) and
its output pipes, applies every layer that does not depend on the program (as root, then as the
slot uid), waits for the program, applies its limits, writes its inputs and runs it.
Standard library only.
"""

from __future__ import annotations

import _socket
import atexit  # here, not in the child: importing it there cost ~0.1 ms per run
import builtins
import contextlib
import errno
import fcntl
import io
import os
import resource
import socket
import sys

from sandbox import _codec, _landlock, _linux, _mounts, _seccomp
from sandbox._runspec import (
    CGROUP_BIT,
    EMPTY_ENV_BIT,
    IPC_NS_BIT,
    LANDLOCK_BIT,
    LAYERS_REPORT,
    MOUNT_NS_BIT,
    NET_NS_BIT,
    NO_NEW_PRIVS_BIT,
    PID_NS_BIT,
    PROGRAM_META,
    RLIMITS_BIT,
    SECCOMP_BIT,
    SESSION_BIT,
    UID_BIT,
    Kind,
    layer_names,
)

#: The environment programs see (HOME and TMPDIR are their private work dir).
CHILD_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8",
    "PYTHONIOENCODING": "utf-8",
}  # fmt: skip
#: Largest request message (code, stdin, files and their metadata) a child accepts.
MAX_MESSAGE = _codec.MAX_REQUEST + _codec.MAX_META + (1 << 10)


class RunContext:
    """What the template prepared once for all its children (no job's data in it).

    A plain class, not a dataclass: ``dataclasses`` imports ``inspect`` and ``ast``, ~1.2 MB
    that the template would hold and every clone copy the page tables of.
    """

    def __init__(
        self,
        *,
        uid: int = -1,
        env_empty: bool = False,
        cgroup: bool = False,
        stdlib_dirs: list[str] | None = None,
        seccomp: dict[bool, _seccomp.SeccompFilter] | None = None,
        is_root: bool = False,
        expose_dirs: list[str] | None = None,
    ) -> None:
        self.uid = uid
        self.env_empty = env_empty
        self.cgroup = cgroup
        self.stdlib_dirs = stdlib_dirs or []
        self.seccomp = seccomp or {}
        self.is_root = is_root
        self.expose_dirs = expose_dirs or []
        """Toolchain folders runs may read and execute although a hidden folder holds them
        (rustc's sysroot under ``/root/.rustup``): bound read-only into the hidden folder."""
        self.host_dirs_hidden = False
        self.landlock: _landlock.Rules | None = None
        self.slot_net = False
        """The template is in an empty network namespace of the slot's (see ``isolate``)."""
        self.host_net = -1
        """An fd of the host's network namespace, for ``network=True`` runs (with ``slot_net``)."""
        self.keep_fds: frozenset[int] = frozenset()
        """``inherited_fds``, as of ``freeze``."""
        self.dev_shm: bool | None = None
        """Whether /dev/shm exists (``freeze``; None: not known)."""

    def to_config(self) -> dict[str, object]:
        """Return the slot server's settings as sent to the template at its start (JSON)."""
        return {
            "uid": self.uid,
            "env_empty": self.env_empty,
            "cgroup": self.cgroup,
            "stdlib_dirs": self.stdlib_dirs,
            "seccomp": {str(int(k)): f.program.hex() for k, f in self.seccomp.items()},
            "is_root": self.is_root,
            "expose_dirs": self.expose_dirs,
        }

    @classmethod
    def from_config(cls, config: dict[str, object]) -> RunContext:
        """Inverse of ``to_config`` (in the template)."""
        programs = config["seccomp"]
        dirs = config["stdlib_dirs"]
        exposed = config.get("expose_dirs") or []
        assert isinstance(programs, dict) and isinstance(dirs, list) and isinstance(exposed, list)
        return cls(
            uid=int(config["uid"]),  # type: ignore[call-overload]
            env_empty=config["env_empty"] is True,
            cgroup=config["cgroup"] is True,
            stdlib_dirs=[str(d) for d in dirs],
            seccomp={
                k == "1": _seccomp.SeccompFilter(bytes.fromhex(v)) for k, v in programs.items()
            },
            is_root=config["is_root"] is True,
            expose_dirs=[str(d) for d in exposed],
        )

    @property
    def inherited_fds(self) -> set[int]:
        """Fds a child keeps until its program starts (Landlock's O_PATH fds, the host netns)."""
        fds = set(self.landlock.fds) if self.landlock is not None else set()
        return fds | ({self.host_net} if self.host_net >= 0 else set())

    def freeze(self) -> None:
        """Compute, once in the template, what each child would otherwise recompute."""
        self.keep_fds = frozenset(self.inherited_fds)
        self.dev_shm = os.path.isdir("/dev/shm")  # in the template's mount namespace


#: What a child's two messages may carry: its kind (a few bytes and a path) with two pipes,
#: then its program (inline up to ``_codec.INLINE_MAX``, else a memfd) with at most its
#: memfd and the call channel.
_KIND_BUF = 1 << 12
_PROGRAM_BUF = _codec.INLINE_MAX + 2
_TWO_FDS = socket.CMSG_SPACE(2 * 4)


def report_error(ctl: _socket.socket, message: str) -> None:
    with contextlib.suppress(OSError):
        ctl.send(b"E" + message.encode("utf-8", "replace")[:4000])


def main(ctx: RunContext, ctl_fd: int, pid_ns: bool) -> None:
    """Live as a run's child: wait for the kind of run, isolate, wait for the program, run it.

    Every Python object this touches for the first time costs a copy-on-write page fault
    (~3 us each: the heap is the template's), so the path from the clone to the program is
    kept short: fixed binary messages, no JSON, no dict or list of layer names, direct calls.
    """
    try:
        _linux.set_pdeathsig()  # our parent is the slot server (CLONE_PARENT)
        _linux.close_all_except(ctx.keep_fds | {ctl_fd})
        # The plain _socket type with its type given: ``socket.socket(fileno=)`` runs Python
        # code and asks the kernel for the family, type and protocol.
        ctl = _socket.socket(_socket.AF_UNIX, _socket.SOCK_SEQPACKET, 0, ctl_fd)
    except BaseException:
        os._exit(125)
    try:
        # Already queued: the slot server sends it before asking the template for this clone.
        message, fds = _codec.recv_exact(ctl, _KIND_BUF, _TWO_FDS)
        kind = Kind.unpack(message)
        if kind is None or len(fds) != 2:
            os._exit(0)  # the slot server discarded this child
        layers = EMPTY_ENV_BIT if ctx.env_empty else 0
        if ctx.cgroup:
            layers |= CGROUP_BIT
        if pid_ns and os.getpid() == 1:
            layers |= PID_NS_BIT
        workdir, layers = isolate(ctx, kind, layers, ctl)
        await_program(ctx, workdir, layers, fds[0], fds[1], ctl)
    except BaseException as exc:
        report_error(ctl, f"setup: {exc!r}")
    os._exit(125)


def isolate(ctx: RunContext, kind: Kind, layers: int, ctl: _socket.socket) -> tuple[str, int]:
    """Apply every program-independent layer (as root, then the slot uid).

    Returns the work dir and ``layers`` with what was applied added.
    """
    libc = _linux.libc
    os.setsid()
    layers |= SESSION_BIT
    wanted = _linux.CLONE_NEWIPC
    if kind.network and ctx.slot_net:
        _linux.errno_call(libc.setns(ctx.host_net, _linux.CLONE_NEWNET), "setns(net)")
    elif not kind.network and ctx.slot_net:
        layers |= NET_NS_BIT
    elif not kind.network:
        # Without seccomp a run could leave sockets behind (in flight, with data in their
        # abstract names): then each run gets a network namespace of its own (~1 ms of CPU
        # plus an asynchronous teardown per run, so not the default).
        wanted |= _linux.CLONE_NEWNET
    if ctx.host_net >= 0:
        os.close(ctx.host_net)
    if kind.mount_ns:
        wanted |= _linux.CLONE_NEWNS
    if libc.unshare(wanted) == 0:
        got = wanted
    else:  # some hosts allow only some namespaces
        got = 0
        for flag in (_linux.CLONE_NEWIPC, _linux.CLONE_NEWNET, _linux.CLONE_NEWNS):
            if wanted & flag and libc.unshare(flag) == 0:
                got |= flag
    if got & _linux.CLONE_NEWIPC:
        layers |= IPC_NS_BIT
    if got & _linux.CLONE_NEWNET:
        layers |= NET_NS_BIT
    if got & _linux.CLONE_NEWNS:
        layers |= MOUNT_NS_BIT
        try:
            dev_shm = ctx.dev_shm  # as the template saw it, in the namespace this one copies
            if not ctx.host_dirs_hidden:
                _mounts.hide_host_dirs(ctx.stdlib_dirs, ctx.expose_dirs)
                dev_shm = None
            workdir = _mounts.setup_run_mounts(
                ctx.uid, kind.max_file_mb, bool(layers & PID_NS_BIT), dev_shm
            )
        except OSError as exc:
            report_error(ctl, f"mount namespace setup failed: {exc}")
            os._exit(125)
    else:
        workdir = kind.host_workdir
    os.chdir(workdir)
    _linux.errno_call(libc.prctl(_linux.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    layers |= NO_NEW_PRIVS_BIT
    if ctx.landlock is not None:
        # /dev/null and the fixed read paths are in ctx.landlock already; /dev/shm is private
        # and size-capped in the mount namespace.
        writable = [workdir, "/dev/shm"] if layers & MOUNT_NS_BIT else [workdir]
        try:
            ctx.landlock.restrict(
                ["/proc"], writable, deny_tcp=not kind.network, nnp_set=True, all_dirs=True
            )
            layers |= LANDLOCK_BIT
        except OSError:
            pass
    seccomp = ctx.seccomp.get(kind.network)
    if seccomp is not None:
        seccomp.load()
        layers |= SECCOMP_BIT
    return workdir, layers


def await_program(
    ctx: RunContext, workdir: str, layers: int, out_w: int, err_w: int, ctl: _socket.socket
) -> None:
    """Wait (isolated) for the program, then apply its limits, write its inputs and run it."""
    packet, fds = _codec.recv_exact(ctl, _PROGRAM_BUF, _TWO_FDS)
    kind, payload, fds = _codec.parse_message(packet, fds, MAX_MESSAGE)
    del packet
    if kind != b"R":
        os._exit(0)  # the slot server discarded this prepared child
    if ctx.uid > 0:
        # The slot uid only now that a program is here: the next child is prepared while the
        # current run executes, and as that uid it would count against the running program's
        # RLIMIT_NPROC (a per-uid count), taking one of its processes. Nothing untrusted has
        # run in this process yet, and no_new_privs, Landlock and seccomp (set while waiting)
        # allow a drop to an unprivileged uid.
        os.setgroups([])
        os.setresgid(ctx.uid, ctx.uid, ctx.uid)
        os.setresuid(ctx.uid, ctx.uid, ctx.uid)
        layers |= UID_BIT
        _linux.set_pdeathsig()  # credential changes clear it
    meta, texts = _codec.unpack_views(payload)
    if len(texts) < 2 or len(texts) % 2:
        raise _codec.CodecError("malformed program message")
    cpu_s, address_mb, max_file_mb, max_processes, required = PROGRAM_META.unpack_from(meta)
    entry_point, _nul, unknown = bytes(meta[PROGRAM_META.size :]).partition(b"\0")
    chan = fds[0] if fds else -1
    # texts: code, stdin, then (name, content) per file (``_spawn.spawn``).
    code = _codec.text_of(texts[0])
    stdin = texts[1]
    try:
        for i in range(2, len(texts) - 1, 2):
            name = _codec.text_of(texts[i])
            if os.path.dirname(name):
                os.makedirs(os.path.dirname(name), exist_ok=True)
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(_codec.text_of(texts[i + 1]))
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        tmp_mb = max(16, 2 * max_file_mb)
        report_error(
            ctl,
            f"the input files do not fit in the work dir: /tmp holds {tmp_mb} MiB "
            f"(2 x Limits.max_file_mb, at least 16) ({exc.strerror})",
        )
        os._exit(125)
    stdin_fd = os.memfd_create("stdin")
    # Written as the bytes that came (the slot server encoded the text: UTF-8, lone
    # surrogates kept), not decoded and encoded again.
    while stdin:
        stdin = stdin[os.write(stdin_fd, stdin) :]
    os.lseek(stdin_fd, 0, os.SEEK_SET)
    del texts, meta, payload, stdin
    mib = 1 << 20
    setrlimit = resource.setrlimit
    setrlimit(resource.RLIMIT_AS, (address_mb * mib, address_mb * mib))
    setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
    setrlimit(resource.RLIMIT_FSIZE, (max_file_mb * mib, max_file_mb * mib))
    setrlimit(resource.RLIMIT_NOFILE, (256, 256))
    setrlimit(resource.RLIMIT_CORE, (0, 0))
    setrlimit(resource.RLIMIT_MEMLOCK, (0, 0))
    setrlimit(resource.RLIMIT_NPROC, (max_processes, max_processes))
    layers |= RLIMITS_BIT
    missing = required & ~layers
    if missing:
        names = ", ".join([*layer_names(missing), *([unknown.decode()] if unknown else [])])
        report_error(ctl, f"required isolation layers unavailable: {names}")
        os._exit(125)
    ctl.send(LAYERS_REPORT.pack(b"L", layers))
    ctl.close()

    # Wire up fds 0-3 and drop everything else.
    staged = [fcntl.fcntl(fd, fcntl.F_DUPFD, 100) for fd in (stdin_fd, out_w, err_w)]
    chan_staged = fcntl.fcntl(chan, fcntl.F_DUPFD, 100) if chan >= 0 else -1
    for target, fd in enumerate(staged):
        os.dup2(fd, target)
    if chan_staged >= 0:
        os.dup2(chan_staged, 3)
    os.closerange(4 if chan_staged >= 0 else 3, 65536)
    if workdir != "/tmp":  # the template set HOME=TMPDIR=/tmp (``CHILD_ENV``)
        os.environ["HOME"] = os.environ["TMPDIR"] = workdir
    run_program(code, entry_point.decode() if chan_staged >= 0 else None)


def _std_streams() -> tuple[io.TextIOWrapper, io.TextIOWrapper, io.TextIOWrapper]:
    """Return text streams on fds 0, 1 and 2: the program's stdin, stdout and stderr."""
    return (
        io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8"),
        io.TextIOWrapper(
            io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="backslashreplace"
        ),
        io.TextIOWrapper(
            io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace",
            line_buffering=True,
        ),
    )  # fmt: skip


#: The program's streams, made once in the template (``prepare_template``).
_STREAMS: tuple[io.TextIOWrapper, io.TextIOWrapper, io.TextIOWrapper] | None = None


def prepare_template() -> None:
    """Build, once in the template, the interpreter state every child would otherwise build.

    Each of these cost every child a first time, measured: ``compile()`` creates the ``ast``
    node types on its first call (1.5 ms and ~90 page faults); making the three text streams
    touches the io and codec machinery (0.6 ms, ~80 faults; making them again, 0.05 ms). The
    streams are made here on stand-ins of the kinds a run's fds 0-2 will be (a memfd for stdin,
    a pipe for stdout/stderr: whether a stream is seekable is read once, when it is made), and
    a child puts its own fds in their place (``dup2``) before the program uses them. Nothing of
    a job is involved: this runs before the first clone.
    """
    global _STREAMS
    compile("pass", "main.py", "exec")
    made = [os.memfd_create("stdin"), *os.pipe()]
    # Above 2 first: the lowest free fds may be 0-2 themselves.
    stdin, read_end, write_end = (fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in made)
    for fd in made:
        os.close(fd)
    for source, target in ((stdin, 0), (write_end, 1), (write_end, 2)):
        os.dup2(source, target, inheritable=False)
    for fd in (stdin, read_end, write_end):
        os.close(fd)
    _STREAMS = _std_streams()


def run_program(code_text: str, entry_point: str | None) -> None:
    """Run the untrusted program in a fresh namespace; with an entry point then serve calls.

    Calls come on fd 3 (``run_tests``).
    """
    sys.stdin, sys.stdout, sys.stderr = _STREAMS or _std_streams()
    sys.argv = ["main.py"]
    serve = entry_point is not None
    name = "__sandbox_candidate__" if serve else "__main__"
    namespace: dict[str, object] = {"__name__": name, "__builtins__": builtins}
    code = 0
    try:
        exec(compile(code_text, "main.py", "exec"), namespace)
        if entry_point is not None:
            serve_calls(namespace, entry_point)
    except SystemExit as exc:
        if exc.code is None:
            code = 0
        elif isinstance(exc.code, int):
            code = exc.code & 0xFF
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException as exc:
        # Skip our own frame: the program sees a traceback that starts at main.py. The
        # interpreter's own printer (what an uncaught exception gets in ``python3 main.py``),
        # not the ``traceback`` module, which the template would have to hold (~0.5 MB).
        with contextlib.suppress(BaseException):
            tb = exc.__traceback__.tb_next if exc.__traceback__ else None
            sys.__excepthook__(type(exc), exc.with_traceback(tb), tb)
        code = 1
    with contextlib.suppress(BaseException):
        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):
            stream.flush()
    os._exit(code)


def serve_calls(namespace: dict[str, object], entry_point: str) -> None:
    """Untrusted side of the call channel: answer ``call`` frames with the function's results.

    Everything here runs inside the untrusted process and may be tampered with by the program;
    that is fine because the verdict process only ever receives plain values from it.
    """
    sys.stdout.flush()
    fn = namespace.get(entry_point)
    if not callable(fn):
        _codec.write_frame(
            3, _codec.dumps(["error", "NameError", f"entry point {entry_point!r} is not defined"])
        )
        return
    _codec.write_frame(3, _codec.dumps(["ready"]))
    reader = _codec.FrameReader()
    frames: list[bytes] = []
    while True:
        while not frames:  # one read per call in the usual case (not two: header, body)
            data = os.read(3, _codec.READ_CHUNK)
            if not data:
                return
            frames = reader.feed(data)
        raw = frames.pop(0)
        msg = _codec.loads(raw)
        if not isinstance(msg, list) or len(msg) != 4 or msg[0] != "call":
            return
        seq = msg[1]
        try:
            args = _codec.decode_value(msg[2], -1)  # the wrappers are not levels (_verdict)
            kwargs = _codec.decode_value(msg[3], -1)
            if not isinstance(args, list) or not isinstance(kwargs, dict):
                raise TypeError("malformed call")
            result = fn(*args, **kwargs)
            reply = ["ret", seq, _codec.encode_value(result)]
        except BaseException as exc:
            try:
                text = str(exc)[:2000]
            except BaseException:
                text = "<unprintable>"
            if isinstance(exc, _codec.CodecError):
                reply = ["exc", seq, "TypeError", f"return value not serializable: {text}"]
            else:
                reply = ["exc", seq, type(exc).__name__, text]
        payload = _codec.dumps(reply)
        if len(payload) > _codec.DEFAULT_MAX_FRAME:
            payload = _codec.dumps(["exc", seq, "ValueError", "return value too large"])
        _codec.write_frame(3, payload)
