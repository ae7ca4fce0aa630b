"""The rollout engine of ``vllm_mode: server``: ``grpo serve`` replicas reached by address.

Same contract as the colocated engines (``base.RolloutEngine``: token ids in, completions with
sampling logprobs out, ``sync_weights`` after each update), so the trainer does not know where
generation runs.

- Generate: a call's prompts are cut into contiguous shares, one per replica, sent at once; each
  share's seed is the one the colocated engine would give its first prompt (``seed + start *
  n``), so with one replica (or a batch-independent engine) the samples equal colocate mode's.
- Weight sync: the export streams to every replica in buckets of ``bucket_mb``
  (``weight_channel.send_stream``), never one buffer of the whole model; then every replica
  must answer with the version just sent; every generate reply carries the version too, and a
  mismatch (a server restarted, or fed by someone else) ends the run.
- Failure: every request has a timeout (``timeout_s``); every collective of a sync has
  ``sync_timeout_s``, and so has each replica's answer after the last bucket. A replica that
  refuses connections, answers with an error, dies or stalls mid-sync, or does not answer in
  time raises ``EngineDied`` naming it (a failed sync asks every replica's ``/health`` to find
  which): the trainer saves its last step and ends with that one line.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import asdict, replace
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

from grpo_train.rollout.base import (
    Completion,
    EngineDied,
    GroupDone,
    SamplingConfig,
    check_prompts,
    report_groups,
)
from grpo_train.rollout.server_address import parse_server_urls  # noqa: F401  (re-exported)

if TYPE_CHECKING:
    import torch

    from grpo_train.rollout.weight_channel import StreamStats, WeightGroup

logger = logging.getLogger(__name__)


def shard_starts(count: int, parts: int) -> list[tuple[int, int]]:
    """Contiguous ``[start, end)`` shares of ``count`` items over ``parts`` (first ones larger).

    >>> shard_starts(5, 2), shard_starts(1, 3)
    ([(0, 3), (3, 5)], [(0, 1)])
    """
    size, extra = divmod(count, parts)
    bounds, start = [], 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        if end > start:
            bounds.append((start, end))
        start = end
    return bounds


class ServerEngine:
    """A rollout engine whose generation runs in ``grpo serve`` replicas (module doc)."""

    name = "vllm-server"

    def __init__(
        self,
        urls: Sequence[str],
        *,
        timeout_s: float = 600.0,
        sync_address: str = "",
        sync_backend: str = "auto",
        is_main: bool = True,
        sync_timeout_s: float = 120.0,
        bucket_mb: float = 256.0,
    ) -> None:
        """Connect to the replicas at ``urls`` and check that they answer.

        Args:
            urls: base URLs of the replicas (``parse_server_urls``).
            timeout_s: the longest any request (a step's generation, a weight load) may take.
            sync_address: ``host`` or ``host:port`` the replicas reach this trainer at for the
                weight broadcast; empty: the address on the route to the first replica, a free
                port.
            sync_backend: ``nccl``, ``gloo`` or ``auto`` (nccl when this process has CUDA).
            is_main: the trainer rank that sends the weights (others only generate).
            sync_timeout_s: the longest one collective of a weight sync may take, and a
                replica's answer after the last bucket: a replica that died or stalls
                mid-sync ends the sync with ``EngineDied`` naming it within this time.
            bucket_mb: the largest buffer a sync packs (MiB; ``weight_channel.send_stream``).
        """
        from grpo_train.rollout.weight_channel import bucket_bytes_for

        if not sync_timeout_s > 0:
            raise ValueError(f"sync_timeout_s: {sync_timeout_s}; must be > 0 (seconds, e.g. 120)")
        self.bucket_bytes = bucket_bytes_for(bucket_mb)
        self.sync_timeout_s = sync_timeout_s
        self.urls = list(urls)
        self.timeout_s = timeout_s
        self.is_main = is_main
        self.wants_weights = is_main  # the other trainer ranks only take part in the export
        self.version = 0
        self.last_sync_seconds = 0.0
        self.last_sync_bytes = 0
        self.last_sync_stats: StreamStats | None = None
        self._sync_address = sync_address
        self._sync_backend = sync_backend
        self._group: WeightGroup | None = None
        self._pool = ThreadPoolExecutor(max_workers=len(self.urls), thread_name_prefix="serve")
        connect_s = min(30.0, timeout_s)
        infos = [self._request(url, "/health", None, "connect", connect_s) for url in urls]
        first = infos[0]
        for url, info in zip(self.urls, infos):
            for key in ("vocab_size", "dtype", "max_model_len"):
                if info[key] != first[key]:
                    raise ValueError(
                        f"replicas differ: {url} has {key}={info[key]}, "
                        f"{self.urls[0]} has {first[key]}; start them with the same options"
                    )
        self.vocab_size = int(first["vocab_size"])
        self.max_model_len = int(first["max_model_len"])
        self.dtype_name = str(first["dtype"])
        self._busy_s = [float(i["busy_s"]) for i in infos]
        logger.info("connected to %d generation server(s): %s", len(urls), ", ".join(urls))

    # ------------------------------------------------------------------ requests

    def _request(
        self,
        url: str,
        path: str,
        body: Mapping[str, Any] | None,
        what: str,
        timeout_s: float | None = None,
    ) -> dict[str, Any]:
        """One HTTP request with a timeout; any failure is ``EngineDied`` naming the server."""
        timeout = self.timeout_s if timeout_s is None else timeout_s
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            url + path, data=data, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as reply:
                return dict(json.loads(reply.read()))
        except urllib.error.HTTPError as err:
            detail = err.read().decode(errors="replace")
            with contextlib.suppress(ValueError):
                detail = json.loads(detail).get("error", detail)
            raise EngineDied(
                f"the server {url} answered {path} with {err.code}: {detail}", what
            ) from None
        except TimeoutError:
            raise EngineDied(
                f"the server {url} did not answer {path} within {timeout:g} s "
                "(stalled or overloaded; raise vllm_server_timeout_s for slow steps)",
                what,
            ) from None
        except (urllib.error.URLError, ConnectionError, OSError) as err:
            reason = getattr(err, "reason", err)
            raise EngineDied(f"the server {url} is unreachable ({reason})", what) from None

    def _check_version(self, url: str, reply: Mapping[str, Any], what: str) -> None:
        """Raise ``EngineDied`` unless the replica serves the weights this trainer sent last."""
        if int(reply["version"]) != self.version:
            raise EngineDied(
                f"the server {url} serves weights version {reply['version']}, the trainer sent "
                f"version {self.version} (was it restarted, or does another trainer use it?)",
                what,
            )

    # ------------------------------------------------------------------ the engine contract

    def generate(
        self,
        prompt_token_ids: Sequence[Sequence[int]],
        sampling: SamplingConfig,
        on_done: GroupDone | None = None,
    ) -> list[list[Completion]]:
        """Sample on the replicas, each a contiguous share of the prompts (module doc).

        ``on_done`` hears of a share's groups as soon as its replica answers (on this thread);
        the first share to fail raises.
        """
        prompts = check_prompts(
            prompt_token_ids, self.vocab_size, self.max_model_len - sampling.max_new_tokens
        )
        shares = shard_starts(len(prompts), len(self.urls))

        def share(url: str, start: int, end: int) -> list[list[Completion]]:
            seed = None if sampling.seed is None else sampling.seed + start * sampling.n
            fields = asdict(replace(sampling, seed=seed))
            body = {"prompts": prompts[start:end], "sampling": fields}
            reply = self._request(url, "/generate", body, "generate")
            self._check_version(url, reply, "generate")
            return [
                [
                    Completion(
                        prompt_index=start + i,
                        text=str(c["text"]),
                        token_ids=tuple(int(t) for t in c["token_ids"]),
                        logprobs=tuple(float(x) for x in c["logprobs"]),
                        finish_reason="stop" if c["finish_reason"] == "stop" else "length",
                    )
                    for c in group
                ]
                for i, group in enumerate(reply["completions"])
            ]

        pending = {
            self._pool.submit(share, url, start, end): start
            for url, (start, end) in zip(self.urls, shares)
        }
        results: list[list[Completion]] = [[] for _ in prompts]
        for future in as_completed(pending):
            start = pending[future]
            groups = future.result()
            results[start : start + len(groups)] = groups
            report_groups(groups, on_done, first=start)
        return results

    def shares_weights(self, model: torch.nn.Module) -> bool:
        """Return False: the servers hold their own copies."""
        return False

    def sync_weights(self, state: Mapping[str, torch.Tensor]) -> None:
        """Send ``state`` to every replica (``sync_weight_stream`` of its items)."""
        self.sync_weight_stream(state.items())

    def sync_weight_stream(self, tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Stream ``tensors`` to every replica in buckets; check the version they load.

        Only the main trainer rank sends; the others (``is_main=False``) consume ``tensors``
        (a sharded export's gathers are collectives of every trainer rank) and count the version,
        after the trainer's ranks have synchronised (the caller's barrier).
        """
        start = time.perf_counter()
        self.version += 1
        stream = iter(tensors)
        try:
            if self.is_main:
                self._send(stream)
        finally:
            # A failed send leaves the export half consumed: the other trainer ranks are in its
            # gathers, which need this rank too. Then no rank generates before the replicas
            # hold the new weights.
            for _ in stream:
                pass
            _trainer_barrier()
        self.last_sync_seconds = time.perf_counter() - start

    def _send(self, tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Stream ``tensors`` to the replicas (the main rank's part of ``sync_weight_stream``)."""
        from grpo_train.rollout.weight_channel import DTYPES, send_stream

        group = self._open_group() if self._group is None else self._group
        body = {"version": self.version, "dtype": self.dtype_name}
        pending = [
            self._pool.submit(self._request, url, "/weights/update", body, "weight sync")
            for url in self.urls
        ]
        try:
            stats = send_stream(group, tensors, DTYPES[self.dtype_name], self.bucket_bytes)
        except RuntimeError as err:  # gloo/NCCL: a peer died or the group timed out
            self._group = None  # a failed collective leaves the group unusable
            raise EngineDied(self._failed_replica(pending, err), "weight sync") from None
        for url, future in zip(self.urls, pending):
            try:
                reply = future.result(timeout=self.sync_timeout_s)
            except FutureTimeout:
                raise EngineDied(
                    f"the server {url} did not confirm the weights within "
                    f"{self.sync_timeout_s:g} s of the last bucket (vllm_sync_timeout_s)",
                    "weight sync",
                ) from None
            self._check_version(url, reply, "weight sync")
        self.last_sync_bytes = stats.bytes
        self.last_sync_stats = stats

    def _failed_replica(self, pending: Sequence[Future[dict[str, Any]]], err: Exception) -> str:
        """Name the replica behind a failed weight broadcast (one line for ``EngineDied``).

        The collective's own error names no peer. A replica that died has its request fail
        (the connection closes) or does not answer ``/health``; one that stalls does not
        answer ``/health`` in time either.
        """
        probe_s = min(5.0, self.sync_timeout_s)
        loaded: dict[str, int] = {}
        for url in self.urls:  # a dead or stalled replica first: the others fail because of it
            try:
                info = self._request(url, "/health", None, "weight sync", probe_s)
            except EngineDied as died:
                return f"{died.cause}; the weight broadcast failed ({_first_line(err)})"
            loaded[url] = int(info.get("sync_loaded", 0))
        if len(set(loaded.values())) > 1:  # one replica's loader stopped taking tensors
            url = min(loaded, key=loaded.__getitem__)
            return (
                f"the server {url} stopped loading weights after {loaded[url]} tensors (the "
                f"others took {max(loaded.values())}) and the weight broadcast failed "
                f"({_first_line(err)}) after vllm_sync_timeout_s={self.sync_timeout_s:g}"
            )
        for future in pending:
            with contextlib.suppress(FutureTimeout):
                failure = future.exception(timeout=2.0)
                if isinstance(failure, EngineDied):
                    return failure.cause
        return (
            f"the weight broadcast to {', '.join(self.urls)} failed ({_first_line(err)}) "
            f"within vllm_sync_timeout_s={self.sync_timeout_s:g}"
        )

    def _open_group(self) -> WeightGroup:
        """Host the weight group's store and have every replica join it (ranks 1..D)."""
        import torch

        from grpo_train.rollout.weight_channel import (
            GroupAddress,
            WeightGroup,
            free_port,
            local_address_towards,
        )

        first = urlsplit(self.urls[0])
        host, _, port = self._sync_address.partition(":")
        if not host:
            host = local_address_towards(first.hostname or "127.0.0.1", first.port or 80)
        address = GroupAddress(
            host=host,
            port=int(port) if port else free_port(),
            world_size=len(self.urls) + 1,
            backend=(
                self._sync_backend
                if self._sync_backend != "auto"
                else ("nccl" if torch.cuda.is_available() else "gloo")
            ),
            timeout_s=self.sync_timeout_s,
        )
        joins = [
            self._pool.submit(
                self._request,
                url,
                "/weights/open",
                {"address": address.to_json(), "rank": rank},
                "weight sync",
            )
            for rank, url in enumerate(self.urls, start=1)
        ]
        try:
            group = WeightGroup(address, 0)
        except RuntimeError as err:
            failed = [f.exception() for f in joins if f.done() and f.exception()]
            cause = str(failed[0]) if failed else f"the weight group did not form ({err})"
            raise EngineDied(cause, "weight sync") from None
        for future in joins:
            future.result()
        self._group = group
        return group

    def sync_metrics(self) -> dict[str, float]:
        """Return the latest sync's size, duration and version, for the step's metrics."""
        return {
            "sync/bytes": float(self.last_sync_bytes),
            "sync/seconds": self.last_sync_seconds,
            "sync/version": float(self.version),
        }

    def sleep(self, level: Literal[1, 2] = 1) -> bool:
        """Return False: the servers' memory is theirs."""
        return False

    def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """Do nothing."""

    def close(self) -> None:
        """Leave the replicas running for the next trainer: close the weight group only."""
        if self._group is not None and self.is_main:
            for url in self.urls:
                with contextlib.suppress(EngineDied):  # a dead server has nothing to close
                    self._request(url, "/weights/close", {}, "close", timeout_s=10.0)
        self._group = None
        self._pool.shutdown(wait=False, cancel_futures=True)


def _first_line(err: Exception) -> str:
    r"""Return the first line of an error's message (gloo's carry C++ stack traces below it).

    >>> _first_line(RuntimeError("Connection closed by peer\nException raised from ..."))
    'Connection closed by peer'
    """
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def _trainer_barrier() -> None:
    """Wait for every trainer rank (a no-op in a single process)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()
