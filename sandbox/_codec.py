"""A strict, tagged codec for plain values, and length-prefixed frames with size caps.

This module is loaded both by the trusted side (library parent, slot server, verdict process) and,
by inheritance, inside the untrusted child; it uses the standard library only.

Why not pickle: unpickling runs arbitrary constructors chosen by the sender. Why not bare JSON:
it cannot tell a tuple from a list, has no sets, bytes, complex or non-str dict keys, and loses
float bits. Every value here is ``[tag, payload]`` over JSON, decoding builds only builtins, and
both the frame size and the nesting depth are capped.
"""

from __future__ import annotations

import _socket
import base64
import json
import os
import socket
import struct
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, TypeAlias

PlainValue: TypeAlias = (
    object  # None|bool|int|float|complex|str|bytes|list|tuple|dict|set|frozenset
)

#: Frames larger than this are refused (a hostile peer cannot make the reader allocate more).
DEFAULT_MAX_FRAME = 16 << 20
MAX_DEPTH = 100
#: Bytes asked for per read of a stream. Below glibc's mmap threshold (128 KiB): a 1 MiB read
#: buffer cost an mmap, page faults, an mremap and a munmap per message (seen with strace).
READ_CHUNK = 64 << 10
_HEADER = struct.Struct(">I")
_SIZE = struct.Struct(">Q")
#: The most a request's texts may take, UTF-8 encoded, each with its 4-byte length prefix:
#: ``run``: code, stdin, file names and contents; ``run_tests``: program, setup, test sources
#: (or program and one test's stdin). Checked by the library (ValueError) before sending.
MAX_REQUEST = 64 << 20
#: The JSON metadata sent with those texts (limits, entry point, required layers): small.
MAX_META = 1 << 20
#: Messages up to this size travel inline in one SOCK_SEQPACKET packet; larger ones in a memfd
#: passed with the packet. A unix datagram/seqpacket message is one kernel buffer (its linear
#: part is one kmalloc), so above KMALLOC_MAX_SIZE (4 MiB) ``sendmsg`` fails with ENOBUFS
#: whatever SO_SNDBUF says; without root, SO_SNDBUF itself caps it (wmem_max, often 208 KiB).
INLINE_MAX = 64 << 10
#: Plain ints: combining the ``socket.MSG_*`` IntFlag members runs enum code in every child.
_PEEK_LENGTH = int(socket.MSG_PEEK) | int(socket.MSG_TRUNC)


class CandidateError(Exception):
    """Raised inside trusted test code when the candidate raised a non-builtin exception.

    The message is ``"TypeName: message"`` as reported by the (untrusted) candidate.
    """


class CodecError(ValueError):
    """A value cannot be encoded, or a frame / payload is malformed or too large."""


class TooDeepError(CodecError):
    """A value is nested more than ``MAX_DEPTH`` levels deep."""


def encode_value(value: object, depth: int = 0) -> object:
    """Turn a plain value into a JSON-compatible tagged tree.

    Exact builtin types are encoded directly; subclasses of builtins are encoded as their base
    value through the base type's own methods, so overridden ``__eq__``/``__iter__`` never travel.
    """
    if depth > MAX_DEPTH:
        raise TooDeepError("value nested too deeply")
    d = depth + 1
    if value is None:
        return ["n"]
    if isinstance(value, bool):
        return ["b", value is True]  # bool cannot be subclassed
    if isinstance(value, int):
        return ["i", int.__format__(value, "x")]
    if isinstance(value, float):
        return ["f", float.hex(value)]
    if isinstance(value, complex):
        exact = complex.__add__(value, 0j)  # the base value, whatever a subclass overrides
        return ["c", float.hex(exact.real), float.hex(exact.imag)]
    if isinstance(value, str):
        return ["s", str.__str__(value)]
    if isinstance(value, bytes | bytearray):
        return ["y", base64.b64encode(bytes(value)).decode("ascii")]
    if isinstance(value, list):
        return ["l", [encode_value(v, d) for v in list.__iter__(value)]]
    if isinstance(value, tuple):
        return ["t", [encode_value(v, d) for v in tuple.__iter__(value)]]
    if isinstance(value, dict):
        return ["d", [[encode_value(k, d), encode_value(v, d)] for k, v in dict.items(value)]]
    if isinstance(value, frozenset):
        return ["F", [encode_value(v, d) for v in frozenset.__iter__(value)]]
    if isinstance(value, set):
        return ["S", [encode_value(v, d) for v in set.__iter__(value)]]
    raise CodecError(f"cannot send a value of type {type(value).__name__}")


def _items(payload: object) -> list[object]:
    if not isinstance(payload, list):
        raise CodecError("malformed container")
    return payload


def decode_value(tree: object, depth: int = 0) -> object:
    """Rebuild a plain value from a tagged tree; anything unexpected raises ``CodecError``."""
    if depth > MAX_DEPTH:
        raise TooDeepError("value nested too deeply")
    if not isinstance(tree, list) or not tree or not isinstance(tree[0], str):
        raise CodecError("malformed value")
    tag, rest, d = tree[0], tree[1:], depth + 1
    try:
        if tag == "n" and not rest:
            return None
        if len(rest) == 1:
            (p,) = rest
            if tag == "b" and isinstance(p, bool):
                return p
            if tag == "i" and isinstance(p, str) and len(p) <= 100_000:
                return int(p, 16)
            if tag == "f" and isinstance(p, str):
                return float.fromhex(p)
            if tag == "s" and isinstance(p, str):
                return p
            if tag == "y" and isinstance(p, str):
                return base64.b64decode(p, validate=True)
            if tag == "l":
                return [decode_value(v, d) for v in _items(p)]
            if tag == "t":
                return tuple(decode_value(v, d) for v in _items(p))
            if tag == "S":
                return {decode_value(v, d) for v in _items(p)}
            if tag == "F":
                return frozenset(decode_value(v, d) for v in _items(p))
            if tag == "d":
                out: dict[object, object] = {}
                for pair in _items(p):
                    kv = _items(pair)
                    if len(kv) != 2:
                        raise CodecError("malformed dict item")
                    out[decode_value(kv[0], d)] = decode_value(kv[1], d)
                return out
        if tag == "c" and len(rest) == 2 and all(isinstance(p, str) for p in rest):
            return complex(float.fromhex(str(rest[0])), float.fromhex(str(rest[1])))
    except (TypeError, ValueError, OverflowError) as exc:  # unhashable keys, bad hex/base64
        raise CodecError(f"malformed value: {exc}") from None
    raise CodecError(f"unknown or malformed tag {tag!r}")


#: Built once: ``json.dumps`` with these options builds a new encoder per call (several
#: messages per run, and two per call of a candidate function).
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)
_DECODER = json.JSONDecoder()


def dumps(message: object) -> bytes:
    """Serialize a JSON-compatible message (already tagged where needed) to bytes."""
    return _ENCODER.encode(message).encode("utf-8")


def loads(data: bytes) -> object:
    """Parse bytes produced by ``dumps``; malformed or too deeply nested input raises CodecError."""
    try:
        return _DECODER.decode(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise CodecError(f"malformed message: {type(exc).__name__}") from None


def frame(payload: bytes) -> bytes:
    """Prefix ``payload`` with its 4-byte big-endian length."""
    return _HEADER.pack(len(payload)) + payload


def write_frame(fd: int, payload: bytes) -> None:
    """Write one frame to a blocking fd (all of it)."""
    view = memoryview(frame(payload))
    while view:
        n = os.write(fd, view)
        view = view[n:]


def read_exact(fd: int, n: int) -> bytes | bytearray | None:
    """Read exactly ``n`` bytes from a blocking fd; ``None`` on EOF before the first byte.

    Read in place into one buffer: a 64 MiB request must not be held twice (chunks and join).
    """
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        count = os.readv(fd, [view[got : got + (1 << 20)]])
        if not count:
            if got == 0:
                return None
            raise CodecError("truncated frame")
        got += count
    view.release()
    return bytes(buf) if n <= 1 << 20 else buf  # callers parse it: a bytearray will do


def read_frame(fd: int, max_size: int = DEFAULT_MAX_FRAME) -> bytes | bytearray | None:
    """Read one frame from a blocking fd; ``None`` on a clean EOF, CodecError if oversized."""
    header = read_exact(fd, _HEADER.size)
    if header is None:
        return None
    (size,) = _HEADER.unpack(header)
    if size > max_size:
        raise CodecError(f"frame of {size} bytes exceeds the cap of {max_size}")
    body = read_exact(fd, size)
    if body is None:
        raise CodecError("truncated frame")
    return body


def recv_packet(sock: socket.socket, max_size: int, maxfds: int = 0) -> tuple[bytes, list[int]]:
    """Receive one SOCK_SEQPACKET message (and up to ``maxfds`` fds) into a buffer of its size.

    The length is peeked first (``MSG_PEEK | MSG_TRUNC`` returns the real length), because a
    buffer of ``max_size`` (64 MiB for a request) is mmapped, faulted and mremapped per message.
    A message over ``max_size`` arrives truncated, which every caller's parser rejects.
    """
    size = sock.recvmsg_into([bytearray(1)], 0, _PEEK_LENGTH)[0]
    msg, fds, _flags, _addr = socket.recv_fds(sock, max(1, min(size, max_size + 1)), maxfds)
    return msg, fds


#: ``recv_exact``'s flags: the message or its fds did not fit. Plain ints (see above).
_CUT = int(socket.MSG_TRUNC) | int(socket.MSG_CTRUNC)


def recv_exact(sock: _socket.socket, bufsize: int, ancsize: int) -> tuple[bytes, list[int]]:
    """Receive one SOCK_SEQPACKET message known to fit in ``bufsize``, with its fds, in one call.

    For a run's child, where sizes are small and fixed: ``recv_packet``'s length probe and
    ``socket.recv_fds``' Python-level parsing cost it ~40 page faults per message (every
    object first touched in a child is a copy-on-write fault). ``ancsize`` is
    ``socket.CMSG_SPACE`` of the most fds expected. A message or fds cut short (it did not
    fit) raises CodecError after closing the fds that came.
    """
    msg, ancdata, flags, _addr = sock.recvmsg(bufsize, ancsize)
    fds: list[int] = []
    for level, kind, data in ancdata:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            fds += memoryview(data[: len(data) - len(data) % 4]).cast("i").tolist()
    if flags & _CUT:
        for fd in fds:
            os.close(fd)
        raise CodecError("message or fds cut short")
    return msg, fds


def text_size(text: str) -> int:
    """Bytes ``text`` takes in a request (``pack_texts``): UTF-8, lone surrogates kept."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def texts_size(texts: Sequence[str]) -> int:
    """Bytes ``texts`` take in a request, length prefixes included (compare with MAX_REQUEST)."""
    return sum(_HEADER.size + text_size(text) for text in texts)


def pack_texts(meta: Mapping[str, object] | bytes, texts: Sequence[str]) -> Iterator[bytes]:
    """Lay out a request: ``meta`` (JSON, or bytes as they are), then each text as raw UTF-8.

    No JSON escaping of the texts. Yielded in pieces of at most 1 MiB of text, so that a large
    request is never held encoded all at once next to its str and the memfd it is written to.
    """
    head = meta if isinstance(meta, bytes) else dumps(meta)
    yield _HEADER.pack(len(head)) + head + _HEADER.pack(len(texts))
    for text in texts:
        yield _HEADER.pack(text_size(text))
        for start in range(0, len(text), 1 << 20):
            yield text[start : start + (1 << 20)].encode("utf-8", "surrogatepass")


def unpack_views(data: bytes | bytearray) -> tuple[memoryview, list[memoryview]]:
    """Split a ``pack_texts`` layout into views of its meta bytes and of each text's UTF-8.

    Nothing is decoded or copied (a run's child writes stdin on as bytes); anything
    malformed raises CodecError.
    """
    view = memoryview(data)
    try:
        (size,) = _HEADER.unpack_from(view, 0)
        if size > MAX_META:
            raise CodecError("request metadata too large")
        pos = _HEADER.size + size
        meta = view[_HEADER.size : pos]
        (count,) = _HEADER.unpack_from(view, pos)
        pos += _HEADER.size
        texts: list[memoryview] = []
        for _ in range(count):
            (size,) = _HEADER.unpack_from(view, pos)
            pos += _HEADER.size
            if pos + size > len(view):
                raise CodecError("truncated request")
            texts.append(view[pos : pos + size])
            pos += size
    except struct.error as exc:
        raise CodecError(f"malformed request: {exc}") from None
    if pos != len(view):
        raise CodecError("malformed request")
    return meta, texts


def text_of(view: memoryview) -> str:
    """Decode one text of ``unpack_views`` (lone surrogates kept, as ``pack_texts`` wrote them)."""
    try:
        return str(view, "utf-8", "surrogatepass")
    except UnicodeDecodeError as exc:
        raise CodecError(f"malformed request: {exc}") from None


def unpack_texts(data: bytes | bytearray) -> tuple[dict[str, Any], list[str]]:
    """Inverse of ``pack_texts`` with JSON meta; anything malformed raises CodecError."""
    meta_view, views = unpack_views(data)
    meta = loads(bytes(meta_view))
    if not isinstance(meta, dict):
        raise CodecError("malformed request")
    return meta, [text_of(v) for v in views]


class Message:
    """A message for a SOCK_SEQPACKET peer, sendable more than once (``recv_message`` reads it).

    Small ones are one packet; a large one is written once to a memfd, and each send passes the
    memfd along with a packet holding its size (no size limit from socket buffers or kmalloc).
    """

    def __init__(
        self, kind: bytes, meta: Mapping[str, object] | bytes, texts: Sequence[str]
    ) -> None:
        self.memfd = -1
        if texts_size(texts) <= INLINE_MAX // 2:  # meta is small: the packet stays inline
            self.head = kind + b"I" + b"".join(pack_texts(meta, texts))
            if len(self.head) <= INLINE_MAX + 2:
                return
        self.memfd = os.memfd_create("sandbox-message", os.MFD_CLOEXEC)
        size = 0
        try:
            for part in pack_texts(meta, texts):
                view = memoryview(part)
                size += len(view)
                while view:
                    view = view[os.write(self.memfd, view) :]
        except BaseException:
            self.close()
            raise
        self.head = kind + b"M" + _SIZE.pack(size)

    def send(self, sock: socket.socket, fds: Sequence[int] = ()) -> None:
        """Send the message (and ``fds``) as one packet."""
        memfd = [self.memfd] if self.memfd >= 0 else []
        socket.send_fds(sock, [self.head], [*memfd, *fds])

    def close(self) -> None:
        """Release the memfd (a peer that received it keeps its own reference)."""
        if self.memfd >= 0:
            os.close(self.memfd)
            self.memfd = -1


def recv_message(
    sock: socket.socket, max_size: int, maxfds: int = 0
) -> tuple[bytes, bytes | bytearray, list[int]]:
    """Receive one ``Message``: (kind, payload, the fds sent with it); kind is b"" at EOF.

    A payload over ``max_size`` or a malformed packet raises CodecError.
    """
    msg, fds = recv_packet(sock, INLINE_MAX + 2, maxfds + 1)
    return parse_message(msg, fds, max_size)


def parse_message(
    msg: bytes, fds: list[int], max_size: int
) -> tuple[bytes, bytes | bytearray, list[int]]:
    """Do the rest of ``recv_message`` for a packet (and its fds) the caller received."""
    if not msg:
        return b"", b"", fds
    kind, how = msg[:1], msg[1:2]
    if how == b"I" and len(msg) <= INLINE_MAX + 2:
        return kind, msg[2:], fds
    if not (how == b"M" and fds and len(msg) == 2 + _SIZE.size):
        raise CodecError("malformed message packet")
    memfd = fds.pop(0)
    try:
        (size,) = _SIZE.unpack_from(msg, 2)
        if size > max_size:
            raise CodecError(f"message of {size} bytes exceeds the cap of {max_size}")
        if os.fstat(memfd).st_size != size:
            raise CodecError("message size mismatch")
        buf = bytearray(size)
        view, got = memoryview(buf), 0
        while got < size:
            n = os.preadv(memfd, [view[got:]], got)
            if n <= 0:
                raise CodecError("truncated message")
            got += n
    finally:
        os.close(memfd)
    return kind, buf, fds


class FrameReader:
    """Incremental frame parser for non-blocking reads (readers that poll with deadlines)."""

    def __init__(self, max_size: int = DEFAULT_MAX_FRAME) -> None:
        self.max_size = max_size
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        """Add bytes; return every complete frame now available. Oversized frames raise."""
        self._buf += data
        out: list[bytes] = []
        while len(self._buf) >= _HEADER.size:
            (size,) = _HEADER.unpack_from(self._buf)
            if size > self.max_size:
                raise CodecError(f"frame of {size} bytes exceeds the cap of {self.max_size}")
            if len(self._buf) < _HEADER.size + size:
                break
            out.append(bytes(self._buf[_HEADER.size : _HEADER.size + size]))
            del self._buf[: _HEADER.size + size]
        return out
