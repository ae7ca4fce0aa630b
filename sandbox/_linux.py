"""Thin Linux helpers shared by the slot server, its template process and the children.

Standard library only (the slot server runs ``/usr/bin/python3 -I -S``): libc through ctypes,
the constants of ``<sched.h>``, ``<sys/mount.h>`` and ``<sys/prctl.h>``, and ``ParentClone``,
the clone that makes the template's children children of the slot server.
"""

from __future__ import annotations

import ctypes
import os
import signal

libc = ctypes.CDLL(None, use_errno=True)
#: The same libc, called with the GIL held (``ParentClone`` must not release it around clone).
_pylibc = ctypes.PyDLL(None, use_errno=True)
_pylibc.syscall.restype = ctypes.c_long
libc.pthread_self.restype = ctypes.c_void_p

CLONE_PARENT = 0x00008000
CLONE_NEWNS = 0x00020000
CLONE_CHILD_SETTID = 0x01000000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_NOATIME = 1024
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
PR_SET_PDEATHSIG = 1
PR_SET_SECCOMP = 22
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38
SECCOMP_MODE_FILTER = 2

#: (clone, gettid) syscall numbers; other architectures use the double fork in ``ParentClone``.
_SYSCALLS = {"x86_64": (56, 186), "aarch64": (220, 178)}


def errno_call(res: int, what: str) -> None:
    """Raise OSError with errno when a libc call returned non-zero."""
    if res != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def close_all_except(keep: set[int] | frozenset[int]) -> None:
    """Close every fd except ``keep`` (closerange between the kept ones)."""
    low = 0
    for fd in sorted(keep):
        if fd > low:
            os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 65536)


def set_pdeathsig() -> None:
    """Die with SIGKILL when the parent dies (cleared by credential changes: call again)."""
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def write_file(path: str, value: str) -> None:
    """Write ``value`` to an existing file (cgroup and /proc knobs) in one write."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


class ParentClone:
    """``clone(CLONE_PARENT | flags)`` from Python, prepared once.

    The template process forks every run's child, but the slot server must be that child's
    parent: only a parent can wait for a child and read its exit status and CPU time, and the
    template must never learn anything about a job (not even how it ended). ``CLONE_PARENT``
    gives the new process the caller's parent; ``os.fork`` has no way to ask for it.

    The raw syscall bypasses glibc's ``fork``, which also stores the child's thread id in the
    thread descriptor (``CLONE_CHILD_SETTID``); without it ``raise``/``pthread_kill`` would
    signal a stale tid. The field is found once by looking for the current tid in the
    descriptor, and each child checks it (``pthread_kill(self, 0)``); ``usable`` is False where
    that fails or the architecture is unknown, and the caller then double-forks instead
    (the intermediate exits, the child is re-parented to the slot server, a child subreaper).
    Python's own at-fork work runs as in ``os.fork``: ``PyOS_BeforeFork`` /
    ``PyOS_AfterFork_Child`` (thread state, import lock, ``random`` reseeding).
    """

    def __init__(self) -> None:
        numbers = _SYSCALLS.get(os.uname().machine)  # not ``platform``: the template imports this
        self.tid_addr = 0
        self.clone_nr = -1
        self._self = ctypes.c_void_p(0)
        self._args: dict[int, tuple[object, ...]] = {}
        if numbers is None:
            return
        self.clone_nr, gettid_nr = numbers
        tid = libc.syscall(gettid_nr)
        base = libc.pthread_self()
        if not base or tid <= 0:
            return
        for offset in range(0, 0x1000, 4):
            if ctypes.c_int.from_address(base + offset).value == tid:
                self.tid_addr = base + offset
                break
        # The arguments of both calls, built once here (the template): every object built or
        # first touched after the clone is a copy-on-write fault in the child and in the
        # template. The thread descriptor is at the same address in the child (a copy).
        self._self = ctypes.c_void_p(base)
        for extra in (0, CLONE_NEWPID):
            flags = extra | CLONE_PARENT | CLONE_CHILD_SETTID | signal.SIGCHLD
            self._args[extra] = (
                ctypes.c_long(self.clone_nr), ctypes.c_ulong(flags), ctypes.c_void_p(0),
                ctypes.c_void_p(0), ctypes.c_void_p(self.tid_addr), ctypes.c_ulong(0),
            )  # fmt: skip

    @property
    def usable(self) -> bool:
        """Whether the raw clone can be used here (else ``clone`` double-forks)."""
        return self.clone_nr > 0 and self.tid_addr > 0

    def clone(self, flags: int) -> int:
        """Fork a child whose parent is our parent; 0 in the child, its pid in the caller."""
        api = ctypes.pythonapi
        if not self.usable:
            return self._double_fork(flags)
        args = self._args.get(flags)
        if args is None:
            raise ValueError(f"clone flags {flags:#x}: only 0 and CLONE_NEWPID are prepared")
        api.PyOS_BeforeFork()
        pid = _pylibc.syscall(*args)
        if pid == 0:
            api.PyOS_AfterFork_Child()
            if libc.pthread_kill(self._self, 0) != 0:
                os._exit(71)  # the tid fix did not take: never run anything in such a child
            return 0
        api.PyOS_AfterFork_Parent()  # a PyDLL without use_errno: ctypes' errno copy is kept
        if pid < 0:
            err = ctypes.get_errno()  # only then: one ctypes call less per clone
            raise OSError(err, f"clone: {os.strerror(err)}")
        return int(pid)

    @staticmethod
    def _double_fork(flags: int) -> int:
        """Portable fallback: fork an intermediate that forks the child and exits at once."""
        read_fd, write_fd = os.pipe()
        middle = os.fork()
        if middle == 0:
            code = 0
            try:
                os.close(read_fd)
                if flags & CLONE_NEWPID and libc.unshare(CLONE_NEWPID) != 0:
                    flags &= ~CLONE_NEWPID
                pid = os.fork()
                if pid == 0:
                    os.close(write_fd)
                    return 0
                os.write(write_fd, pid.to_bytes(4, "little"))
            except BaseException:
                code = 1
            os._exit(code)
        os.close(write_fd)
        try:
            raw = os.read(read_fd, 4)
        finally:
            os.close(read_fd)
            os.waitpid(middle, 0)
        if len(raw) != 4:
            raise OSError("fork failed")
        return int.from_bytes(raw, "little")
