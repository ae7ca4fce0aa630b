"""Landlock (Linux >= 5.13) through raw syscalls with ctypes.

Hand-written because no maintained Python binding covers the network (ABI 4) and scoping (ABI 6)
rights we use; the constants and struct layouts are those of ``include/uapi/linux/landlock.h`` and
the kernel documentation (https://docs.kernel.org/userspace-api/landlock.html). Standard library
only: the template imports it, and every run's child (a clone of the template) calls it.
"""

from __future__ import annotations

import ctypes
import os
import struct

# x86_64 and aarch64 share the generic syscall numbers for Landlock.
_SYS_CREATE_RULESET = 444
_SYS_ADD_RULE = 445
_SYS_RESTRICT_SELF = 446
_CREATE_RULESET_VERSION = 1 << 0
_RULE_PATH_BENEATH = 1

FS_EXECUTE = 1 << 0
FS_WRITE_FILE = 1 << 1
FS_READ_FILE = 1 << 2
FS_READ_DIR = 1 << 3
FS_REMOVE_DIR = 1 << 4
FS_REMOVE_FILE = 1 << 5
FS_MAKE_CHAR = 1 << 6
FS_MAKE_DIR = 1 << 7
FS_MAKE_REG = 1 << 8
FS_MAKE_SOCK = 1 << 9
FS_MAKE_FIFO = 1 << 10
FS_MAKE_BLOCK = 1 << 11
FS_MAKE_SYM = 1 << 12
FS_REFER = 1 << 13  # ABI 2
FS_TRUNCATE = 1 << 14  # ABI 3
FS_IOCTL_DEV = 1 << 15  # ABI 5
NET_BIND_TCP = 1 << 0  # ABI 4
NET_CONNECT_TCP = 1 << 1  # ABI 4
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
SCOPE_SIGNAL = 1 << 1  # ABI 6

READ = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR
_PR_SET_NO_NEW_PRIVS = 38

_libc = ctypes.CDLL(None, use_errno=True)
#: One prepared rule: the O_PATH fd and the packed ``struct landlock_path_beneath_attr``.
_Rule = tuple[int, "ctypes.Array[ctypes.c_char]"]
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long


def abi_version() -> int:
    """Return the kernel's Landlock ABI version, or 0 when Landlock is unavailable."""
    res = _syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    return int(res) if res > 0 else 0


def fs_rights(abi: int) -> int:
    """Every filesystem right the given ABI can restrict."""
    rights = (1 << 13) - 1
    if abi >= 2:
        rights |= FS_REFER
    if abi >= 3:
        rights |= FS_TRUNCATE
    if abi >= 5:
        rights |= FS_IOCTL_DEV
    return rights


def _check(res: int, what: str) -> int:
    if res < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"landlock {what}: {os.strerror(err)}")
    return res


def _ruleset_attr(abi: int, handled_fs: int, deny_tcp: bool, scope: bool) -> bytes:
    """Pack ``struct landlock_ruleset_attr``.

    The struct grew over ABIs: fs rights only (ABI 1-3), + net (4-5), + scoped (6+).
    """
    handled_net = (NET_BIND_TCP | NET_CONNECT_TCP) if (deny_tcp and abi >= 4) else 0
    scoped = (SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL) if (scope and abi >= 6) else 0
    if abi >= 6:
        return struct.pack("=QQQ", handled_fs, handled_net, scoped)
    if abi >= 4:
        return struct.pack("=QQ", handled_fs, handled_net)
    return struct.pack("=Q", handled_fs)


def _path_rule(
    path: str, rights: int, abi: int, handled_fs: int, is_dir: bool | None = None
) -> _Rule | None:
    """Open ``path`` (O_PATH) and pack its rule; None when this system does not have it.

    Returns the fd (the caller closes it) and ``struct landlock_path_beneath_attr`` (packed: u64
    access, s32 parent_fd).
    """
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return None
    allowed = rights
    if not (os.path.isdir(path) if is_dir is None else is_dir):
        # Directory-only rights are invalid on a file rule (EINVAL).
        allowed &= FS_EXECUTE | FS_READ_FILE | FS_WRITE_FILE | FS_TRUNCATE
        allowed &= handled_fs
        if abi >= 5:
            allowed |= FS_IOCTL_DEV & rights
    return fd, ctypes.create_string_buffer(struct.pack("=Qi", allowed, fd), 12)


class Rules:
    """A Landlock policy whose fixed part is prepared once and applied by many processes.

    Opening each path, checking whether it is a directory and packing its rule was most of a
    child's ~0.35 ms in Landlock. The slot server prepares the rules for paths that are the same
    in every run (their O_PATH fds stay open in it, close-on-exec, and are inherited); a child
    only issues the syscalls, plus the full preparation for its own paths (its fresh /tmp,
    /dev/shm and /proc are new mounts, so new inodes). Nothing here is shared between runs:
    each ``restrict`` builds a new ruleset, and every child closes the inherited fds before
    running its program.
    """

    def __init__(
        self, read_paths: list[str], write_paths: list[str], *, scope: bool = True
    ) -> None:
        self.abi = abi_version()
        if self.abi < 1:
            raise OSError("landlock unavailable")
        self.handled_fs = fs_rights(self.abi)
        # One ruleset attribute per value of deny_tcp.
        self._attrs = {}
        for deny_tcp in (False, True):
            raw = _ruleset_attr(self.abi, self.handled_fs, deny_tcp, scope)
            self._attrs[deny_tcp] = ctypes.create_string_buffer(raw, len(raw))
        self._rules = self._prepare(read_paths, write_paths)
        self.fds = [fd for fd, _rule in self._rules]

    def _prepare(
        self, reads: list[str], writes: list[str], is_dir: bool | None = None
    ) -> list[_Rule]:
        rules = []
        for paths, rights in ((reads, READ & self.handled_fs), (writes, self.handled_fs)):
            for path in paths:
                rule = _path_rule(path, rights, self.abi, self.handled_fs, is_dir)
                if rule is not None:
                    rules.append(rule)
        return rules

    def restrict(
        self,
        read_paths: list[str],
        write_paths: list[str],
        *,
        deny_tcp: bool,
        nnp_set: bool = False,
        all_dirs: bool = False,
    ) -> None:
        """Restrict the calling thread (and its future children) to the rules plus these paths.

        The prepared read paths and ``read_paths`` get execute/read rights, the prepared write
        paths and ``write_paths`` every right; everything else is denied. With ``deny_tcp`` all
        TCP bind/connect is denied (ABI >= 4); with ``scope`` (at construction) signals and
        abstract unix sockets cannot reach processes outside the domain (ABI >= 6). Raises
        OSError when a step fails (the caller then runs without the layer, or refuses).
        ``nnp_set``: the caller has set ``no_new_privs`` already (one ctypes call less);
        ``all_dirs``: the given paths are all directories (no ``stat`` each).
        """
        attr = self._attrs[deny_tcp]
        ruleset = _check(
            _syscall(_SYS_CREATE_RULESET, attr, ctypes.c_size_t(len(attr)), ctypes.c_uint32(0)),
            "create_ruleset",
        )
        own = self._prepare(read_paths, write_paths, True if all_dirs else None)
        try:
            for _fd, rule in (*self._rules, *own):
                _check(
                    _syscall(_SYS_ADD_RULE, ruleset, _RULE_PATH_BENEATH, rule, 0),
                    "add_rule",
                )
            if not nnp_set:
                _check(_libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
            _check(_syscall(_SYS_RESTRICT_SELF, ruleset, 0), "restrict_self")
        finally:
            os.close(ruleset)
            for fd, _rule in own:
                os.close(fd)
