"""The verdict server: the long-lived process of a slot that runs TRUSTED test code.

Cloned by the template (so it starts as pristine as a run's child), it is a child of the slot
server, which hands it one job at a time (setup, test sources and the channel to the program's
process) and reads one report per test. It runs as the slot's second uid with ``no_new_privs``,
a 4 GB address-space limit, a network namespace of its own (no interface) and a private
``/tmp``, in the template's mount namespace (host homes and checkouts hidden). This module is
V's own code only (the slot server's handle on it is ``_spawn.VerdictServer``); the job logic
itself is in ``_verdict.py``. Standard library only.
"""

from __future__ import annotations

import contextlib
import gc
import os
import resource
import socket

from sandbox import _codec, _linux, _verdict
from sandbox._child import RunContext

#: Largest job message (setup, test sources and their metadata) the verdict server accepts.
MAX_VERDICT_MESSAGE = _codec.MAX_REQUEST + _codec.MAX_META + (1 << 10)
#: V's ``oom_score_adj``: killed before the slot server and template, after the run's child.
VERDICT_OOM_SCORE_ADJ = 500
#: After a job in which the candidate sent more than this, V returns freed memory to the system
#: (decoded huge values otherwise stay in its heap: +11 to +44 MB measured).
TRIM_AFTER_BYTES = 1 << 20


def main(ctx: RunContext, fd: int, verdict_uid: int) -> None:
    """V's life, in the freshly cloned process: isolate once, then run jobs until told to stop."""
    try:
        _linux.set_pdeathsig()
        # Before S and T in the OOM killer's order (after the run's child, at 1000): values a
        # candidate returns are decoded here, and where the host refuses S and T their -1000,
        # V losing a job costs that job its verdicts, S or T losing it would cost the slot.
        # Written now: once V has dropped to its uid, its /proc files are root's.
        with contextlib.suppress(OSError):
            _linux.write_file("/proc/self/oom_score_adj", str(VERDICT_OOM_SCORE_ADJ))
        _linux.close_all_except({fd})
        sock = socket.socket(fileno=fd)
        null = os.open("/dev/null", os.O_RDWR)  # 0-2 for trusted code that prints
        for target in (0, 1, 2):
            if null != target:
                os.dup2(null, target)
        if null > 2:
            os.close(null)
        if ctx.is_root:
            _linux.libc.unshare(_linux.CLONE_NEWNET)  # trusted code has no use for a network
            if _linux.libc.unshare(_linux.CLONE_NEWNS) == 0:
                _linux.libc.mount(
                    b"tmpfs", b"/tmp", b"tmpfs", _linux.MS_NOSUID | _linux.MS_NODEV,
                    b"size=64m,mode=1777",
                )  # fmt: skip
        if ctx.uid > 0:
            os.setgroups([])
            os.setresgid(verdict_uid, verdict_uid, verdict_uid)
            os.setresuid(verdict_uid, verdict_uid, verdict_uid)
            _linux.set_pdeathsig()
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
        _linux.libc.prctl(_linux.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        _serve(sock)
    except BaseException:
        pass
    os._exit(0)


def _serve(sock: socket.socket) -> None:
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
            received = _verdict.run_job(job, int(job["first"]), chan, report)
            del job, texts
            if received > TRIM_AFTER_BYTES:
                gc.collect()
                _linux.libc.malloc_trim(0)
        except Exception as exc:
            report(["setup_error", f"verdict server: {type(exc).__name__}: {exc}"[:500]])
        finally:
            chan.close()
        report(["done"])
