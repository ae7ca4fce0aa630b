"""Code that runs inside the untrusted child, from fork to the program's exit.

The fork server (``_zygote.py``) forks a child into a fresh PID namespace; ``isolate`` then applies
every layer that does not depend on the program (as root, then as the slot uid), and
``await_program`` waits for the program, applies its limits, writes its inputs and runs it.
Standard library + ``_codec``/``_landlock`` only: the fork server loads this file by path.
"""

from __future__ import annotations

import atexit  # here, not in the child: importing it there cost ~0.1 ms per run
import builtins
import contextlib
import ctypes
import errno
import fcntl
import io
import json
import os
import resource
import signal
import socket
import sys
import traceback
from typing import TYPE_CHECKING

if TYPE_CHECKING or "_sandbox_codec" not in sys.modules:
    from sandbox import _codec
else:  # inside the fork server, which loaded it by file path
    _codec = sys.modules["_sandbox_codec"]

if TYPE_CHECKING:
    from sandbox._zygote import Zygote

libc = ctypes.CDLL(None, use_errno=True)

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
CLONE_NEWCGROUP = 0x02000000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REC = 16384
MS_PRIVATE = 1 << 18
PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38
PR_SET_CHILD_SUBREAPER = 36
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2


#: Host directories hidden (empty read-only tmpfs) inside the mount namespace: homes, checkouts,
#: runtime secrets (/run/secrets). Skipped when the interpreter itself lives below one of them.
HIDDEN_DIRS = ("/root", "/home", "/work", "/mnt", "/media", "/srv", "/run", "/var/tmp", "/opt")
#: Directories the program may read and execute from (Landlock); writes only in its work dir.
READ_DIRS = ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc", "/proc")
READ_FILES = ("/dev/null", "/dev/zero", "/dev/urandom", "/dev/random", "/dev/full")
#: The environment programs see (HOME and TMPDIR are their private work dir).
CHILD_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8",
    "PYTHONIOENCODING": "utf-8",
}  # fmt: skip
#: The layer names and order of ``sandbox.types.ALL_LAYERS`` (this file cannot import the package).
ALL_LAYERS = (
    "empty_env", "session", "cgroup", "pid_ns", "net_ns", "mount_ns", "ipc_ns", "uid", "rlimits",
    "no_new_privs", "landlock", "seccomp",
)  # fmt: skip
LAYER_ORDER = {name: i for i, name in enumerate(ALL_LAYERS)}


def errno_call(res: int, what: str) -> None:
    if res != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def close_all_except(keep: set[int]) -> None:
    """Close every fd except ``keep`` (closerange between the kept ones)."""
    low = 0
    for fd in sorted(keep):
        if fd > low:
            os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 65536)


def set_pdeathsig() -> None:
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class SockFprog(ctypes.Structure):
    _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_void_p))


class SeccompFilter:
    """A compiled BPF program wrapped for ``prctl`` once, in the fork server.

    Each child only makes the one ``prctl`` call; the kernel checks and JITs the program then.
    """

    def __init__(self, program: bytes) -> None:
        self._buf = ctypes.create_string_buffer(program, len(program))
        self._prog = SockFprog(len(program) // 8, ctypes.cast(self._buf, ctypes.c_void_p))
        self._ref = ctypes.byref(self._prog)

    def load(self) -> None:
        """Install the filter on the calling thread (irreversible; needs no_new_privs)."""
        errno_call(libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, self._ref, 0, 0), "seccomp")


def write_file(path: str, value: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


class RunSpec:
    """One run's parameters, parsed from the request (trusted: it comes from the library)."""

    def __init__(
        self, req: dict[str, object], child_request: dict[str, object] | None = None
    ) -> None:
        limits = req.get("limits")
        if child_request is not None:  # the subset the zygote forwards to a prepared child
            limits = {**child_request, "timeout_s": 0, "output_bytes": 0, "network": False}
            req = child_request
        if not isinstance(limits, dict):
            raise ValueError("missing limits")
        self.code = str(req.get("code", ""))
        self.stdin = str(req.get("stdin", ""))
        files = req.get("files") or {}
        self.files = {str(k): str(v) for k, v in files.items()} if isinstance(files, dict) else {}
        self.timeout_s = float(limits["timeout_s"])
        self.cpu_s = int(limits["cpu_s"])
        self.memory_mb = int(limits["memory_mb"])
        self.output_bytes = int(limits["output_bytes"])
        self.max_processes = int(limits["max_processes"])
        self.max_file_mb = int(limits["max_file_mb"])
        self.network = bool(limits["network"])
        required = req.get("required") or []
        self.required = [str(x) for x in required] if isinstance(required, list) else []
        entry = req.get("entry_point")
        self.entry_point: str | None = str(entry) if entry else None  # run_tests (serve mode)


#: Largest request message (code, stdin, files and their metadata) a child accepts.
MAX_MESSAGE = _codec.MAX_REQUEST + _codec.MAX_META + (1 << 10)


def report_error(ctl: socket.socket, message: str) -> None:
    with contextlib.suppress(OSError):
        ctl.send(b"E" + message.encode("utf-8", "replace")[:4000])


def hide_host_dirs(z: Zygote) -> None:
    """Make every mount private and cover ``HIDDEN_DIRS`` with empty read-only tmpfs.

    Done once in the fork server's own mount namespace (``Zygote.enter_mount_ns``), which each
    run's namespace copies; per run it cost 9 tmpfs mounts (~0.25 ms). Only if that failed does
    each child do it in its own namespace.
    """
    errno_call(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "make-rprivate")
    keep = [sys.base_prefix, sys.prefix, *z.stdlib_dirs]
    for path in HIDDEN_DIRS:
        if not os.path.isdir(path) or any(k == path or k.startswith(path + "/") for k in keep):
            continue
        errno_call(
            libc.mount(
                b"tmpfs", path.encode(), b"tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
                b"size=4k,mode=0755",
            ),
            f"hide {path}",
        )  # fmt: skip


def setup_mounts(z: Zygote, max_file_mb: int, layers: list[str]) -> str:
    """Set up the new mount namespace: fresh /proc, tmpfs /tmp and /dev/shm, hidden homes."""
    if not z.host_dirs_hidden:
        hide_host_dirs(z)
    tmp_mb = max(16, 2 * max_file_mb)
    owner = f",uid={z.uid},gid={z.uid}" if z.uid > 0 else ""
    opts = f"size={tmp_mb}m,mode=0700{owner}".encode()
    errno_call(libc.mount(b"tmpfs", b"/tmp", b"tmpfs", MS_NOSUID | MS_NODEV, opts), "mount /tmp")
    if os.path.isdir("/dev/shm"):
        errno_call(
            libc.mount(
                b"tmpfs", b"/dev/shm", b"tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
                b"size=16m,mode=1777",
            ),
            "mount /dev/shm",
        )  # fmt: skip
    if "pid_ns" in layers:
        errno_call(
            libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None),
            "mount /proc",
        )
    return "/tmp"


def isolate(
    z: Zygote,
    network: bool,
    max_file_mb: int,
    host_workdir: str,
    layers: list[str],
    ctl: socket.socket,
) -> str:
    """Apply every program-independent layer (as root, then the slot uid); return the workdir."""
    set_pdeathsig()
    os.setsid()
    layers.append("session")
    if network and z.host_net >= 0:
        errno_call(libc.setns(z.host_net, CLONE_NEWNET), "setns(net)")
        os.close(z.host_net)
    # The OOM killer must pick this run, never the zygote or the verdict process (-1000).
    write_file("/proc/self/oom_score_adj", "1000")
    wanted = {"ipc_ns": CLONE_NEWIPC}
    if z.use_mount_ns:
        wanted["mount_ns"] = CLONE_NEWNS
    if libc.unshare(sum(wanted.values())) == 0:
        layers.extend(wanted)
    else:  # some hosts allow only some namespaces
        layers.extend(name for name, flag in wanted.items() if libc.unshare(flag) == 0)
    if "mount_ns" in layers:
        try:
            workdir = setup_mounts(z, max_file_mb, layers)
        except OSError as exc:
            report_error(ctl, f"mount namespace setup failed: {exc}")
            os._exit(125)
    else:
        workdir = host_workdir
    if z.uid > 0:
        os.setgroups([])
        os.setresgid(z.uid, z.uid, z.uid)
        os.setresuid(z.uid, z.uid, z.uid)
        layers.append("uid")
        set_pdeathsig()  # credential changes clear it
    os.chdir(workdir)
    errno_call(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    layers.append("no_new_privs")
    if z.landlock is not None:
        with contextlib.suppress(OSError):
            # /dev/null and the fixed read paths are in z.landlock already.
            writable = [workdir]
            if "mount_ns" in layers:
                writable.append("/dev/shm")  # private and size-capped in the mount namespace
            z.landlock.restrict(["/proc"], writable, deny_tcp=not network)
            layers.append("landlock")
    seccomp = z.seccomp.get(network)
    if seccomp is not None:
        seccomp.load()
        layers.append("seccomp")
    return workdir


def await_program(
    z: Zygote, workdir: str, layers: list[str], out_w: int, err_w: int, ctl: socket.socket
) -> None:
    """Wait (isolated) for the program, then apply its limits, write its inputs and run it."""
    kind, payload, fds = _codec.recv_message(ctl, MAX_MESSAGE, maxfds=1)
    if kind != b"R":
        os._exit(0)  # the zygote discarded this prepared child
    req, texts = _codec.unpack_texts(payload)
    del payload
    chan = fds[0] if fds else -1
    # texts: code, stdin, then (name, content) per file (``_zygote.spawn``).
    files = dict(zip(texts[2::2], texts[3::2], strict=True))
    req.update(code=texts[0], stdin=texts[1], files=files)
    del texts
    spec = RunSpec({"limits": {}}, child_request=req)
    try:
        for name, content in spec.files.items():
            if os.path.dirname(name):
                os.makedirs(os.path.dirname(name), exist_ok=True)
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(content)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        tmp_mb = max(16, 2 * spec.max_file_mb)
        report_error(
            ctl,
            f"the input files do not fit in the work dir: /tmp holds {tmp_mb} MiB "
            f"(2 x Limits.max_file_mb, at least 16) ({exc.strerror})",
        )
        os._exit(125)
    stdin_fd = os.memfd_create("stdin")
    view = memoryview(spec.stdin.encode("utf-8"))
    while view:
        view = view[os.write(stdin_fd, view) :]
    os.lseek(stdin_fd, 0, os.SEEK_SET)
    mib = 1 << 20
    for res, value in (
        (resource.RLIMIT_AS, spec.memory_mb * mib),
        (resource.RLIMIT_CPU, spec.cpu_s),
        (resource.RLIMIT_FSIZE, spec.max_file_mb * mib),
        (resource.RLIMIT_NOFILE, 256),
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_MEMLOCK, 0),
        (resource.RLIMIT_NPROC, spec.max_processes),
    ):
        resource.setrlimit(res, (value, value))
    layers.append("rlimits")
    layers.sort(key=LAYER_ORDER.__getitem__)
    missing = [layer for layer in spec.required if layer not in layers]
    if missing:
        report_error(ctl, f"required isolation layers unavailable: {', '.join(missing)}")
        os._exit(125)
    ctl.send(b"L" + json.dumps(layers).encode())
    ctl.close()

    # Wire up fds 0-3 and drop everything else.
    staged = [fcntl.fcntl(fd, fcntl.F_DUPFD, 100) for fd in (stdin_fd, out_w, err_w)]
    chan_staged = fcntl.fcntl(chan, fcntl.F_DUPFD, 100) if chan >= 0 else -1
    for target, fd in enumerate(staged):
        os.dup2(fd, target)
    if chan_staged >= 0:
        os.dup2(chan_staged, 3)
    close_all_except({0, 1, 2, 3} if chan_staged >= 0 else {0, 1, 2})
    if os.environ.get("HOME") != workdir:  # the zygote set the rest (see main)
        os.environ["HOME"] = os.environ["TMPDIR"] = workdir
    run_program(spec, chan_staged >= 0)


def run_program(spec: RunSpec, serve: bool) -> None:
    """Run the untrusted program in a fresh namespace; in serve mode then answer calls on fd 3."""
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
    sys.stdout = io.TextIOWrapper(
        io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="backslashreplace"
    )
    sys.stderr = io.TextIOWrapper(
        io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace",
        line_buffering=True,
    )  # fmt: skip
    sys.argv = ["main.py"]
    name = "__sandbox_candidate__" if serve else "__main__"
    namespace: dict[str, object] = {"__name__": name, "__builtins__": builtins}
    code = 0
    try:
        exec(compile(spec.code, "main.py", "exec"), namespace)
        if serve:
            serve_calls(namespace, spec.entry_point or "")
    except SystemExit as exc:
        if exc.code is None:
            code = 0
        elif isinstance(exc.code, int):
            code = exc.code & 0xFF
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException as exc:
        # Skip our own frame: the program sees a traceback that starts at main.py.
        with contextlib.suppress(BaseException):
            traceback.print_exception(
                type(exc), exc, exc.__traceback__.tb_next if exc.__traceback__ else None
            )
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
            args = _codec.decode_value(msg[2])
            kwargs = _codec.decode_value(msg[3])
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
