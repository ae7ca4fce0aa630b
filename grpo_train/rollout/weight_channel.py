"""Weights from the trainer to generation servers: one flat buffer, one broadcast per sync.

The trainer (rank 0) and every server replica (ranks 1..D) join a small process group of their
own, apart from any group the trainer's ranks already form (accelerate's) and from vLLM's
internal one: it is built from a ``TCPStore`` the trainer hosts and a ``ProcessGroupGloo``
(CPU) or ``ProcessGroupNCCL`` (GPU) made directly on it, so nothing global is initialised on
either side. Each sync packs every tensor, cast to the engine's dtype, into one contiguous
buffer and broadcasts it once; the tensor names and shapes travel beside it in the HTTP request
(``TensorSpec``), so the servers can cut the buffer back into a state dict. Per-parameter calls
(one collective or one request per tensor) are what makes weight sync slow and fragile at scale.

Every collective has the group's timeout: a peer that died or stalls raises instead of hanging.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Mapping, Sequence
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
            self.group = dist.ProcessGroupNCCL(store, rank, address.world_size, options)
        elif address.backend == "gloo":
            self.group = dist.ProcessGroupGloo(store, rank, address.world_size, timeout)
        else:
            raise ValueError(f"weight-sync backend must be gloo or nccl, got {address.backend!r}")

    def broadcast(self, buffer: torch.Tensor) -> None:
        """Broadcast ``buffer`` from the trainer to every replica (in place on the replicas)."""
        self.group.broadcast([buffer], dist.BroadcastOptions()).wait()
        if buffer.is_cuda:
            torch.cuda.synchronize(buffer.device)


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
