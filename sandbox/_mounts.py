"""The mount namespaces of the template and of each run.

The template hides the host's homes, checkouts and sockets once, in a mount namespace of its own
(``hide_host_dirs``); every run's namespace is a copy of it, to which the run adds only its fresh
``/tmp``, ``/dev/shm`` and ``/proc`` (``setup_run_mounts``). Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import sys

from sandbox import _linux

#: Host directories hidden (empty read-only tmpfs) in the template's mount namespace: homes,
#: checkouts, runtime state and every usual home of a host service's unix socket (/run, /var).
#: Skipped when the interpreter itself lives below one of them.
HIDDEN_DIRS = (
    "/root", "/home", "/work", "/mnt", "/media", "/srv", "/run", "/var", "/opt",
)  # fmt: skip
#: Directories the program may read and execute from (Landlock); writes only in its work dir.
READ_DIRS = ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc", "/proc")
#: The device files a run sees (the template's /dev holds nothing else).
DEVICES = ("null", "zero", "full", "random", "urandom")
READ_FILES = tuple(f"/dev/{name}" for name in DEVICES)


def _below(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def hide_host_dirs(stdlib_dirs: list[str], expose_dirs: list[str] | None = None) -> None:
    """Make every mount private, cover ``HIDDEN_DIRS``, replace /dev, and record no access times.

    Done once in the template's own mount namespace, which each run's namespace copies. The
    new /dev (a tmpfs) holds only ``DEVICES`` (bind mounts of the host's), the ``shm`` mount
    point and the ``fd``/``stdin``/``stdout``/``stderr`` links: no host socket (``/dev/log``)
    and no other device is left in reach. Each of ``expose_dirs`` below a hidden folder (a
    toolchain such as rustc's sysroot in ``/root/.rustup``) is bound back read-only at its own
    path inside the empty tmpfs: that folder alone, not its parents' other contents.
    """
    libc = _linux.libc
    _linux.errno_call(
        libc.mount(b"none", b"/", None, _linux.MS_REC | _linux.MS_PRIVATE, None), "make-rprivate"
    )
    keep = [sys.base_prefix, sys.prefix, *stdlib_dirs]
    flags = _linux.MS_RDONLY | _linux.MS_NOSUID | _linux.MS_NODEV | _linux.MS_NOEXEC
    for path in HIDDEN_DIRS:
        if not os.path.isdir(path) or any(_below(k, path) for k in keep):
            continue
        exposed = [d for d in expose_dirs or () if _below(d, path) and os.path.isdir(d)]
        # O_PATH handles on the exposed folders, taken before the tmpfs covers them.
        handles = {d: os.open(d, os.O_PATH | os.O_CLOEXEC) for d in exposed}
        try:
            _linux.errno_call(
                libc.mount(
                    b"tmpfs", path.encode(), b"tmpfs", flags & ~_linux.MS_RDONLY if exposed
                    else flags, b"size=4k,mode=0755",
                ),
                f"hide {path}",
            )  # fmt: skip
            for folder, fd in handles.items():
                _expose(folder, fd)
        finally:
            for fd in handles.values():
                os.close(fd)
        if exposed:  # the empty tmpfs read-only again, now that the mount points exist
            _linux.errno_call(
                libc.mount(None, path.encode(), None, flags | _linux.MS_REMOUNT, None),
                f"remount {path} read-only",
            )
    devices = {}
    for name in DEVICES:
        with contextlib.suppress(OSError):
            devices[name] = os.open(f"/dev/{name}", os.O_PATH | os.O_CLOEXEC)
    try:
        _linux.errno_call(
            libc.mount(
                b"tmpfs", b"/dev", b"tmpfs", _linux.MS_NOSUID | _linux.MS_NOEXEC,
                b"size=64k,mode=0755",
            ),
            "mount /dev",
        )  # fmt: skip
        os.mkdir("/dev/shm", 0o1777)
        os.symlink("/proc/self/fd", "/dev/fd")
        for number, name in enumerate(("stdin", "stdout", "stderr")):
            os.symlink(f"/proc/self/fd/{number}", f"/dev/{name}")
        for name, fd in devices.items():
            os.close(os.open(f"/dev/{name}", os.O_CREAT | os.O_WRONLY, 0o666))
            _linux.errno_call(
                libc.mount(f"/proc/self/fd/{fd}".encode(), f"/dev/{name}".encode(), None,
                           _linux.MS_BIND, None),
                f"bind /dev/{name}",
            )  # fmt: skip
    finally:
        for fd in devices.values():
            os.close(fd)
    no_access_times()  # last: the mounts made above too (a listed directory, a read link)


def _expose(folder: str, fd: int) -> None:
    """Bind ``folder`` (open as ``fd``) read-only at its own path inside a fresh hiding tmpfs."""
    libc = _linux.libc
    os.makedirs(folder, mode=0o755, exist_ok=True)
    _linux.errno_call(
        libc.mount(
            f"/proc/self/fd/{fd}".encode(), folder.encode(), None,
            _linux.MS_BIND | _linux.MS_REC, None,
        ),
        f"bind {folder}",
    )  # fmt: skip
    _linux.errno_call(
        libc.mount(
            None, folder.encode(), None,
            _linux.MS_REMOUNT | _linux.MS_BIND | _linux.MS_RDONLY | _linux.MS_NOSUID
            | _linux.MS_NODEV, None,
        ),
        f"remount {folder} read-only",
    )  # fmt: skip


#: Per-mount options of ``/proc/self/mountinfo`` kept by ``no_access_times``' remount.
_MOUNT_FLAGS = {
    "ro": _linux.MS_RDONLY, "nosuid": _linux.MS_NOSUID, "nodev": _linux.MS_NODEV,
    "noexec": _linux.MS_NOEXEC,
}  # fmt: skip


def no_access_times() -> None:
    """Remount every mount of this (private) namespace ``noatime``, keeping its other flags.

    Why: reading a file updates its access time (``relatime``: when it is older than the
    modification time, or a day old), and ``stat`` shows it to anyone: each file under ``/usr``
    was a bit one run could set and a later run read back. Per-mount flags of this namespace's
    copies only: the host's mounts keep theirs. A mount that refuses is left as it is.
    """
    with open("/proc/self/mountinfo", "rb") as handle:
        lines = handle.read().splitlines()
    for line in lines:
        fields = line.split(b" ")
        if len(fields) < 6:
            continue
        point = fields[4]
        for escape, char in ((b"\\040", b" "), (b"\\011", b"\t"), (b"\\012", b"\n")):
            point = point.replace(escape, char)
        point = point.replace(b"\\134", b"\\")
        flags = _linux.MS_REMOUNT | _linux.MS_BIND | _linux.MS_NOATIME
        for option in fields[5].decode("ascii", "replace").split(","):
            flags |= _MOUNT_FLAGS.get(option, 0)
        _linux.libc.mount(None, point, None, flags, None)  # errors ignored, see above


def setup_run_mounts(uid: int, max_file_mb: int, pid_ns: bool, dev_shm: bool | None = None) -> str:
    """Set up a run's new mount namespace: tmpfs /tmp and /dev/shm, a fresh /proc (own PID ns).

    Returns the work dir (the private /tmp, owned by ``uid``). ``dev_shm``: whether /dev/shm
    exists, when the caller knows (the template checked it once).
    """
    libc = _linux.libc
    tmp_mb = max(16, 2 * max_file_mb)
    owner = f",uid={uid},gid={uid}" if uid > 0 else ""
    opts = f"size={tmp_mb}m,mode=0700{owner}".encode()
    nosuid_nodev = _linux.MS_NOSUID | _linux.MS_NODEV
    _linux.errno_call(libc.mount(b"tmpfs", b"/tmp", b"tmpfs", nosuid_nodev, opts), "mount /tmp")
    if os.path.isdir("/dev/shm") if dev_shm is None else dev_shm:
        _linux.errno_call(
            libc.mount(
                b"tmpfs", b"/dev/shm", b"tmpfs", nosuid_nodev | _linux.MS_NOEXEC,
                b"size=16m,mode=1777",
            ),
            "mount /dev/shm",
        )  # fmt: skip
    if pid_ns:
        _linux.errno_call(
            libc.mount(b"proc", b"/proc", b"proc", nosuid_nodev | _linux.MS_NOEXEC, None),
            "mount /proc",
        )
    return "/tmp"
