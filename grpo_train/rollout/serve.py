"""``grpo serve``: the generation side of a run, on GPUs or machines of its own.

::

    grpo serve --model Qwen/Qwen2.5-7B-Instruct --tensor_parallel_size 2 --data_parallel_size 4

starts ``data_parallel_size`` replicas on ports ``port``, ``port + 1``...; each is a vLLM engine
(``VLLMEngine``: ``vllm.LLM`` with grpo-kit's worker extension, ``tensor_parallel_size`` GPUs
each) behind a small HTTP API. ``grpo train --vllm_mode server --vllm_server_urls
http://gen1:8000,http://gen1:8001,...`` connects to them; several replicas share a step's prompts.

Why our own server around ``vllm.LLM`` rather than ``vllm serve`` (vLLM's OpenAI server, which
TRL's ``trl vllm-serve`` now runs): the weight-transfer backends of vLLM's server (vLLM 0.32:
NCCL, CUDA IPC and their variants) all need CUDA, so a CPU machine could not run, test or
check a sync; its completions API speaks text and per-token top-logprob dictionaries, where
the trainer's engine contract is token ids and the sampled token's logprob; and this server
runs exactly the colocated engine's generate and reload code, so the two modes sample the same
tokens for the same seeds and prompts (checked by the tests). Weights arrive through one
process group (``weight_channel``: gloo on CPU, NCCL on GPU), streamed in bounded buckets that
the engine loads as they come, and every sync bumps a version number that every reply
carries, so the trainer can tell that the engine serves what it sent.

Endpoints (JSON bodies): ``GET /health``; ``POST /generate`` (token ids in, completions with
sampling logprobs out); ``POST /weights/open`` (join the trainer's weight group),
``POST /weights/update`` (receive the bucket stream, load it, take the version),
``POST /weights/close``. Requests run one at a time on the engine (a lock): the engine batches
inside one call, and a generate during a weight load would mix two policies.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Sequence

    import torch

    from grpo_train.rollout.base import Completion, SamplingConfig
    from grpo_train.rollout.weight_channel import WeightGroup

logger = logging.getLogger("grpo_train.rollout.serve")


class ReplicaEngine(Protocol):
    """What a replica serves with (``VLLMEngine``): generate, and load a weight stream."""

    dtype: torch.dtype
    vocab_size: int
    max_model_len: int

    def generate(
        self, prompt_token_ids: Sequence[Sequence[int]], sampling: SamplingConfig
    ) -> list[list[Completion]]:
        """Sample completions (``RolloutEngine.generate``)."""
        ...

    def sync_weight_stream(self, tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load (name, tensor) pairs as they arrive."""
        ...


@dataclass
class ReplicaState:
    """What one replica knows between requests."""

    engine: ReplicaEngine
    model: str
    version: int = 0
    """Weights version: 0 is the model it started with; each sync sets the trainer's number."""
    group: WeightGroup | None = None
    busy_s: float = 0.0
    """Seconds spent generating or loading weights since start (the trainer reads idle time)."""
    started: float = field(default_factory=time.monotonic)
    sync_loaded: int = 0
    """Tensors handed to the engine in the current (or last) sync: tells a stalled replica."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def info(self) -> dict[str, Any]:
        """Return the ``/health`` reply."""
        from grpo_train.rollout.weight_channel import dtype_name

        return {
            "version": self.version,
            "model": self.model,
            "dtype": dtype_name(self.engine.dtype),
            "vocab_size": self.engine.vocab_size,
            "max_model_len": self.engine.max_model_len,
            "busy_s": self.busy_s,
            "sync_loaded": self.sync_loaded,
            "uptime_s": time.monotonic() - self.started,
        }

    def generate(self, body: dict[str, Any]) -> dict[str, Any]:
        """``/generate``: sample with the engine's current weights; reply with their version."""
        from grpo_train.rollout.base import SamplingConfig

        sampling = SamplingConfig(**body["sampling"])
        with self.lock:
            start = time.perf_counter()
            groups = self.engine.generate(body["prompts"], sampling)
            self.busy_s += time.perf_counter() - start
            version = self.version
        completions = [
            [
                {
                    "text": c.text,
                    "token_ids": list(c.token_ids),
                    "logprobs": list(c.logprobs),
                    "finish_reason": c.finish_reason,
                }
                for c in group
            ]
            for group in groups
        ]
        return {"version": version, "completions": completions}

    def open_group(self, body: dict[str, Any]) -> dict[str, Any]:
        """``/weights/open``: join the trainer's weight group as ``rank`` (replaces an old one)."""
        from grpo_train.rollout.weight_channel import GroupAddress, WeightGroup

        address = GroupAddress.from_json(body["address"])
        # Blocks until every member joined; the trainer joins after sending this request.
        group = WeightGroup(address, int(body["rank"]))
        with self.lock:
            self.group = group
        return {"version": self.version}

    def update(self, body: dict[str, Any]) -> dict[str, Any]:
        """``/weights/update``: load the trainer's bucket stream as it arrives; take its version.

        The engine's loader takes the received tensors one bucket at a time
        (``weight_channel.receive_stream``); whatever it leaves (it failed part way) is still
        received, so the trainer's broadcasts end and it gets this replica's error, not a timeout.
        """
        from grpo_train.rollout.weight_channel import DTYPES, drain, receive_stream

        dtype = DTYPES[body["dtype"]]
        with self.lock:
            if self.group is None:
                raise RuntimeError("no weight group is open; the trainer opens one first")
            start = time.perf_counter()
            self.sync_loaded = 0
            stream = self._counted(receive_stream(self.group, dtype))
            try:
                self.engine.sync_weight_stream(stream)
            except Exception:
                with contextlib.suppress(RuntimeError):  # the stream itself failed: nothing left
                    drain(stream)
                raise
            drain(stream)
            self.version = int(body["version"])
            self.busy_s += time.perf_counter() - start
        return {"version": self.version}

    def _counted(
        self, stream: Iterator[tuple[str, torch.Tensor]]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """Pass ``stream`` on, counting in ``sync_loaded`` what the engine took."""
        for pair in stream:
            yield pair
            self.sync_loaded += 1

    def close_group(self, body: dict[str, Any]) -> dict[str, Any]:
        """``/weights/close``: forget the trainer's group (a new trainer may open another)."""
        with self.lock:
            self.group = None
        return {"version": self.version}


def _handler(state: ReplicaState) -> type[BaseHTTPRequestHandler]:
    """Return the request handler class bound to one replica's state."""
    routes = {
        "/generate": state.generate,
        "/weights/open": state.open_group,
        "/weights/update": state.update,
        "/weights/close": state.close_group,
    }

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/health":
                self._reply(200, state.info())
            else:
                self._reply(404, {"error": f"no such endpoint {self.path}"})

        def do_POST(self) -> None:
            route = routes.get(self.path)
            if route is None:
                self._reply(404, {"error": f"no such endpoint {self.path}"})
                return
            try:
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                self._reply(200, route(body))
            except Exception as err:  # the trainer gets the reason, the server keeps serving
                logger.exception("%s failed", self.path)
                self._reply(500, {"error": f"{type(err).__name__}: {err}"})

        def _reply(self, code: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            logger.debug(format, *args)

    return Handler


def serve_replica(args: argparse.Namespace) -> int:
    """Start one engine and answer requests until SIGTERM / Ctrl-C."""
    from grpo_train.rollout.base import EngineDied
    from grpo_train.rollout.vllm_engine import VLLMEngine

    extra: dict[str, Any] = {}
    if args.tensor_parallel_size > 1:
        extra["tensor_parallel_size"] = args.tensor_parallel_size
        problem = _bind_cpu_workers(args.tensor_parallel_size)
        if problem:
            print(f"grpo serve: error: {problem}", file=sys.stderr)
            return 2
    try:
        engine = VLLMEngine(
            args.model,
            dtype=args.dtype,
            seed=args.seed,
            max_model_len=args.max_model_len,
            gpu_memory_utilization=args.gpu_memory_utilization,
            cpu_kv_cache_gib=args.cpu_kv_cache_gib,
            in_process=args.in_process,
            sync_bucket_mb=args.sync_bucket_mb,
            sync_timeout_s=args.sync_timeout_s,
            **extra,
        )
    except EngineDied as died:
        print(f"grpo serve: error: replica on port {args.port}: {died}", file=sys.stderr)
        return 1
    state = ReplicaState(engine, args.model)
    server = ThreadingHTTPServer((args.host, args.port), _handler(state))
    server.daemon_threads = True

    def stop(signum: int, frame: object) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"grpo serve: {args.model} ready at http://{args.host}:{args.port}", flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
        engine.close()
    print(f"grpo serve: replica on port {args.port} stopped", flush=True)
    return 0


#: vLLM's CPU build binds each worker's OpenMP threads to the cores this names, "|" between
#: workers (``"0-3|4-7"``); ``"auto"`` (vLLM's default) takes one NUMA node per worker.
CPU_BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"


def cpu_bind_lists(cpus: list[int], workers: int) -> str:
    """``VLLM_CPU_OMP_THREADS_BIND`` giving ``workers`` workers consecutive shares of ``cpus``.

    The first ``len(cpus) % workers`` workers get one core more; each needs one at least.

    >>> cpu_bind_lists([0, 1], 2)
    '0|1'
    >>> cpu_bind_lists([0, 1, 2, 3, 4], 2)
    '0,1,2|3,4'
    >>> cpu_bind_lists([0], 2)
    Traceback (most recent call last):
    ValueError: 2 tensor-parallel workers need 2 cores, 1 allowed
    """
    if len(cpus) < workers:
        raise ValueError(
            f"{workers} tensor-parallel workers need {workers} cores, {len(cpus)} allowed"
        )
    share, extra = divmod(len(cpus), workers)
    lists, start = [], 0
    for worker in range(workers):
        end = start + share + (worker < extra)
        lists.append(",".join(str(c) for c in cpus[start:end]))
        start = end
    return "|".join(lists)


def _bind_cpu_workers(workers: int) -> str | None:
    """On CPU, give ``workers`` tensor-parallel workers cores of their own; a fix-it line if not.

    vLLM's CPU build binds each worker's OpenMP threads to a NUMA node of its own unless told
    which cores to use, and refuses to start with fewer NUMA nodes than workers (vLLM 0.32,
    ``utils/ompmultiprocessing.py``: "Not enough allowed NUMA nodes to bind threads of 2 local
    CPUWorkers"), which is any one-socket machine. There, the allowed cores are split among the
    workers. A binding the user set is kept; GPU engines are untouched.
    """
    import torch

    if torch.cuda.is_available() or os.environ.get(CPU_BIND_ENV, "auto") != "auto":
        return None
    nodes = list(Path("/sys/devices/system/node").glob("node[0-9]*"))
    if len(nodes) >= workers:
        return None  # vLLM's own NUMA-local binding works
    cpus = sorted(os.sched_getaffinity(0))
    try:
        os.environ[CPU_BIND_ENV] = cpu_bind_lists(cpus, workers)
    except ValueError as err:
        return (
            f"--tensor_parallel_size {workers} on CPU: {err}; use --tensor_parallel_size "
            f"{len(cpus)} or less (or name each worker's cores in {CPU_BIND_ENV})"
        )
    logger.info("%s=%s (%d NUMA nodes)", CPU_BIND_ENV, os.environ[CPU_BIND_ENV], len(nodes))
    return None


def serve_replicas(args: argparse.Namespace, argv: list[str]) -> int:
    """Start ``data_parallel_size`` replica processes; stop all of them when one ends."""
    children: list[subprocess.Popen[bytes]] = []
    stopping: list[int] = []

    def forward(signum: int, frame: object) -> None:
        stopping.append(signum)
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    # Installed before the first replica starts: a signal while replicas start reaches them too.
    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    gpus = _gpu_slices(args.data_parallel_size, args.tensor_parallel_size)
    for i in range(args.data_parallel_size):
        if stopping:
            break
        env = dict(os.environ)
        if gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = gpus[i]
        command = [sys.executable, "-m", "grpo_train.rollout.serve", *argv]
        command += ["--data_parallel_size", "1", "--port", str(args.port + i)]
        # A session each: when a replica is killed (SIGKILL, the OOM killer) its vLLM engine
        # processes live on as orphans; its process group still names them, to end them.
        children.append(subprocess.Popen(command, env=env, start_new_session=True))
        # One replica at a time: a vLLM engine picks free ports for its own processes while it
        # starts, and two engines starting at once on one machine can pick the same one.
        if not _ready(children[-1], f"http://{args.host}:{args.port + i}"):
            break
    urls = ",".join(f"http://{args.host}:{args.port + i}" for i in range(len(children)))
    print(f"grpo serve: {len(children)} replicas; trainer: --vllm_server_urls {urls}", flush=True)

    code = 0
    segments: set[str] = set()
    last_look = 0.0
    while any(child.poll() is None for child in children):
        if time.monotonic() - last_look > 2.0:
            segments |= _replicas_shm(children)
            last_look = time.monotonic()
        ended = [c for c in children if c.poll() is not None]
        if ended and code == 0 and not stopping:
            code = 1
            print(
                f"grpo serve: a replica ended (exit code {ended[0].returncode}); "
                "stopping the others",
                flush=True,
            )
            forward(signal.SIGTERM, None)
        time.sleep(0.2)
    if code == 0 and not stopping and any(child.returncode != 0 for child in children):
        code = 1  # a replica that failed while starting: the loop above never saw it running
        print("grpo serve: a replica failed to start; the others are stopped", flush=True)
    time.sleep(1.0)  # a replica's own shutdown ends its engine; then leftovers are killed
    for child in children:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, signal.SIGKILL)
    _remove_leftovers(segments)
    return code


def _replicas_shm(children: list[subprocess.Popen[bytes]]) -> set[str]:
    """Return the ``/dev/shm`` segments the replicas' processes (engines included) map now."""
    import psutil

    from grpo_train.rollout.processes import mapped_shm

    names: set[str] = set()
    for child in children:
        with contextlib.suppress(psutil.Error):
            tree = [child.pid] + [p.pid for p in psutil.Process(child.pid).children(recursive=True)]
            for pid in tree:
                names |= mapped_shm(pid)
    return names


def _remove_leftovers(segments: set[str]) -> None:
    """Unlink what a replica killed with SIGKILL (the OOM killer, ``kill -9``) left in RAM.

    vLLM's engine processes share memory through ``/dev/shm`` segments that their own shutdown
    unlinks; a replica killed outright never runs it, and the segments (hundreds of MB) would
    hold RAM until reboot. Every replica has ended here, so nothing maps them any more. The
    weight-sync folders of dead replicas go the same way.
    """
    from grpo_train.rollout.processes import remove_stale_dirs
    from grpo_train.rollout.vllm_engine import SYNC_DIR_PREFIX

    for name in segments:
        with contextlib.suppress(OSError):
            (Path("/dev/shm") / name).unlink()
    with contextlib.suppress(OSError):
        remove_stale_dirs(Path("/dev/shm"), SYNC_DIR_PREFIX)


def _ready(child: subprocess.Popen[bytes], url: str, poll_s: float = 0.5) -> bool:
    """Wait until the replica at ``url`` answers ``/health`` (True) or its process ends (False)."""
    import urllib.error
    import urllib.request

    while child.poll() is None:
        try:
            with urllib.request.urlopen(url + "/health", timeout=5):
                return True
        except (urllib.error.URLError, OSError):
            time.sleep(poll_s)
    return False


def _gpu_slices(replicas: int, per_replica: int) -> list[str] | None:
    """CUDA_VISIBLE_DEVICES for each replica (None without CUDA): consecutive GPUs each."""
    import torch

    if not torch.cuda.is_available():
        return None
    count = torch.cuda.device_count()
    if replicas * per_replica > count:
        raise SystemExit(
            f"grpo serve: {replicas} replicas x {per_replica} GPUs need {replicas * per_replica} "
            f"GPUs; this machine has {count}"
        )
    return [
        ",".join(str(g) for g in range(i * per_replica, (i + 1) * per_replica))
        for i in range(replicas)
    ]


def parser() -> argparse.ArgumentParser:
    """Return the ``grpo serve`` option parser."""
    p = argparse.ArgumentParser(prog="grpo serve", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="HF folder or hub id the engines start from")
    p.add_argument("--tensor_parallel_size", type=int, default=1, help="GPUs (CPU: workers) each")
    p.add_argument("--data_parallel_size", type=int, default=1, help="replicas (one port each)")
    p.add_argument("--host", default="0.0.0.0", help="address to listen on")
    p.add_argument("--port", type=int, default=8000, help="first replica's port")
    p.add_argument("--dtype", default="auto", help="engine weights: auto, float32, bfloat16")
    p.add_argument("--max_model_len", type=int, default=2048, help="prompt + completion tokens")
    p.add_argument("--seed", type=int, default=0, help="sampler seed for unseeded requests")
    p.add_argument("--gpu_memory_utilization", type=float, default=0.9, help="GPU share")
    p.add_argument("--cpu_kv_cache_gib", type=float, default=1.0, help="CPU: KV cache GiB")
    p.add_argument("--in_process", action="store_true", help="CPU: engine core in-process")
    p.add_argument(
        "--sync_bucket_mb", type=float, default=256.0,
        help="weight sync into worker processes (tensor parallel): largest spool file, MiB",
    )  # fmt: skip
    p.add_argument(
        "--sync_timeout_s", type=float, default=120.0,
        help="weight sync into worker processes: longest wait for a bucket, seconds",
    )  # fmt: skip
    p.add_argument("--log_level", default="warning", help="debug, info, warning")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run ``grpo serve``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    for name, value in (("tensor_parallel_size", args.tensor_parallel_size),
                        ("data_parallel_size", args.data_parallel_size)):  # fmt: skip
        if value < 1:
            print(f"grpo serve: --{name} must be >= 1, got {value}", file=sys.stderr)
            return 2
    if args.data_parallel_size > 1:
        return serve_replicas(args, argv)
    return serve_replica(args)


if __name__ == "__main__":
    raise SystemExit(main())
