"""How a run stops early: a signal (finish the step, save, stop) or an abort.

The first Ctrl-C / SIGTERM only asks to stop: the trainer finishes its step, saves a checkpoint
and returns; the command exits 130 (SIGINT) or 143 (SIGTERM), the shell's 128 + signal number.
A second one while that save is pending raises ``SecondSignal`` at once. Every rank must stop at
the same step, so ``StopRequest.anywhere`` asks all of them.

A terminal sends Ctrl-C to its whole foreground process group and job runners (``timeout``,
Slurm, Kubernetes) signal every process of the job, so the rollout engine's own processes get the
signal too and end; the trainer treats that as part of the stop (``rollout.base.EngineDied``).
The same signal often arrives twice within milliseconds: once to the group, once forwarded by a
launcher (``accelerate launch`` / torchrun pass it on to their ranks). A repeat within
``REPEAT_WINDOW_S`` is that same request, not a second Ctrl-C.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

from grpo_train.parallel import distributed

#: A repeat of the signal within this many seconds of the first is the same stop request.
REPEAT_WINDOW_S = 1.0

#: Test-only: ``phase`` or ``phase@step``: at that point of the run, write a marker file
#: (``PAUSE_FILE_ENV`` + ``.<rank>``) and wait for a signal, so that a test signals the process
#: group exactly then. Unset (always, outside tests) the pause points do nothing.
PAUSE_AT_ENV = "GRPO_KIT_TEST_PAUSE_AT"
PAUSE_FILE_ENV = "GRPO_KIT_TEST_PAUSE_FILE"


class SecondSignal(KeyboardInterrupt):
    """A second Ctrl-C / SIGTERM while the first one's save was pending: stop at once."""


class TrainingAborted(RuntimeError):
    """Too many non-finite updates in a row, or a broken scorer; the last checkpoint is kept."""


class StopRequest:
    """The signal a run was asked to stop by, if any (``signum``)."""

    active: StopRequest | None = None
    """The request whose handlers are installed (the pause points wait on it)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.global_signum: int | None = None
        """The signal seen on any rank (``anywhere``): what the exit code reports."""
        self._first_at = 0.0

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        """First Ctrl-C / SIGTERM: finish the step, save, stop. A second one: stop at once."""
        now = time.monotonic()
        if self.signum is not None:
            if now - self._first_at < REPEAT_WINDOW_S:
                return  # the same request, delivered twice (module doc)
            raise SecondSignal(signum)
        self.signum, self._first_at = signum, now

    def anywhere(self) -> bool:
        """Return True once a signal arrived on any rank (a collective: every rank calls it)."""
        seen = distributed.global_max(float(self.signum or 0))[0]
        if seen > 0:
            self.global_signum = int(seen)
        return seen > 0

    @property
    def exit_code(self) -> int:
        """The shell's code for a run stopped by this signal: 128 + its number (130, 143)."""
        return 128 + (self.global_signum or self.signum or signal.SIGINT)

    @property
    def name(self) -> str:
        """The signal's name (``SIGINT``), for messages."""
        signum = self.global_signum or self.signum
        return signal.Signals(signum).name if signum else "a stop request"

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """Catch SIGINT / SIGTERM while inside; restore the previous handlers on the way out.

        Handlers can only be installed from the main thread; elsewhere Ctrl-C is the caller's.
        Installing the same request again (the trainer inside the CLI) changes nothing.
        """
        in_main = threading.current_thread() is threading.main_thread()
        signals = (signal.SIGINT, signal.SIGTERM) if in_main else ()
        handlers = {s: signal.signal(s, self.on_signal) for s in signals}
        outer, StopRequest.active = StopRequest.active, self
        try:
            yield
        finally:
            StopRequest.active = outer
            for sig, handler in handlers.items():
                signal.signal(sig, handler)


_paused: set[str] = set()


def pause_point(phase: str, step: int | None = None) -> None:
    """Test-only: wait here for a signal when ``PAUSE_AT_ENV`` names this phase (module doc).

    Each pause point pauses once per process; a signal already received passes at once. The run
    goes on without a signal when the test removes the marker, or after two minutes.
    """
    wanted = os.environ.get(PAUSE_AT_ENV)
    if not wanted or phase in _paused:
        return
    name, _, at = wanted.partition("@")
    if name != phase or (at and step is not None and step < int(at)):
        return
    _paused.add(phase)
    marker = Path(f"{os.environ.get(PAUSE_FILE_ENV, 'pause')}.{os.environ.get('RANK', '0')}")
    marker.write_text(f"{phase} {step}\n")
    request = StopRequest.active
    deadline = time.monotonic() + 120
    while request is not None and request.signum is None and time.monotonic() < deadline:
        if not marker.exists():  # the test removed it: go on without a signal
            return
        time.sleep(0.02)
