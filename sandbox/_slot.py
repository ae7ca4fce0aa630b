"""A slot's host resources: its unprivileged uid pair and its cgroups (limits, OOM counts).

Every resource here is released by ``SlotResources.close``: the cgroup directories (after moving
this process out of them: a cgroup cannot be removed while it has members), the uid lock file
and, when empty, the directories that hold them. Standard library only.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import time

from sandbox import _linux

CGROUP_ROOT = "/sys/fs/cgroup"
CGROUP_CONTROLLERS = ("memory", "pids")
#: Lock files that make each uid pair unique across every Sandbox on this machine.
LOCK_DIRS = ("/run/grpo-sandbox", "/tmp/grpo-sandbox-locks")
UID_BASE = 60000


def cgroup_dirs(uid: int) -> list[str]:
    """Return the cgroup directories of the slot that owns ``uid`` (v1: one per controller)."""
    return [f"{CGROUP_ROOT}/{c}/grpo-sandbox/u{uid}" for c in CGROUP_CONTROLLERS]


def _oom_kills(fd: int) -> int:
    """Parse ``oom_kill N`` from an open ``memory.oom_control`` (read again from offset 0)."""
    try:
        for line in os.pread(fd, 4096, 0).splitlines():
            if line.startswith(b"oom_kill "):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def kill_cgroup(path: str, keep: frozenset[int] = frozenset()) -> None:
    """Kill every member of the cgroup but this process and ``keep``."""
    for _ in range(50):
        try:
            with open(f"{path}/cgroup.procs") as handle:
                pids = [int(line) for line in handle if line.strip()]
        except OSError:
            return
        pids = [pid for pid in pids if pid != os.getpid() and pid not in keep]
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.001)


def remove_cgroup(path: str, wait_s: float = 2.0) -> bool:
    """Kill the members of a cgroup nobody uses any more and remove it; True when gone."""
    deadline = time.monotonic() + wait_s
    while os.path.isdir(path):
        kill_cgroup(path)
        try:
            os.rmdir(path)
        except OSError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)  # members still exiting
    with contextlib.suppress(OSError):  # the shared parent, once no slot uses it
        os.rmdir(os.path.dirname(path))
    return True


class SlotResources:
    """The uid pair, lock file and cgroups of one slot (the slot server's process)."""

    def __init__(self, is_root: bool) -> None:
        self.uid = -1
        self.lock_fd = -1
        self.lock_path = ""
        self.cgroups: list[str] = []
        self.cgroup_limits: tuple[int, int] | None = None
        self.oom_base = 0
        self.oom_fds: list[int] | None = None  # memory.oom_control, opened on first use
        if is_root:
            self._allocate_uid()
        if is_root and self.uid > 0:
            self._join_cgroups()

    @property
    def verdict_uid(self) -> int:
        """The uid of the verdict process: the slot's second uid."""
        return self.uid + 1

    # -- uid pair ------------------------------------------------------------------------------
    def _allocate_uid(self) -> None:
        for lock_dir in LOCK_DIRS:
            for _attempt in range(3):  # another slot may remove an empty lock dir meanwhile
                try:
                    os.makedirs(lock_dir, mode=0o700, exist_ok=True)
                    if self._lock_in(lock_dir):
                        return
                    break
                except FileNotFoundError:
                    continue
                except OSError:
                    break

    def _lock_in(self, lock_dir: str) -> bool:
        for uid in range(UID_BASE, UID_BASE + 4000, 2):
            path = f"{lock_dir}/{uid}.lock"
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                # Whoever held it before may have unlinked it (``close``): the lock must be on
                # the file the path names now, else two slots could think they own the uid.
                if os.fstat(fd).st_ino != os.stat(path).st_ino:
                    raise OSError("stale lock file")
            except OSError:
                os.close(fd)
                continue
            self.uid, self.lock_fd, self.lock_path = uid, fd, path
            return True
        return False

    # -- cgroups -------------------------------------------------------------------------------
    def _join_cgroups(self) -> None:
        for path in cgroup_dirs(self.uid):
            try:
                os.makedirs(path, exist_ok=True)
                kill_cgroup(path)  # a stale one from a crashed slot server
                # Join once: every child inherits it. Moving each run in instead costs an RCU
                # grace period per write to cgroup.procs (3-25 ms measured here).
                _linux.write_file(f"{path}/cgroup.procs", str(os.getpid()))
                self.cgroups.append(path)
            except OSError:
                self._leave_cgroups()
                return
        self.oom_base = self._oom_count()

    def set_limits(self, memory_mb: int, max_processes: int, input_bytes: int = 0) -> None:
        """Set this run's cgroup limits (written only when they change: each write costs).

        The memory limit is ``memory_mb`` + 128 MB of headroom for the slot server, template
        and verdict process (members too, never chosen by the OOM killer) + 4x the run's inputs
        when they exceed 1 MiB, rounded up to 16 MiB: on their way in they are held by the slot
        server (a str), a memfd, the child (bytes, then str) and the files/stdin they become.
        """
        extra_mb = 0 if input_bytes <= 1 << 20 else 4 * (-(-input_bytes // (16 << 20)) * 16)
        limits = (memory_mb + 128 + extra_mb, max_processes)
        if limits == self.cgroup_limits:
            return
        self.cgroup_limits = limits
        for path in self.cgroups:
            try:
                if "/memory/" in path:
                    _linux.write_file(f"{path}/memory.limit_in_bytes", str(limits[0] << 20))
                else:  # + slot server, template, verdict server, spare; the kernel's maximum
                    pids = min(max_processes + 4, 1 << 22)
                    _linux.write_file(f"{path}/pids.max", str(pids))
            except OSError:  # e.g. EBUSY when lowering below the current usage: retry next run
                self.cgroup_limits = None

    def _oom_count(self) -> int:
        # Read twice per job: an fd kept open and read from offset 0 (``open()`` and a text
        # wrapper per read cost the slot server ~30 us each).
        if self.oom_fds is None:
            self.oom_fds = []
            for path in self.cgroups:
                if "/memory/" in path:
                    with contextlib.suppress(OSError):
                        name = f"{path}/memory.oom_control"
                        self.oom_fds.append(os.open(name, os.O_RDONLY | os.O_CLOEXEC))
        return sum(_oom_kills(fd) for fd in self.oom_fds)

    def start_job(self) -> None:
        """Reset the OOM baseline: kills before this job started are nobody's (never blamed)."""
        if self.cgroups:
            self.oom_base = self._oom_count()

    def oom_kills_of_job(self) -> int:
        """OOM kills in the slot's cgroup since ``start_job``; resets the baseline.

        Read after every job, failed or not: a run that exits 0 after one of its processes was
        OOM-killed once left the count unread, and the next failing job was reported ``memory``.
        """
        if not self.cgroups:
            return 0
        count = self._oom_count()
        grew, self.oom_base = count - self.oom_base, count
        return max(grew, 0)

    def kill_members(self, keep: frozenset[int]) -> None:
        """Kill every cgroup member but this process and ``keep`` (runs without a PID ns)."""
        for path in self.cgroups:
            kill_cgroup(path, keep)

    def _leave_cgroups(self) -> None:
        """Move this process back to each hierarchy's root cgroup (so ours can be removed)."""
        for controller in CGROUP_CONTROLLERS:
            with contextlib.suppress(OSError):
                _linux.write_file(f"{CGROUP_ROOT}/{controller}/cgroup.procs", str(os.getpid()))

    def close(self) -> None:
        """Leave and remove the cgroups, then release and remove the uid lock."""
        for fd in self.oom_fds or ():
            with contextlib.suppress(OSError):
                os.close(fd)
        self.oom_fds = None
        self._leave_cgroups()
        for path in self.cgroups:
            remove_cgroup(path)
        self.cgroups = []
        if self.lock_fd >= 0:
            # Unlinked while still locked; ``_lock_in`` checks the inode, so a slot that opened
            # the old file meanwhile does not take the uid with a lock on a deleted file.
            with contextlib.suppress(OSError):
                os.unlink(self.lock_path)
            with contextlib.suppress(OSError):
                os.rmdir(os.path.dirname(self.lock_path))
            os.close(self.lock_fd)
            self.lock_fd = -1
