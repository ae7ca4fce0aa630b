"""How a run stops early: a signal (finish the step, save, stop) or an abort.

The first Ctrl-C / SIGTERM only asks to stop: the trainer finishes its step, saves a checkpoint
and returns. A second one while that save is pending raises ``SecondSignal`` at once. Every rank
must stop at the same step, so ``StopRequest.anywhere`` asks all of them.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

from grpo_train import distributed


class SecondSignal(KeyboardInterrupt):
    """A second Ctrl-C / SIGTERM while the first one's save was pending: stop at once."""


class TrainingAborted(RuntimeError):
    """Too many non-finite updates in a row, or a broken scorer; the last checkpoint is kept."""


class StopRequest:
    """The signal a run was asked to stop by, if any (``signum``)."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        """First Ctrl-C / SIGTERM: finish the step, save, stop. A second one: stop at once."""
        if self.signum is not None:
            raise SecondSignal(signum)
        self.signum = signum

    def anywhere(self) -> bool:
        """Return True once a signal arrived on any rank (a collective: every rank calls it)."""
        stop = 1.0 if self.signum is not None else 0.0
        return distributed.global_max(stop)[0] > 0

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """Catch SIGINT / SIGTERM while inside; restore the previous handlers on the way out.

        Handlers can only be installed from the main thread; elsewhere Ctrl-C is the caller's.
        """
        in_main = threading.current_thread() is threading.main_thread()
        signals = (signal.SIGINT, signal.SIGTERM) if in_main else ()
        handlers = {s: signal.signal(s, self.on_signal) for s in signals}
        try:
            yield
        finally:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
