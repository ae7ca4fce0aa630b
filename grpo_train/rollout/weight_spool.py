"""Weights to an engine's worker processes through a bounded spool folder (``/dev/shm``).

Workers in processes of their own (``VLLMEngine(..., in_process=False)`` on CPU, a
tensor-parallel ``grpo serve`` replica) cannot take the trainer's tensors by reference. The
trainer writes them, cast to the engine's dtype, as a numbered stream of safetensors files of at
most ``bucket_bytes`` each (a tensor larger than that travels alone) into a folder of its own,
each one complete before it appears (written under a hidden name, then renamed). Every worker
reads the stream in order from inside one ``reload_weights(weights_iterator=...)`` call
(``read_spool``) and acknowledges each bucket once read (an ack file per bucket and worker
rank); the trainer deletes a bucket when every worker has acknowledged it and never lets more
than ``window`` buckets exist at once. So the folder (RAM, on ``/dev/shm``) holds at most
``window`` buckets, never a copy of the model; the end marker says how many buckets there were.

Neither side waits for ever. The trainer gives up when the workers acknowledge nothing for
``timeout_s`` or when its ``stopped`` check reports the load call ended (a worker died or
raised); a worker gives up when no bucket comes for ``timeout_s``, when the trainer left an abort
marker (its export raised) or when the folder is gone.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

#: The end marker: its text is the number of buckets in the stream.
END = "end"
#: The abort marker: its text is why the trainer gave up.
ABORT = "abort"
#: The bucket file's metadata key for its tensors' names in stream order.
ORDER = "grpo_order"
#: Buckets the folder may hold at once: one being read, the next already written.
DEFAULT_WINDOW = 2
#: Longest pause between two looks at the folder (the first ones are shorter).
MAX_POLL_S = 0.01


def bucket_name(index: int) -> str:
    """Name the file of bucket ``index``.

    >>> bucket_name(3)
    'bucket-000003.safetensors'
    """
    return f"bucket-{index:06d}.safetensors"


def ack_name(index: int, rank: int) -> str:
    """Name the file by which worker ``rank`` says it has read bucket ``index``.

    >>> ack_name(3, 1)
    'bucket-000003.ack-1'
    """
    return f"bucket-{index:06d}.ack-{rank}"


@dataclass(frozen=True)
class SpoolStats:
    """What one stream wrote: for the sync metrics and the memory checks."""

    bytes: int
    """Bytes of every bucket file together."""
    buckets: int
    largest_bucket_bytes: int
    peak_bytes: int
    """The most bucket bytes present in the folder at once."""


class SpoolWriter:
    """The trainer's side: writes buckets into ``folder`` for workers ``0..readers-1``."""

    def __init__(
        self,
        folder: Path,
        readers: int,
        *,
        timeout_s: float,
        stopped: Callable[[], BaseException | None] = lambda: None,
        window: int = DEFAULT_WINDOW,
    ) -> None:
        """Make ``folder`` (it must not exist: a stream never meets another's files).

        ``stopped`` is asked while the writer waits: an error it returns (the workers' load
        call ended) is raised at once.
        """
        if window < 1 or readers < 1:
            raise ValueError(f"a spool needs a window and readers >= 1, got {window}, {readers}")
        folder.mkdir(parents=True)
        self.folder, self.readers, self.window = folder, readers, window
        self.timeout_s, self.stopped = timeout_s, stopped
        self._present: dict[int, int] = {}  # bucket index -> file bytes, not yet read by all
        self._next = 0
        self._bytes = self._largest = self._peak = 0

    def put(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Write one bucket (CPU tensors), after waiting for room in the window."""
        from safetensors.torch import save_file

        self._collect()
        if len(self._present) >= self.window:
            self._wait(
                lambda: len(self._present) < self.window,
                f"read weight bucket {min(self._present)} (of {self._next} written)",
            )
        index = self._next
        hidden = self.folder / f".{bucket_name(index)}.tmp"
        # The names in stream order (safetensors lists a file's tensors sorted by name).
        save_file(dict(tensors), str(hidden), metadata={ORDER: json.dumps(list(tensors))})
        size = hidden.stat().st_size
        hidden.replace(self.folder / bucket_name(index))
        self._present[index] = size
        self._next += 1
        self._bytes += size
        self._largest = max(self._largest, size)
        self._peak = max(self._peak, sum(self._present.values()))

    def finish(self) -> SpoolStats:
        """Write the end marker; return what the stream wrote."""
        _write_atomic(self.folder / END, str(self._next))
        return SpoolStats(self._bytes, self._next, self._largest, self._peak)

    def wait_read(self) -> None:
        """Wait until every worker has read every bucket (their files are then deleted)."""
        self._wait(lambda: not self._present, f"read all {self._next} weight buckets")

    def abort(self, reason: str) -> None:
        """Tell the workers the stream will not go on (they raise instead of waiting)."""
        if self.folder.is_dir():
            _write_atomic(self.folder / ABORT, reason)

    def _collect(self) -> None:
        """Delete the buckets every worker has read, with their acks."""
        for index in sorted(self._present):
            acks = [self.folder / ack_name(index, rank) for rank in range(self.readers)]
            if not all(ack.exists() for ack in acks):
                break  # workers read in order: a later bucket is not done either
            (self.folder / bucket_name(index)).unlink()
            for ack in acks:
                ack.unlink()
            del self._present[index]

    def _wait(self, done: Callable[[], bool], what: str) -> None:
        """Poll until ``done()``, collecting read buckets; raise if the workers stop or stall."""
        deadline = time.monotonic() + self.timeout_s
        pause = 0.0005
        while True:
            self._collect()
            if done():
                return
            failure = self.stopped()
            if failure is not None:
                raise failure
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the engine's workers did not {what} within {self.timeout_s:g} s"
                )
            time.sleep(pause)
            pause = min(2 * pause, MAX_POLL_S)


def write_stream(writer: SpoolWriter, buckets: Iterable[Mapping[str, torch.Tensor]]) -> SpoolStats:
    """Write every bucket, then the end marker; return the stream's stats."""
    for bucket in buckets:
        writer.put(bucket)
    return writer.finish()


def read_spool(folder: Path, rank: int, timeout_s: float) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield the tensors of the stream in ``folder`` as worker ``rank``, a bucket at a time.

    Each bucket is copied into this process's memory and acknowledged before its tensors are
    yielded, so the trainer can delete its file while the loader copies them into the weights.
    """
    from safetensors import safe_open

    index = 0
    while True:
        path = _next_bucket(folder, index, timeout_s)
        if path is None:
            return
        with safe_open(str(path), framework="pt") as bucket:
            names = json.loads(bucket.metadata()[ORDER])
            # Copies: safetensors' tensors map the file, whose RAM would outlive its deletion
            # for as long as the loader keeps them (vLLM's layerwise reload holds a layer's).
            tensors = [(name, bucket.get_tensor(name).clone()) for name in names]
        (folder / ack_name(index, rank)).touch()
        yield from tensors
        del tensors
        index += 1


def _next_bucket(folder: Path, index: int, timeout_s: float) -> Path | None:
    """Wait for bucket ``index`` (its path) or the end of the stream (None)."""
    path = folder / bucket_name(index)
    deadline = time.monotonic() + timeout_s
    pause = 0.0005
    while True:
        abort = folder / ABORT
        if abort.exists():
            reason = abort.read_text() or "no reason given"
            raise RuntimeError(f"the trainer aborted the weight stream: {reason}")
        if path.exists():
            return path
        end = folder / END
        if end.exists():
            count = int(end.read_text())
            if index >= count:
                return None
            if path.exists():  # renamed in between the two looks, then the end was written
                return path
            # The end came, this bucket is not there: it was deleted unread, or never written.
            raise RuntimeError(f"weight bucket {index} of {count} is missing from {folder}")
        if not folder.is_dir():
            raise RuntimeError(f"the weight stream's folder {folder} was removed mid-stream")
        if time.monotonic() > deadline:
            raise RuntimeError(f"no weight bucket {index} came within {timeout_s:g} s")
        time.sleep(pause)
        pause = min(2 * pause, MAX_POLL_S)


def _write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that a reader sees all of it or no file."""
    hidden = path.with_name(f".{path.name}.tmp")
    hidden.write_text(text)
    os.replace(hidden, path)
