"""Landlock (Linux >= 5.13) through raw syscalls with ctypes.

Hand-written because no maintained Python binding covers the network (ABI 4) and scoping (ABI 6)
rights we use; the constants and struct layouts are those of ``include/uapi/linux/landlock.h`` and
the kernel documentation (https://docs.kernel.org/userspace-api/landlock.html). Standard library
only: the fork server imports this file directly.
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


def restrict(
    read_paths: list[str],
    write_paths: list[str],
    *,
    deny_tcp: bool,
    scope: bool = True,
) -> int:
    """Restrict the calling thread (and its future children) to the given paths.

    ``read_paths`` get execute/read rights, ``write_paths`` get every right; everything else is
    denied. With ``deny_tcp`` all TCP bind/connect is denied (ABI >= 4); with ``scope`` signals and
    abstract unix sockets cannot reach processes outside the domain (ABI >= 6). The caller must have
    set no_new_privs. Returns the ABI used; raises OSError when Landlock is unavailable.
    """
    abi = abi_version()
    if abi < 1:
        raise OSError("landlock unavailable")
    handled_fs = fs_rights(abi)
    handled_net = (NET_BIND_TCP | NET_CONNECT_TCP) if (deny_tcp and abi >= 4) else 0
    scoped = (SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL) if (scope and abi >= 6) else 0
    # struct landlock_ruleset_attr grew over ABIs: fs only (ABI 1-3), + net (4-5), + scoped (6+).
    if abi >= 6:
        attr = struct.pack("=QQQ", handled_fs, handled_net, scoped)
    elif abi >= 4:
        attr = struct.pack("=QQ", handled_fs, handled_net)
    else:
        attr = struct.pack("=Q", handled_fs)
    attr_buf = ctypes.create_string_buffer(attr, len(attr))
    ruleset = _check(
        _syscall(_SYS_CREATE_RULESET, attr_buf, ctypes.c_size_t(len(attr)), ctypes.c_uint32(0)),
        "create_ruleset",
    )
    try:
        for paths, rights in ((read_paths, READ & handled_fs), (write_paths, handled_fs)):
            for path in paths:
                try:
                    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
                except OSError:
                    continue  # a path this system does not have
                try:
                    allowed = rights
                    if not os.path.isdir(path):
                        # Directory-only rights are invalid on a file rule (EINVAL).
                        allowed &= FS_EXECUTE | FS_READ_FILE | FS_WRITE_FILE | FS_TRUNCATE
                        allowed &= handled_fs
                        if abi >= 5:
                            allowed |= FS_IOCTL_DEV & rights
                    # struct landlock_path_beneath_attr is packed: u64 access, s32 parent_fd.
                    rule = ctypes.create_string_buffer(struct.pack("=Qi", allowed, fd), 12)
                    _check(
                        _syscall(
                            _SYS_ADD_RULE,
                            ctypes.c_int(ruleset),
                            ctypes.c_int(_RULE_PATH_BENEATH),
                            rule,
                            ctypes.c_uint32(0),
                        ),
                        f"add_rule({path})",
                    )
                finally:
                    os.close(fd)
        _check(_libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
        _check(
            _syscall(_SYS_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)),
            "restrict_self",
        )
    finally:
        os.close(ruleset)
    return abi
