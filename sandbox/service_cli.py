"""``grpo sandbox serve``: run the sandbox service (``sandbox.service``) with uvicorn.

The token comes from ``--token-file`` or the environment variable ``GRPO_SANDBOX_TOKEN``, never
from the command line, where ``ps`` shows it to every user of the machine. SIGTERM and Ctrl-C
stop it cleanly: the Sandbox is closed at once (a run in flight is answered 503), uvicorn
finishes, and no slot process is left.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import threading
from types import FrameType

from sandbox.core import Sandbox
from sandbox.service import DEFAULT_MAX_LIMITS, ServiceSettings, build_app
from sandbox.types import Limits, SandboxUnavailableError

TOKEN_ENV = "GRPO_SANDBOX_TOKEN"
#: Seconds uvicorn waits for requests in flight once stopping (they end at once: the Sandbox is
#: closed first, and each answers 503).
_SHUTDOWN_GRACE_S = 3


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="grpo sandbox serve",
        description="Serve the sandbox over HTTP: /v1/run_tests, /v1/run, SandboxFusion's "
        "/run_code, /health. Needs a token unless it listens on loopback.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,  # a service's defaults matter
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8080, help="0: a free port (printed)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="runs at once")
    parser.add_argument(
        "--max-queue", type=int, default=64, help="requests waiting beyond the workers (then 429)"
    )
    parser.add_argument("--max-request-mb", type=float, default=16.0, help="largest body, MiB")
    parser.add_argument(
        "--max-timeout-s",
        type=float,
        default=DEFAULT_MAX_LIMITS.timeout_s,
        help="largest time limit a run may ask for (more: 400)",
    )
    parser.add_argument(
        "--max-memory-mb",
        type=int,
        default=DEFAULT_MAX_LIMITS.memory_mb,
        help="largest memory limit a run may ask for (more: 400)",
    )
    parser.add_argument(
        "--max-request-s",
        type=float,
        default=3600.0,
        help="longest a request's runs may take at their limits (a whole test set; more: 400)",
    )
    parser.add_argument(
        "--timeout-s", type=float, default=10.0, help="time limit of runs that give none"
    )
    parser.add_argument(
        "--memory-mb", type=int, default=1024, help="memory limit of runs that give none"
    )
    parser.add_argument(
        "--token-file",
        help=f"file holding the bearer token (else ${TOKEN_ENV}); required off loopback",
    )
    parser.add_argument(
        "--strict", action="store_true", help="refuse to start unless every isolation layer works"
    )
    return parser


def _read_token(path: str | None) -> str | None:
    if path is not None:
        with open(path, encoding="utf-8") as f:
            if os.fstat(f.fileno()).st_mode & 0o077:
                print(
                    f"grpo sandbox serve: warning: other users may read {path} (chmod 600 it)",
                    file=sys.stderr,
                )
            token = f.read().strip()
        if not token:
            raise ValueError(f"the token file {path} is empty")
        return token
    return os.environ.get(TOKEN_ENV) or None


def settings_from_args(args: argparse.Namespace) -> tuple[ServiceSettings, Limits]:
    """Return the service's settings and the default limits of runs, from ``args``."""
    ceiling = Limits(
        timeout_s=args.max_timeout_s,
        memory_mb=args.max_memory_mb,
        output_bytes=DEFAULT_MAX_LIMITS.output_bytes,
        max_processes=DEFAULT_MAX_LIMITS.max_processes,
        max_file_mb=DEFAULT_MAX_LIMITS.max_file_mb,
    )
    settings = ServiceSettings(
        host=args.host,
        port=args.port,
        workers=args.workers,
        max_queue=args.max_queue,
        max_request_bytes=int(args.max_request_mb * (1 << 20)),
        max_limits=ceiling,
        max_request_s=args.max_request_s,
        token=_read_token(args.token_file),
    )
    return settings, Limits(timeout_s=args.timeout_s, memory_mb=args.memory_mb)


def url_of(sock: socket.socket) -> str:
    """Return the ``http://host:port`` a listening socket answers on (IPv6 in brackets)."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def bind(host: str, port: int) -> socket.socket:
    """Listen on ``host:port`` (port 0: a free one) before uvicorn starts; the socket."""
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host.strip("[]"), port))
    sock.listen(1024)
    sock.set_inheritable(True)
    return sock


class _Stop(Exception):
    """SIGTERM arrived after uvicorn gave its handler back."""


def serve(settings: ServiceSettings, default_limits: Limits, *, strict: bool = False) -> int:
    """Start the Sandbox and the server; return when stopped, with everything closed."""
    import uvicorn

    try:
        sock = bind(settings.host, settings.port)
    except OSError as exc:
        print(
            f"grpo sandbox serve: cannot listen on {settings.host}:{settings.port}: {exc}",
            file=sys.stderr,
        )
        return 2
    try:
        sandbox = Sandbox(limits=default_limits, workers=settings.workers, strict=strict)
    except SandboxUnavailableError as exc:
        sock.close()
        print(f"grpo sandbox serve: {exc}", file=sys.stderr)
        return 1
    closer: list[threading.Thread] = []

    def close_sandbox() -> None:
        if not closer:  # in a thread: the signal handler must not wait for the slots
            closer.append(threading.Thread(target=sandbox.close, name="sandbox-close"))
            closer[0].start()

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            close_sandbox()
            super().handle_exit(sig, frame)

    def stop(signum: int, frame: FrameType | None) -> None:
        raise _Stop

    previous = signal.signal(signal.SIGTERM, stop)  # uvicorn re-raises it once it has stopped
    try:
        app = build_app(settings, sandbox)
        config = uvicorn.Config(
            app,
            log_level="warning",
            timeout_graceful_shutdown=_SHUTDOWN_GRACE_S,
            access_log=False,
        )
        print(
            f"grpo sandbox serve: listening on {url_of(sock)} (workers={settings.workers}, "
            f"token {'required' if settings.token else 'not required'}, "
            f"isolation: {', '.join(sandbox.isolation)})",
            flush=True,
        )
        Server(config).run(sockets=[sock])
    except (_Stop, KeyboardInterrupt):
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        close_sandbox()
        closer[0].join()
        sock.close()
        print("grpo sandbox serve: stopped", flush=True)
    return 0


def main(argv: list[str]) -> int:
    """``grpo sandbox serve [options]``."""
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: grpo sandbox serve [options]   (grpo sandbox serve --help)")
        return 0 if argv else 2
    if argv[0] != "serve":
        print(f"grpo sandbox: unknown command {argv[0]!r} (known: serve)", file=sys.stderr)
        return 2
    args = _parser().parse_args(argv[1:])
    try:
        settings, default_limits = settings_from_args(args)
    except (OSError, ValueError) as exc:
        print(f"grpo sandbox serve: {exc}", file=sys.stderr)
        return 2
    return serve(settings, default_limits, strict=args.strict)
