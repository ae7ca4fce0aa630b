"""No channel between runs: a run cannot leave bits in the page cache for a later run to read.

Every run reads the same files (``/usr``), so their cached pages are shared state: reading a
page sets a bit, evicting it (``posix_fadvise(POSIX_FADV_DONTNEED)``) clears it, and a later
run tells cached from uncached pages with ``preadv2(..., RWF_NOWAIT)``. The attack below is that
board; it is run within one slot and between two ``Sandbox`` objects, both ways. What must
hold: what the reader sees does not depend on what the writer wrote.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from sandbox_helpers import FAST, require_any

from sandbox import Sandbox, Status

BITS = 64
STRIDE_PAGES = 16  # pages between two bits (no read-ahead of one reaches the next)

#: The board, as a program would write it. ``PATH`` is set per test (a file under /usr that no
#: process maps: mapped pages cannot be evicted).
BOARD = r"""
import os
PAGE = 4096
def _open():
    fd = os.open(PATH, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # no read-ahead: one page per bit
    except OSError:
        pass
    return fd
def _evict(fd, off):
    try:
        os.posix_fadvise(fd, off, PAGE, os.POSIX_FADV_DONTNEED)
    except OSError:
        pass
def write_bits(bits):
    fd = _open()
    for i, bit in enumerate(bits):
        off = i * STRIDE * PAGE
        if bit:
            os.pread(fd, 1, off)
        else:
            _evict(fd, off)
    os.close(fd)
def read_bits(n):
    fd = _open()
    buf = bytearray(1)
    bits = []
    for i in range(n):
        off = i * STRIDE * PAGE
        try:
            os.preadv(fd, [buf], off, os.RWF_NOWAIT)
            bits.append(1)
        except OSError:
            bits.append(0)
            os.pread(fd, 1, off)  # undo the miss's read-in, then the bit is 0 again
            _evict(fd, off)
    os.close(fd)
    return bits
"""

PATTERN = [(i * 7 + i // 3) % 2 for i in range(BITS)]
INVERSE = [1 - bit for bit in PATTERN]


@pytest.fixture(scope="module")
def board_file() -> Iterator[Path]:
    base = Path("/usr/local/share")
    if not os.access(base, os.W_OK):
        pytest.skip("needs a writable folder under /usr (the runs can read /usr)")
    path = base / f"grpo-sandbox-board-{os.getpid()}.bin"
    with open(path, "wb") as handle:
        handle.write(b"\0" * (BITS * STRIDE_PAGES * 4096))
        handle.flush()
        os.fsync(handle.fileno())  # clean pages: dirty ones cannot be evicted
        # Written pages sit in large folios, which a one-page eviction leaves alone: start
        # uncached, so that the runs' one-page reads cache one page each.
        os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    path.chmod(0o644)
    yield path
    path.unlink()


def _program(board: Path, body: str) -> str:
    return f"PATH = {str(board)!r}\nSTRIDE = {STRIDE_PAGES}\n{BOARD}\n{body}\n"


def _write(box: Sandbox, board: Path, bits: list[int]) -> None:
    res = box.run(_program(board, f"write_bits({bits!r})"))
    assert res.status is Status.OK, res


def _read(box: Sandbox, board: Path) -> str:
    res = box.run(_program(board, f"print(''.join(map(str, read_bits({BITS}))))"))
    assert res.status is Status.OK, res
    return res.stdout.strip()


def _seen_after(writer: Sandbox, reader: Sandbox, board: Path) -> list[str]:
    seen = []
    for bits in (PATTERN, INVERSE, PATTERN):
        _write(writer, board, bits)
        seen.append(_read(reader, board))
    return seen


def test_page_cache_board_within_one_slot(board_file: Path) -> None:
    with Sandbox(limits=FAST, workers=1) as box:
        require_any(box, "seccomp")
        seen = _seen_after(box, box, board_file)
    assert seen[0] == seen[1] == seen[2], "the reader's bits followed the writer's"


def test_page_cache_board_between_two_sandboxes(board_file: Path) -> None:
    with Sandbox(limits=FAST, workers=1) as first, Sandbox(limits=FAST, workers=1) as second:
        require_any(first, "seccomp")
        one_way = _seen_after(first, second, board_file)
        other_way = _seen_after(second, first, board_file)
    assert one_way[0] == one_way[1] == one_way[2], "first -> second carried bits"
    assert other_way[0] == other_way[1] == other_way[2], "second -> first carried bits"


def test_page_cache_probes_are_refused(sb: Sandbox, board_file: Path) -> None:
    """Each way to probe or evict cached pages fails or does nothing (advice)."""
    require_any(sb, "seccomp")
    program = f"""
import ctypes, errno, mmap, os
libc = ctypes.CDLL(None, use_errno=True)
fd = os.open({str(board_file)!r}, os.O_RDONLY)
out = []
try:
    os.preadv(fd, [bytearray(1)], 0, os.RWF_NOWAIT)
    out.append("nowait-read")
except OSError as exc:
    out.append(str(exc.errno))
page = mmap.mmap(fd, 4096, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
addr = ctypes.addressof(ctypes.c_char.from_buffer(page))
vec = ctypes.create_string_buffer(1)
res = libc.syscall(27, ctypes.c_void_p(addr), ctypes.c_size_t(4096), vec)  # mincore
out.append(f"{{res}}:{{ctypes.get_errno()}}")
res = libc.syscall(451, fd, ctypes.c_void_p(0), ctypes.c_void_p(0), 0)  # cachestat
out.append(f"{{res}}:{{ctypes.get_errno()}}")
print(" ".join(out))
"""
    res = sb.run(program)
    assert res.status is Status.OK, res
    nowait, mincore, cachestat = res.stdout.split()
    assert nowait == str(errno.EOPNOTSUPP)
    assert mincore == f"-1:{errno.ENOSYS}"
    assert cachestat == f"-1:{errno.ENOSYS}"


def test_access_times_carry_no_bits(sb: Sandbox, tmp_path: Path) -> None:
    """Reading a file updates its access time (relatime: when older than its modification),
    which ``stat`` shows to every later run: each file under /usr was a bit."""
    base = Path("/usr/local/share")
    if not os.access(base, os.W_OK):
        pytest.skip("needs a writable folder under /usr (the runs can read /usr)")
    folder = base / f"grpo-sandbox-atime-{os.getpid()}"
    folder.mkdir()
    try:
        files = [folder / str(i) for i in range(16)]
        for path in files:
            path.write_text("x")
        folder.chmod(0o755)
        seen = []
        for bits in (PATTERN[:16], INVERSE[:16]):
            for path in files:
                os.utime(path, (1000, 2000))  # access time older than modification: a read sets it
            chosen = [str(path) for path, bit in zip(files, bits) if bit]
            res = sb.run(f"for name in {chosen!r}:\n    open(name).read()\n")
            assert res.status is Status.OK, res
            names = [str(p) for p in files]
            probe = (
                "import os\n"
                f"print(''.join('1' if os.stat(n).st_atime > 2000 else '0' for n in {names!r}))"
            )
            seen.append(sb.run(probe).stdout.strip())
        assert seen[0] == seen[1], "the reader's bits followed the writer's"
    finally:
        shutil.rmtree(folder)
