"""The weight spool's protocol (weight_spool.py): a writer and readers in threads, no vLLM."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from grpo_train.rollout.weight_channel import buckets
from grpo_train.rollout.weight_spool import (
    END,
    SpoolWriter,
    read_spool,
    write_stream,
)

#: Room for a bucket file's safetensors header (its tensors' names, shapes and offsets).
HEADER_BYTES = 512


def _tensors(sizes: list[int]) -> list[tuple[str, torch.Tensor]]:
    return [(f"t{i}", torch.arange(n, dtype=torch.float32) + i) for i, n in enumerate(sizes)]


class Reader(threading.Thread):
    """Reads a stream as one worker; slow ones sleep after each tensor (a loader at work)."""

    def __init__(self, folder: Path, rank: int, timeout_s: float = 5.0, pause_s: float = 0.0):
        super().__init__(daemon=True)
        self.folder, self.rank, self.timeout_s, self.pause_s = folder, rank, timeout_s, pause_s
        self.got: list[tuple[str, torch.Tensor]] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for pair in read_spool(self.folder, self.rank, self.timeout_s):
                self.got.append(pair)
                time.sleep(self.pause_s)
        except BaseException as err:
            self.error = err


def _peak_in_folder(folder: Path, stop: threading.Event, peak: list[int]) -> None:
    """Poll ``folder``: the most bytes of bucket files (written or being written) at once."""
    while not stop.is_set():
        total = 0
        for path in list(folder.glob("*bucket-*")) if folder.is_dir() else []:
            if path.name.endswith((".safetensors", ".tmp")):
                with contextlib.suppress(FileNotFoundError):  # deleted since the listing
                    total += path.stat().st_size
        peak[0] = max(peak[0], total)
        time.sleep(0.0005)


def test_a_stream_longer_than_the_window_reaches_every_reader_in_order_within_the_bound(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "stream"
    # 2000 floats: above a bucket of 512, it travels alone
    tensors = _tensors([300, 50, 50, 2000, 10, 400, 400, 100, 500, 300, 200, 512, 100])
    readers = [Reader(folder, 0, pause_s=0.003), Reader(folder, 1)]
    writer = SpoolWriter(folder, 2, timeout_s=5.0, window=2)
    stop, polled = threading.Event(), [0]
    poller = threading.Thread(target=_peak_in_folder, args=(folder, stop, polled))
    poller.start()
    for reader in readers:
        reader.start()
    stats = write_stream(writer, (dict(b) for b in buckets(tensors, 2048, 4)))
    writer.wait_read()
    for reader in readers:
        reader.join(5.0)
    stop.set()
    poller.join()
    for reader in readers:
        assert reader.error is None
        assert [name for name, _ in reader.got] == [name for name, _ in tensors]
        assert all(torch.equal(a, b) for (_, a), (_, b) in zip(reader.got, tensors))
    assert stats.buckets == 8 > writer.window
    # Never more than the window's buckets, however slow a reader: what the writer recorded and
    # what another thread saw in the folder (a file's header is well under HEADER_BYTES).
    bound = writer.window * (2048 + HEADER_BYTES) + 2000 * 4
    assert stats.largest_bucket_bytes < stats.peak_bytes <= bound < stats.bytes
    assert polled[0] <= bound
    assert sorted(p.name for p in folder.iterdir()) == [END]  # read buckets and acks are gone


def test_an_empty_stream_ends_at_once(tmp_path: Path) -> None:
    reader = Reader(tmp_path / "stream", 0)
    writer = SpoolWriter(tmp_path / "stream", 1, timeout_s=5.0)
    reader.start()
    stats = write_stream(writer, [])
    writer.wait_read()
    reader.join(5.0)
    assert not reader.is_alive() and reader.error is None and reader.got == []
    assert (stats.buckets, stats.bytes, stats.peak_bytes) == (0, 0, 0)


def test_an_abort_ends_the_readers_with_its_reason(tmp_path: Path) -> None:
    folder = tmp_path / "stream"
    writer = SpoolWriter(folder, 2, timeout_s=5.0)
    readers = [Reader(folder, rank, timeout_s=60.0) for rank in (0, 1)]
    for reader in readers:
        reader.start()
    writer.put(dict(_tensors([10])))
    writer.abort("ValueError: the export failed")
    start = time.monotonic()
    for reader in readers:
        reader.join(5.0)
        assert not reader.is_alive()
        assert isinstance(reader.error, RuntimeError)
        assert str(reader.error) == (
            "the trainer aborted the weight stream: ValueError: the export failed"
        )
    assert time.monotonic() - start < 2.0  # not the reader's 60 s timeout


def _timed(call: Callable[[], object]) -> tuple[BaseException, float]:
    start = time.monotonic()
    with pytest.raises(RuntimeError) as caught:
        call()
    return caught.value, time.monotonic() - start


def test_a_reader_gives_up_on_a_stalled_writer(tmp_path: Path) -> None:
    folder = tmp_path / "stream"
    SpoolWriter(folder, 1, timeout_s=5.0)  # made the folder, writes nothing
    error, took = _timed(lambda: list(read_spool(folder, 0, timeout_s=0.3)))
    assert str(error) == "no weight bucket 0 came within 0.3 s"
    assert 0.3 <= took < 2.0


def test_a_reader_gives_up_when_the_folder_is_removed(tmp_path: Path) -> None:
    folder = tmp_path / "stream"
    SpoolWriter(folder, 1, timeout_s=5.0)
    folder.rmdir()
    error, _ = _timed(lambda: list(read_spool(folder, 0, timeout_s=60.0)))
    assert "was removed mid-stream" in str(error)


def test_the_writer_gives_up_on_a_stalled_reader(tmp_path: Path) -> None:
    writer = SpoolWriter(tmp_path / "stream", 2, timeout_s=0.3, window=1)
    writer.put(dict(_tensors([10])))
    error, took = _timed(lambda: writer.put(dict(_tensors([10]))))
    assert str(error) == (
        "the engine's workers did not read weight bucket 0 (of 1 written) within 0.3 s"
    )
    assert 0.3 <= took < 2.0


def test_the_writer_raises_the_readers_failure_at_once(tmp_path: Path) -> None:
    failed = RuntimeError("the rollout engine died during weight sync: worker killed")
    outcome: list[BaseException] = []
    writer = SpoolWriter(
        tmp_path / "stream",
        1,
        timeout_s=60.0,
        stopped=lambda: outcome[0] if outcome else None,
        window=1,
    )
    writer.put(dict(_tensors([10])))
    threading.Timer(0.1, lambda: outcome.append(failed)).start()
    error, took = _timed(writer.wait_read)
    assert error is failed and took < 2.0


def test_a_stream_folder_is_never_reused(tmp_path: Path) -> None:
    (tmp_path / "stream").mkdir()
    with pytest.raises(FileExistsError):
        SpoolWriter(tmp_path / "stream", 1, timeout_s=1.0)
