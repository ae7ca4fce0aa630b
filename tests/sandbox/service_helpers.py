"""The sandbox service for tests: served for real on loopback, and a Sandbox-like client of it."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import httpx
import sandbox_helpers  # noqa: F401  (imports the real package first)
import uvicorn

from sandbox import CallTest, ExecResult, IOTest, Job, Limits, Sandbox, TestJob, TestReport, wire
from sandbox.service import ServiceSettings, build_app
from sandbox.service_cli import bind, url_of


@contextmanager
def running_service(settings: ServiceSettings, box: Sandbox) -> Iterator[str]:
    """Serve ``box`` with uvicorn in a thread on a free loopback port; yield its URL."""
    sock = bind("127.0.0.1", 0)
    config = uvicorn.Config(build_app(settings, box), log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the service did not start"
        time.sleep(0.01)
    try:
        yield url_of(sock)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


def health(url: str) -> dict[str, object]:
    """The service's ``/health`` object."""
    reply = httpx.get(f"{url}{wire.HEALTH_PATH}", timeout=10)
    assert reply.status_code == 200, reply.text
    data = reply.json()
    assert isinstance(data, dict)
    return data


class ServiceSandbox:
    """``Sandbox``'s run and test methods, each a request to the service (as a remote caller).

    What the attack tests read besides (``isolation``, ``uids``, the slot servers) is the local
    Sandbox's that serves the requests. A request the service refuses with 400 raises
    ``ValueError``, as the local call does for invalid arguments.
    """

    def __init__(self, url: str, local: Sandbox, token: str | None = None) -> None:
        self.url = url
        self.local = local
        self.isolation = local.isolation
        self.uids = local.uids
        self.limits = local.limits
        self._all = local._all  # type: ignore[attr-defined]  (sandbox_helpers.server_pids)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._client = httpx.Client(headers=headers, timeout=600)

    def _post(self, path: str, body: dict[str, object]) -> dict[str, object]:
        reply = self._client.post(f"{self.url}{path}", json=body)
        if reply.status_code == 400:
            raise ValueError(reply.json()["detail"])
        assert reply.status_code == 200, (reply.status_code, reply.text)
        data = reply.json()
        assert data["version"] == wire.WIRE_VERSION
        return data

    def run(
        self,
        code: str,
        stdin: str = "",
        files: dict[str, str] | None = None,
        limits: Limits | None = None,
        *,
        language: str = "python",
        compile_timeout_s: float | None = None,
    ) -> ExecResult:
        job = Job(code, stdin, files, limits, language, compile_timeout_s)
        data = self._post(wire.RUN_PATH, wire.encode_run(job))
        return wire.decode_exec_result(data["result"])

    def run_many(self, jobs: Sequence[str | Job]) -> list[ExecResult]:
        def one(job: str | Job) -> ExecResult:
            job = Job(job) if isinstance(job, str) else job
            data = self._post(wire.RUN_PATH, wire.encode_run(job))
            return wire.decode_exec_result(data["result"])

        with ThreadPoolExecutor(max(1, len(jobs))) as pool:
            return list(pool.map(one, jobs))

    def run_tests_many(self, jobs: Sequence[TestJob]) -> list[TestReport]:
        def one(job: TestJob) -> TestReport:
            data = self._post(wire.RUN_TESTS_PATH, wire.encode_job(job))
            return wire.decode_report(data["report"])

        with ThreadPoolExecutor(max(1, len(jobs))) as pool:
            return list(pool.map(one, jobs))

    def run_tests(
        self,
        program: str,
        tests: Sequence[CallTest] | Sequence[IOTest],
        **options: object,
    ) -> TestReport:
        job = TestJob(program, tuple(tests), **options)  # type: ignore[arg-type]
        return self.run_tests_many([job])[0]

    def close(self) -> None:
        self._client.close()
