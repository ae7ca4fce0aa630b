"""The template: the pristine process every run's child and every verdict server is cloned from.

Why it exists: a child forked from the process that serves requests inherits that process's
memory, and with it whatever earlier jobs left there: the locals of the request loop (the last
reply, the last request with its tests), freed buffers holding earlier stdin and files. Code in
the child could read them (walking ``sys._getframe()`` up, or scanning memory), and copy the
previous job's answers or tests. Deleting variables does not fix that; a process that never
held any job's data does.

The template is a fresh interpreter (``/usr/bin/python3 -I -S _template.py``, empty
environment) that the slot server starts before its first job: not a fork of the slot server,
so it holds only what a child needs (a fork of the slot server carried its request loop, its
supervision code and the libraries they import, ~9 MB of memory that every clone copied the
page tables of and every child's exit unmapped again). It gets the slot's settings (uid,
seccomp programs) in one frame at start-up, and after that only ever receives one-byte commands
with one fd: "clone a run's child (C) / a verdict server (V) holding this socket", or "kill
every process of the slot uid" (U). It never receives a job, a limit, an exit status or a byte
of output. The child it clones is a child of the slot server (``CLONE_PARENT``), which hands it
its kind of run, its pipes and then its program directly, over the socket (``_child.main``),
and which alone waits for it and reads how it ended.

Set up once here, before the first clone, and shared by every child through the clone: the
mount namespace (host homes, checkouts, ``/run``, ``/var`` hidden; a minimal ``/dev``), the UTS
namespace, the Landlock rules of the fixed paths, the seccomp programs, the preloaded modules
(``PRELOAD``) and the programs' environment. This module is T's own code only (the slot
server's handle on it is ``_spawn.Template``). Standard library only.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import importlib
import json
import os
import signal
import socket
import sys
import types

if __name__ == "__main__" and "sandbox" not in sys.modules:
    # Run as a script under -I -S: make the sibling modules importable as ``sandbox._x``
    # without executing the package's ``__init__`` (the library side, with its heavy imports).
    _package = types.ModuleType("sandbox")
    _package.__path__ = [os.path.dirname(os.path.abspath(__file__))]
    sys.modules["sandbox"] = _package

from sandbox import _child, _codec, _landlock, _linux, _mounts, _runspec, _verdict_server

_REPLY = _runspec.TEMPLATE_REPLY
_ONE_FD = socket.CMSG_SPACE(4)
_EINVAL = _REPLY.pack(b"E", errno.EINVAL, 0)
#: Standard-library modules model-written code often imports, loaded once in the template so
#: that a child has them for free (an import in the child reads, unmarshals and executes the
#: module: 1-5 ms each, measured). Each preloaded module also costs every run a little (more
#: page tables to copy at the clone and to free at exit), so the list keeps the small modules
#: that HumanEval/MBPP/stdio programs import and leaves out those that load large shared
#: libraries or pull in many others (``hashlib``: libcrypto; ``decimal``, ``fractions``,
#: ``statistics``, ``random``, ``datetime``, ``dataclasses``): measured, preloading all of
#: those made a bare clone + exit ~0.5 ms (60%) more expensive, paid by every run.
PRELOAD = (
    "bisect", "collections", "copy", "functools", "heapq", "itertools", "math", "operator", "re",
    "string", "typing",
)  # fmt: skip


def _main() -> None:
    """Live as the template: prepare what every child shares, then clone on request."""
    _linux.set_pdeathsig()
    _linux.close_all_except({3})
    sock = socket.socket(fileno=3)
    # The slot's settings (uid, layers, seccomp programs): the one frame before any command.
    config, _fds = _codec.recv_packet(sock, 1 << 20)
    if not config:
        return
    ctx = _child.RunContext.from_config(json.loads(config))
    _child.prepare_template()  # first: it puts stand-ins on fds 0-2
    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    _isolate_slot(ctx)
    ctx.freeze()
    # The programs' environment, set once here (children inherit it): nothing from the library.
    os.environ.clear()
    os.environ.update(_child.CHILD_ENV)
    cloner = _linux.ParentClone()
    # Children are clones of this heap: freeze it so that the cyclic GC in a child never touches
    # (and so copies) these objects (the "gc.freeze before fork" recipe, Python docs).
    gc.collect()
    gc.freeze()
    flags = b"1" if ctx.host_dirs_hidden else b"0"
    sock.send(b"H" + flags + (b"1" if ctx.landlock is not None else b"0"))
    _serve(sock, ctx, cloner)


def _isolate_slot(ctx: _child.RunContext) -> None:
    """Namespaces and Landlock rules every run of the slot shares, made once in the template."""
    libc = _linux.libc
    if ctx.is_root and ctx.seccomp.get(False) is not None:
        # One empty network namespace for the slot's runs. Safe to share because with the
        # seccomp policy no socket can outlive its run: passing one in flight (SCM_RIGHTS) needs
        # sendmsg, which is refused, and every process of a run dies with its PID namespace, so
        # at the next run nothing of this one is left in it (not even a name in /proc/net/unix).
        try:
            ctx.host_net = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
            ctx.slot_net = libc.unshare(_linux.CLONE_NEWNET) == 0
        except OSError:
            ctx.slot_net = False
        if not ctx.slot_net and ctx.host_net >= 0:
            os.close(ctx.host_net)
            ctx.host_net = -1
    if ctx.is_root:
        libc.unshare(_linux.CLONE_NEWUTS)
        # Hide the host's homes, checkouts and sockets once, in a mount namespace of our own:
        # every run's namespace is a copy of it (per run this cost 9 tmpfs mounts, ~0.25 ms).
        if libc.unshare(_linux.CLONE_NEWNS) == 0:
            with contextlib.suppress(OSError):
                _mounts.hide_host_dirs(ctx.stdlib_dirs, ctx.expose_dirs)
                ctx.host_dirs_hidden = True
    # Landlock rules for the paths every run shares, prepared once (after the mounts above:
    # the rules hold the inodes seen here). /proc is a fresh mount per run: each child adds it.
    if _landlock.abi_version() > 0:
        reads = _minimal_paths(
            [
                *_mounts.READ_DIRS, *ctx.stdlib_dirs, *ctx.expose_dirs, *_mounts.READ_FILES,
                "/sys/devices/system/cpu",
            ]
        )  # fmt: skip
        with contextlib.suppress(OSError):
            ctx.landlock = _landlock.Rules([p for p in reads if p != "/proc"], ["/dev/null"])


def _serve(sock: socket.socket, ctx: _child.RunContext, cloner: _linux.ParentClone) -> None:
    """Clone a run child (``C``) or verdict server (``V``) per request, or kill the uid (``U``)."""
    pid_ns = ctx.is_root
    verdict_uid = ctx.uid + 1 if ctx.uid > 0 else -1
    while True:
        try:
            # One direct recvmsg: ``socket.recv_fds`` parses in Python, and every object the
            # template touches after a clone is a copy-on-write fault while that child lives.
            msg, fds = _codec.recv_exact(sock, 16, _ONE_FD)
        except _codec.CodecError:
            msg, fds = b"?", []  # cut short: answered EINVAL below
        except OSError:
            return
        if not msg:
            return  # the slot server is gone
        kind = msg[:1]
        reply = _EINVAL
        if kind in (b"C", b"V") and len(fds) == 1:
            new_pid_ns = pid_ns and kind == b"C"
            try:
                pid = cloner.clone(_linux.CLONE_NEWPID if new_pid_ns else 0)
            except OSError as exc:
                if not new_pid_ns:
                    reply = _REPLY.pack(b"E", exc.errno or errno.EAGAIN, 0)
                    pid = -1
                else:  # no PID namespaces here after all: stop asking for one
                    pid_ns = new_pid_ns = False
                    try:
                        pid = cloner.clone(0)
                    except OSError as again:
                        reply = _REPLY.pack(b"E", again.errno or errno.EAGAIN, 0)
                        pid = -1
            if pid == 0:
                if kind == b"C":
                    _child.main(ctx, fds[0], new_pid_ns)
                else:
                    _verdict_server.main(ctx, fds[0], verdict_uid)
                os._exit(125)
            if pid > 0:
                reply = _REPLY.pack(b"P", pid, new_pid_ns)
        elif kind == b"U":
            _kill_uid(ctx.uid)
            reply = _REPLY.pack(b"P", 0, 0)
        for fd in fds:
            os.close(fd)
        del msg, fds
        try:
            sock.send(reply)
        except OSError:
            return


def _kill_uid(uid: int) -> None:
    """``kill(-1, SIGKILL)`` as ``uid``: reaches every process of that uid (POSIX semantics)."""
    if uid <= 0:
        return
    pid = os.fork()
    if pid == 0:
        try:
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            os.kill(-1, signal.SIGKILL)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def _minimal_paths(paths: list[str]) -> list[str]:
    """Resolve symlinks and drop paths inside another one (merged /usr: /bin -> /usr/bin, ...).

    Computed once, so each child adds only the Landlock rules that matter.
    """
    resolved = sorted({os.path.realpath(p) for p in paths if os.path.exists(p)})
    kept: list[str] = []
    for path in resolved:
        if not any(path == k or path.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(path)
    return kept


if __name__ == "__main__":
    try:
        _main()
    finally:
        os._exit(0)
