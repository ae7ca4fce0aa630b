"""Small HTTP services on loopback that the remote-sandbox tests control.

``FakeService`` serves a handler function in threads (``http.server``), counting requests and
the most in flight at once. Handlers: ``grpo_handler`` (a local ``Sandbox`` behind
``sandbox.wire``: the real verdict path), ``fusion_handler`` (SandboxFusion's ``/run_code``
answered by a local ``Sandbox``), ``recorded_fusion_handler`` (recorded responses).
``silent_listener`` accepts connections and never answers; ``FUSION_SERVER_SCRIPT`` runs a
SandboxFusion-like service in a subprocess that a test can kill.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from sandbox import Sandbox, Status, fusion, wire

FUSION_DATA = Path(__file__).parent / "sandbox" / "data" / "fusion"


@dataclass(frozen=True)
class Reply:
    """What a fake service answers: status, JSON body (or raw bytes), headers."""

    status: int = 200
    body: object = None
    headers: Mapping[str, str] = field(default_factory=dict)
    raw: bytes | None = None


Handler = Callable[[str, object, Mapping[str, str]], Reply]


class FakeService:
    """A threaded HTTP service on 127.0.0.1; ``handler(path, json, headers)`` answers each POST."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.requests: list[tuple[str, object]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        service = self

        class _Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                payload = json.loads(self.rfile.read(length) or b"null")
                with service._lock:
                    service.requests.append((self.path, payload))
                    service.in_flight += 1
                    service.max_in_flight = max(service.max_in_flight, service.in_flight)
                try:
                    reply = service.handler(self.path, payload, dict(self.headers))
                finally:
                    with service._lock:
                        service.in_flight -= 1
                data = reply.raw if reply.raw is not None else json.dumps(reply.body).encode()
                self.send_response(reply.status)
                for key, value in reply.headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.server.daemon_threads = True
        self.server.request_queue_size = 256
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop serving (requests in flight finish in their daemon threads)."""
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> FakeService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def grpo_handler(box: Sandbox, delay_s: float = 0.0) -> Handler:
    """``grpo sandbox serve``'s batch endpoints, answered by ``box`` (the real verdict path)."""

    def handle(path: str, payload: object, headers: Mapping[str, str]) -> Reply:
        time.sleep(delay_s)
        try:
            if path == wire.RUN_TESTS_PATH:
                report = box.run_tests_many([wire.decode_job(payload)])[0]
                return Reply(
                    body={"version": wire.WIRE_VERSION, "report": wire.encode_report(report)}
                )
            if path == wire.RUN_PATH:
                job = wire.decode_run(payload)
                result = box.run(job.code, job.stdin, job.files, job.limits)
                body = {"version": wire.WIRE_VERSION, "result": wire.encode_exec_result(result)}
                return Reply(body=body)
        except (wire.WireError, TypeError, ValueError) as exc:
            return Reply(400, {"detail": str(exc)})
        return Reply(404, {"detail": f"no endpoint {path}"})

    return handle


def fusion_response_of(box: Sandbox, request: fusion.RunCodeRequest) -> fusion.RunCodeResponse:
    """What a SandboxFusion would answer for ``request``, run by ``box`` (its languages)."""
    from sandbox import Limits

    limits = Limits(timeout_s=request.run_timeout, memory_mb=max(request.memory_limit_MB, 64))
    res = box.run(
        request.code,
        request.stdin or "",
        None,
        limits,
        language=request.language,
        compile_timeout_s=request.compile_timeout,
    )
    if res.status is Status.SANDBOX_ERROR:
        return fusion.RunCodeResponse(fusion.RunStatus.SANDBOX_ERROR, res.detail)
    compiled = None
    if res.compile is not None:
        compile_timed_out = res.compile.status is Status.TIMEOUT
        compiled = fusion.CommandRunResult(
            status=fusion.CommandStatus.TIME_LIMIT_EXCEEDED
            if compile_timed_out
            else fusion.CommandStatus.FINISHED,
            execution_time=res.compile.wall_s,
            return_code=None
            if compile_timed_out
            else (0 if res.compile.status is Status.OK else 1),
            stdout=res.compile.stdout,
            stderr=res.compile.stderr,
        )
    if res.status is Status.COMPILE_ERROR:
        return fusion.RunCodeResponse(fusion.RunStatus.FAILED, "", compiled, None)
    timed_out = res.status is Status.TIMEOUT
    command = fusion.CommandRunResult(
        status=fusion.CommandStatus.TIME_LIMIT_EXCEEDED
        if timed_out
        else fusion.CommandStatus.FINISHED,
        execution_time=res.wall_s,
        return_code=None if timed_out else (res.exit_code if res.exit_code is not None else 1),
        stdout=res.stdout,
        stderr=res.stderr,
    )
    ok = command.status is fusion.CommandStatus.FINISHED and command.return_code == 0
    status = fusion.RunStatus.SUCCESS if ok else fusion.RunStatus.FAILED
    return fusion.RunCodeResponse(status, "", compiled, command)


def fusion_handler(box: Sandbox) -> Handler:
    """SandboxFusion's ``/run_code``, run by ``box``."""

    def handle(path: str, payload: object, headers: Mapping[str, str]) -> Reply:
        if path != wire.RUN_CODE_PATH:
            return Reply(404, {"detail": "Not Found"})
        request = fusion.decode_run_code_request(payload)
        return Reply(body=fusion.encode_run_code_response(fusion_response_of(box, request)))

    return handle


def recorded(name: str) -> dict[str, object]:
    """A recorded SandboxFusion response (tests/sandbox/data/fusion/NAME.json)."""
    return json.loads((FUSION_DATA / f"{name}.json").read_text())


def recorded_fusion_handler() -> Handler:
    """``/run_code`` answering the recording named by the program's first line (``# NAME``)."""

    def handle(path: str, payload: object, headers: Mapping[str, str]) -> Reply:
        request = fusion.decode_run_code_request(payload)
        name = request.code.splitlines()[0].lstrip("# ").strip()
        return Reply(body=recorded(name))

    return handle


@contextmanager
def silent_listener() -> Iterator[str]:
    """A URL whose port accepts TCP connections (the kernel's backlog) and never answers."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(512)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


def dead_url() -> str:
    """A loopback URL where nothing listens (connections are refused)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return f"http://127.0.0.1:{port}"


#: A SandboxFusion-like service for a subprocess (``python -c``; argv: port file, delay): every
#: ``/run_code`` is answered ``Success`` with stdout "ok\n" after ``delay`` seconds.
FUSION_SERVER_SCRIPT = r"""
import json, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a):
        pass
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        time.sleep(float(sys.argv[2]))
        body = json.dumps({"status": "Success", "message": "", "compile_result": None,
            "run_result": {"status": "Finished", "execution_time": 0.01, "return_code": 0,
            "stdout": "ok\n", "stderr": ""}, "executor_pod_name": None, "files": {}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

server = ThreadingHTTPServer(("127.0.0.1", 0), H)
server.daemon_threads = True
open(sys.argv[1], "w").write(str(server.server_address[1]))
server.serve_forever()
"""
