"""Weights from the trainer to generation servers: streamed in bounded buckets, one sync at a time.

The trainer (rank 0) and every server replica (ranks 1..D) join a small process group of their
own, apart from any group the trainer's ranks already form (accelerate's) and from vLLM's
internal one: it is built from a ``TCPStore`` the trainer hosts and a ``ProcessGroupGloo``
(CPU) or ``ProcessGroupNCCL`` (GPU) made directly on it, so nothing global is initialised on
either side.

A sync is a stream of buckets (``send_stream`` / ``receive_stream``): the exported tensors,
cast to the engine's dtype, are packed into contiguous buffers of at most ``bucket_bytes``
(a tensor larger than that travels alone), and each bucket is three broadcasts: a header
``[layout bytes, elements]``, the layout (``BucketLayout``: the tensors' names and shapes, as
JSON) and the buffer; an empty header ends the stream. Neither side ever holds the whole model
in one buffer: the trainer packs a bucket while the export produces the next tensors, the
replica hands each bucket's tensors to the engine's loader before it receives the next one, so
a sync's extra memory is a bucket or two (plus the largest tensor), not the model. Per-tensor
calls (one collective or one request per tensor) are what makes weight sync slow at scale;
buckets of hundreds of MB keep the collectives few.

Every collective has the group's timeout (``GroupAddress.timeout_s``): a peer that died raises
at once (gloo: the connection closes) and one that stalls raises when the timeout passes,
instead of hanging. NCCL groups are built so that this also holds on GPUs (``_nccl_raising``).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import math
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

#: torch dtypes by the names used on the wire.
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def dtype_name(dtype: torch.dtype) -> str:
    """Name a floating dtype for the wire.

    >>> dtype_name(torch.bfloat16)
    'bfloat16'
    """
    for name, value in DTYPES.items():
        if value == dtype:
            return name
    raise ValueError(f"weights of dtype {dtype} cannot be sent; use one of {', '.join(DTYPES)}")


@dataclass(frozen=True)
class TensorSpec:
    """Where one tensor lies in the flat buffer: its name and shape (offsets follow in order)."""

    name: str
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        """Number of elements."""
        return math.prod(self.shape)

    def to_json(self) -> list[Any]:
        """``[name, shape]`` for the request body."""
        return [self.name, list(self.shape)]

    @classmethod
    def from_json(cls, value: Sequence[Any]) -> TensorSpec:
        """Read ``[name, shape]``."""
        name, shape = value
        return cls(str(name), tuple(int(s) for s in shape))


def flatten(
    state: Mapping[str, torch.Tensor], dtype: torch.dtype, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, list[TensorSpec]]:
    """Pack ``state`` into one 1-D buffer of ``dtype`` on ``device``; return it and the layout.

    >>> buf, specs = flatten({"a": torch.ones(2, 2), "b": torch.zeros(3)}, torch.float32)
    >>> buf.tolist(), [(s.name, s.shape) for s in specs]
    ([1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0], [('a', (2, 2)), ('b', (3,))])
    """
    specs = [TensorSpec(name, tuple(t.shape)) for name, t in state.items()]
    buffer = torch.empty(sum(s.numel for s in specs), dtype=dtype, device=device)
    offset = 0
    for spec, tensor in zip(specs, state.values()):
        buffer[offset : offset + spec.numel].copy_(tensor.detach().reshape(-1))
        offset += spec.numel
    return buffer, specs


def unflatten(buffer: torch.Tensor, specs: Sequence[TensorSpec]) -> dict[str, torch.Tensor]:
    """Cut a buffer made by ``flatten`` back into named tensors (views of ``buffer``).

    >>> out = unflatten(torch.arange(5.0), [TensorSpec("a", (2, 2)), TensorSpec("b", (1,))])
    >>> out["a"].tolist(), out["b"].tolist()
    ([[0.0, 1.0], [2.0, 3.0]], [4.0])
    """
    total = sum(s.numel for s in specs)
    if buffer.numel() != total:
        raise ValueError(f"weight buffer has {buffer.numel()} elements, the layout says {total}")
    out: dict[str, torch.Tensor] = {}
    offset = 0
    for spec in specs:
        out[spec.name] = buffer[offset : offset + spec.numel].view(spec.shape)
        offset += spec.numel
    return out


#: A sync's bucket size when none is configured: large enough that a 7B model is ~60
#: collectives, small enough to sit beside vLLM's share of a GPU.
DEFAULT_BUCKET_MB = 256


def bucket_bytes_for(bucket_mb: float) -> int:
    """Bytes in a bucket of ``bucket_mb`` MiB; a fix-it error for a size that cannot work.

    >>> bucket_bytes_for(256)
    268435456
    >>> bucket_bytes_for(0)
    Traceback (most recent call last):
    ValueError: weight-sync bucket size 0 MB: must be > 0 (e.g. 256)
    """
    if not bucket_mb > 0 or math.isinf(bucket_mb):
        raise ValueError(
            f"weight-sync bucket size {bucket_mb:g} MB: must be > 0 (e.g. {DEFAULT_BUCKET_MB})"
        )
    return max(1, int(bucket_mb * 2**20))


@dataclass(frozen=True)
class BucketLayout:
    """The tensors of one bucket, in buffer order: what the replica needs to cut it up."""

    specs: tuple[TensorSpec, ...]

    @property
    def numel(self) -> int:
        """Elements in the bucket's buffer."""
        return sum(s.numel for s in self.specs)

    def encode(self) -> bytes:
        """Return the layout as JSON bytes (the wire form).

        >>> BucketLayout((TensorSpec("a", (2, 3)),)).encode()
        b'[["a", [2, 3]]]'
        """
        return json.dumps([s.to_json() for s in self.specs]).encode()

    @classmethod
    def decode(cls, data: bytes) -> BucketLayout:
        """Read ``encode``'s bytes.

        >>> BucketLayout.decode(b'[["a", [2, 3]]]').specs
        (TensorSpec(name='a', shape=(2, 3)),)
        """
        return cls(tuple(TensorSpec.from_json(item) for item in json.loads(data)))


def buckets(
    tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int, element_size: int
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Group ``tensors`` in order into lists of at most ``bucket_bytes`` once cast.

    ``element_size`` is the bytes per element on the wire. A tensor larger than a bucket is a
    bucket of its own. Lazy: a bucket is yielded as soon as the next tensor would overflow it,
    so only one bucket's tensors are held at a time.

    >>> sizes = [("a", torch.zeros(3)), ("b", torch.zeros(2)), ("c", torch.zeros(9))]
    >>> [[name for name, _ in b] for b in buckets(sizes, 16, 4)]
    [['a'], ['b'], ['c']]
    >>> [[name for name, _ in b] for b in buckets(sizes, 20, 4)]
    [['a', 'b'], ['c']]
    """
    current: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in tensors:
        nbytes = tensor.numel() * element_size
        if current and size + nbytes > bucket_bytes:
            yield current
            current, size = [], 0
        current.append((name, tensor))
        size += nbytes
    if current:
        yield current


@dataclass(frozen=True)
class StreamStats:
    """What one ``send_stream`` moved: for the sync metrics and the memory checks."""

    bytes: int
    buckets: int
    largest_bucket_bytes: int


def send_stream(
    group: WeightGroup,
    tensors: Iterable[tuple[str, torch.Tensor]],
    dtype: torch.dtype,
    bucket_bytes: int,
) -> StreamStats:
    """Broadcast ``tensors`` (cast to ``dtype``) bucket by bucket, then the end mark (module doc).

    Collective with ``receive_stream`` on every replica. ``tensors`` is consumed lazily, so an
    export that produces one tensor at a time is never held whole.
    """
    device = group.device
    element_size = torch.empty((), dtype=dtype).element_size()
    total = count = largest = 0
    for bucket in buckets(tensors, bucket_bytes, element_size):
        buffer, specs = flatten(dict(bucket), dtype, device)
        del bucket  # the bucket's source tensors (merged LoRA weights, gathered shards) can go
        layout = BucketLayout(tuple(specs)).encode()
        group.broadcast(
            torch.tensor([len(layout), buffer.numel()], dtype=torch.int64, device=device)
        )
        group.broadcast(torch.frombuffer(bytearray(layout), dtype=torch.uint8).to(device))
        group.broadcast(buffer)
        nbytes = buffer.numel() * buffer.element_size()
        total, count, largest = total + nbytes, count + 1, max(largest, nbytes)
        del buffer
    group.broadcast(torch.zeros(2, dtype=torch.int64, device=device))  # the end of the stream
    return StreamStats(total, count, largest)


def receive_stream(group: WeightGroup, dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield the tensors of a ``send_stream``, receiving each bucket when the last is consumed.

    The tensors are views of the bucket's buffer: a loader that copies them into its weights
    (vLLM's ``load_weights``) lets the buffer go before the next bucket arrives. Consume the
    iterator to its end (``drain``): the trainer's broadcasts wait for every replica.
    """
    device = group.device
    while True:
        header = torch.zeros(2, dtype=torch.int64, device=device)
        group.broadcast(header)
        layout_bytes, numel = (int(x) for x in header.tolist())
        if layout_bytes == 0:
            return
        raw = torch.zeros(layout_bytes, dtype=torch.uint8, device=device)
        group.broadcast(raw)
        layout = BucketLayout.decode(bytes(raw.cpu().tolist()))
        if layout.numel != numel:
            raise ValueError(f"weight bucket has {numel} elements, its layout says {layout.numel}")
        buffer = torch.empty(numel, dtype=dtype, device=device)
        group.broadcast(buffer)
        yield from unflatten(buffer, layout.specs).items()
        del buffer


def drain(stream: Iterator[tuple[str, torch.Tensor]]) -> int:
    """Receive what is left of a stream (a loader that stopped early); return the tensor count."""
    return sum(1 for _ in stream)


@dataclass(frozen=True)
class GroupAddress:
    """How a replica joins the trainer's weight group (sent to it in the open request)."""

    host: str
    port: int
    world_size: int
    backend: str
    """``gloo`` (CPU tensors) or ``nccl`` (CUDA tensors)."""
    timeout_s: float

    def to_json(self) -> dict[str, Any]:
        """Return the request body's fields."""
        return {
            "host": self.host,
            "port": self.port,
            "world_size": self.world_size,
            "backend": self.backend,
            "timeout_s": self.timeout_s,
        }

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> GroupAddress:
        """Read the request body."""
        return cls(
            str(value["host"]),
            int(value["port"]),
            int(value["world_size"]),
            str(value["backend"]),
            float(value["timeout_s"]),
        )


class WeightGroup:
    """One member of a trainer's weight group (rank 0: the trainer, which hosts the store)."""

    def __init__(self, address: GroupAddress, rank: int) -> None:
        timeout = datetime.timedelta(seconds=address.timeout_s)
        self.rank, self.address = rank, address
        self.store = dist.TCPStore(
            address.host,
            address.port,
            address.world_size,
            is_master=rank == 0,
            timeout=timeout,
            wait_for_workers=False,
        )
        store = dist.PrefixStore("grpo-weights", self.store)
        self.group: Any
        if address.backend == "nccl":
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            with _nccl_raising():
                self.group = dist.ProcessGroupNCCL(store, rank, address.world_size, options)
        elif address.backend == "gloo":
            self.group = dist.ProcessGroupGloo(store, rank, address.world_size, timeout)
        else:
            raise ValueError(f"weight-sync backend must be gloo or nccl, got {address.backend!r}")

    @property
    def device(self) -> torch.device:
        """Where this group's tensors must lie: CUDA for NCCL, the CPU for gloo."""
        return torch.device("cuda" if self.address.backend == "nccl" else "cpu")

    def broadcast(self, buffer: torch.Tensor) -> None:
        """Broadcast ``buffer`` from the trainer to every replica (in place on the replicas)."""
        self.group.broadcast([buffer], dist.BroadcastOptions()).wait()
        if buffer.is_cuda:
            torch.cuda.synchronize(buffer.device)


#: How the weight group's NCCL collectives fail (both read when a ``ProcessGroupNCCL`` is made).
#: ``TORCH_NCCL_BLOCKING_WAIT=1``: ``wait()`` blocks until the collective ends and raises once the
#: group's timeout passes (the default only orders the CUDA stream, so a dead peer was noticed by
#: nothing but the watchdog). ``TORCH_NCCL_ASYNC_ERROR_HANDLING=2`` (CleanUpOnly): on an error or
#: timeout the watchdog aborts the communicators and leaves the process alone; the default (3)
#: tears the whole process down, which skipped the trainer's ``EngineDied`` path and its save.
NCCL_RAISING_ENV = {"TORCH_NCCL_BLOCKING_WAIT": "1", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "2"}


@contextlib.contextmanager
def _nccl_raising() -> Iterator[None]:
    """Set ``NCCL_RAISING_ENV`` while a group is made (only this group reads it), then restore.

    >>> with _nccl_raising():
    ...     os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"]
    '2'
    """
    before = {key: os.environ.get(key) for key in NCCL_RAISING_ENV}
    os.environ.update(NCCL_RAISING_ENV)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def free_port() -> int:
    """Return a TCP port that was free a moment ago (for the trainer's store)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def local_address_towards(host: str, port: int) -> str:
    """Return the address on the route to ``host`` (what a server sees the trainer as).

    A UDP ``connect`` sends nothing; it only asks the kernel which interface it would use.
    """
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect((host, port))
            return str(sock.getsockname()[0])
        except OSError:
            return "127.0.0.1"
