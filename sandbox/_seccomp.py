"""The seccomp policy of the untrusted runs: compiled to BPF once per slot, loaded by each child.

Standard library only, plus pyseccomp (libseccomp's Python binding), which is loaded by file path
in a throw-away child: it imports ``ctypes.util``, hence ``subprocess`` and ``threading``, which
would add ~1 MB to the template process (copied at every fork) and an at-fork hook that every
run's child would execute.

Unix sockets. ``connect``/``sendto`` to a *pathname* unix socket is checked only by the socket
file's permissions: Landlock (up to ABI 7) does not cover it, a network namespace does not
either, and a world-writable socket a host service left under ``/var``, ``/dev`` or anywhere
else would be reachable. seccomp cannot read the address a ``connect`` is given (it is in
memory, and reading it there would race with the program), so the policy removes every way to
*address* a socket:

* ``network=False``: unix sockets are the only family (``socket`` refuses the others), so
  ``connect``, ``sendto`` with an address, ``sendmsg`` and ``sendmmsg`` (whose address is in
  memory) are refused outright. A run can still make sockets, ``bind`` and ``listen`` (abstract
  names land in its own network namespace, pathnames only in its work dir), use socketpairs
  and ``send``/``recv`` on them (``asyncio``'s self-pipe).
* ``network=True``: ``connect`` must work for TCP, so no unix socket can be made with
  ``socket`` at all, and ``socketpair`` only gives connected stream/seqpacket pairs (which
  cannot be re-pointed: ``connect`` gives EISCONN and stream ``sendto`` refuses an address).

What this costs: a program cannot be a unix-socket client (``multiprocessing.Manager``,
``logging.handlers.SysLogHandler``); an honest test program has no use for that. Where seccomp
is unavailable, the template's mount namespace still hides ``/run``, ``/var`` and the host's
``/dev`` (``_mounts.hide_host_dirs``), and the per-slot uid leaves only world-writable sockets.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import socket
import sys
from types import ModuleType

from sandbox import _codec, _linux

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
#: Page-cache probes and evictions, refused so that runs cannot leave bits for each other in
#: the page cache of files they all read (``/usr``: one run reads a page to set a bit or
#: evicts it to clear one, a later run tells cached from uncached pages). Advice calls succeed
#: without effect (advice may be ignored, so an honest program sees no difference); the probes
#: fail. Linux AIO is refused whole: its read flags (``RWF_NOWAIT``) are in memory, where BPF
#: cannot look. What is left to read page-cache state is its effect on time (and fault
#: counts): a timing channel, see README.md.
IGNORED_ADVICE = ("fadvise64", "fadvise64_64", "arm_fadvise64_64", "readahead")
PAGE_CACHE_PROBES = ("mincore", "cachestat", "process_madvise", "io_setup", "io_submit")
#: ``madvise`` advice that reclaims a mapping's pages (file pages included): MADV_COLD,
#: MADV_PAGEOUT.
RECLAIM_ADVICE = (20, 21)
#: ``RWF_NOWAIT``: a read that fails instead of waiting for I/O, i.e. a page-cache probe.
RWF_NOWAIT = 0x8
#: ``SOCK_TYPE_MASK``: the type without SOCK_NONBLOCK / SOCK_CLOEXEC.
_SOCK_TYPE_MASK = 0xF


class SockFprog(ctypes.Structure):
    _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_void_p))


class SeccompFilter:
    """A compiled BPF program wrapped for ``prctl`` once; each child makes the one call."""

    def __init__(self, program: bytes) -> None:
        self.program = program
        self._buf = ctypes.create_string_buffer(program, len(program))
        self._prog = SockFprog(len(program) // 8, ctypes.cast(self._buf, ctypes.c_void_p))
        self._ref = ctypes.byref(self._prog)

    def load(self) -> None:
        """Install the filter on the calling thread (irreversible; needs no_new_privs)."""
        _linux.errno_call(
            _linux.libc.prctl(_linux.PR_SET_SECCOMP, _linux.SECCOMP_MODE_FILTER, self._ref, 0, 0),
            "seccomp",
        )


def _load_pyseccomp(path: str) -> ModuleType:
    import importlib.util  # the slot server's throw-away child only: not in the template

    spec = importlib.util.spec_from_file_location("pyseccomp", path)
    if spec is None or spec.loader is None:
        raise ImportError(path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["pyseccomp"] = module
    spec.loader.exec_module(module)
    return module


def compile_bpf(pyseccomp_path: str, network: bool) -> bytes:
    """Compile one policy (``network`` allowed or not) to a BPF program with libseccomp."""
    seccomp = _load_pyseccomp(pyseccomp_path)
    filt = seccomp.SyscallFilter(seccomp.ALLOW)
    # A binary tree of syscall numbers instead of libseccomp's default linear chain (libseccomp
    # >= 2.5, SCMP_FLTATR_CTL_OPTIMIZE = 2). Installing a filter makes the kernel evaluate it
    # for every syscall number (its allow-cache), so a chain costs every run's child more:
    # measured, attaching took 190 instead of 265 us (p50, 300 attaches; 120 vs 104 insns).
    # Same rules, same verdicts; older libseccomp keeps the chain.
    with contextlib.suppress(OSError, ValueError, RuntimeError, AttributeError):
        filt.set_attr(seccomp.Attr.CTL_OPTIMIZE, 2)
    for name in DENIED_SYSCALLS:
        # A name that is not a syscall on this architecture is skipped.
        with contextlib.suppress(OSError, ValueError, RuntimeError):
            filt.add_rule(seccomp.ERRNO(errno.EPERM), name)
    # clone: no new namespaces. clone3 passes flags in memory where BPF cannot look, so it
    # gets ENOSYS and glibc falls back to clone (documented glibc behaviour).
    for flag in (
        _linux.CLONE_NEWNS, _linux.CLONE_NEWUTS, _linux.CLONE_NEWIPC, _linux.CLONE_NEWUSER,
        _linux.CLONE_NEWPID, _linux.CLONE_NEWNET, _linux.CLONE_NEWCGROUP,
    ):  # fmt: skip
        filt.add_rule(
            seccomp.ERRNO(errno.EPERM), "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag)
        )
    filt.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
    _page_cache_rules(seccomp, filt)
    # Sockets: see the module docstring.
    denied = seccomp.ERRNO(errno.EACCES)
    if network:
        filt.add_rule(denied, "socket", seccomp.Arg(0, seccomp.EQ, socket.AF_UNIX))
        for kind in range(_SOCK_TYPE_MASK + 1):
            if kind not in (socket.SOCK_STREAM, socket.SOCK_SEQPACKET):
                filt.add_rule(
                    denied, "socketpair", seccomp.Arg(1, seccomp.MASKED_EQ, _SOCK_TYPE_MASK, kind)
                )
    else:
        filt.add_rule(
            seccomp.ERRNO(errno.EAFNOSUPPORT),
            "socket",
            seccomp.Arg(0, seccomp.NE, socket.AF_UNIX),
        )
        for name in ("connect", "sendmsg", "sendmmsg"):
            filt.add_rule(denied, name)
        filt.add_rule(denied, "sendto", seccomp.Arg(4, seccomp.NE, 0))
    fd = os.memfd_create("bpf")
    with os.fdopen(fd, "w+b") as handle:
        filt.export_bpf(handle)
        handle.seek(0)
        return handle.read()


def _page_cache_rules(seccomp: ModuleType, filt: object) -> None:
    """No run can evict or probe pages of the page cache (``PAGE_CACHE_PROBES`` above)."""
    for name in IGNORED_ADVICE:
        with contextlib.suppress(OSError, ValueError, RuntimeError):
            filt.add_rule(seccomp.ERRNO(0), name)  # type: ignore[attr-defined]
    for name in PAGE_CACHE_PROBES:
        with contextlib.suppress(OSError, ValueError, RuntimeError):  # cachestat: Linux >= 6.5
            filt.add_rule(seccomp.ERRNO(errno.ENOSYS), name)  # type: ignore[attr-defined]
    for advice in RECLAIM_ADVICE:
        filt.add_rule(  # type: ignore[attr-defined]
            seccomp.ERRNO(0), "madvise", seccomp.Arg(2, seccomp.EQ, advice)
        )
    for name in ("preadv2", "pwritev2"):  # flags: the 6th argument
        filt.add_rule(  # type: ignore[attr-defined]
            seccomp.ERRNO(errno.EOPNOTSUPP),
            name,
            seccomp.Arg(5, seccomp.MASKED_EQ, RWF_NOWAIT, RWF_NOWAIT),
        )


def build(pyseccomp_path: str | None) -> dict[bool, SeccompFilter]:
    """Compile both policies in a throw-away child; ``{}`` when pyseccomp is unavailable."""
    if not pyseccomp_path or not os.path.exists(pyseccomp_path):
        return {}
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_fd)
            for network in (False, True):
                _codec.write_frame(write_fd, compile_bpf(pyseccomp_path, network))
        finally:
            os._exit(0)
    os.close(write_fd)
    programs: dict[bool, SeccompFilter] = {}
    try:
        for network in (False, True):
            program = _codec.read_frame(read_fd, 1 << 20)
            if not program:  # the helper failed: no seccomp layer
                return {}
            programs[network] = SeccompFilter(bytes(program))
    finally:
        os.close(read_fd)
        os.waitpid(pid, 0)
    return programs
