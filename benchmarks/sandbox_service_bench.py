"""What the sandbox service adds per request over loopback: hello world three ways.

Run: ``.venv/bin/python benchmarks/sandbox_service_bench.py [--runs N] [--rounds N]``

One program (``print('hello')``), one at a time, on one Sandbox (one worker):

1. ``Sandbox.run`` in this process (no HTTP);
2. ``POST /v1/run`` (``sandbox.wire``) through ``grpo sandbox serve``'s app, served by uvicorn in
   a thread of this process on 127.0.0.1, with one keep-alive ``httpx.Client``;
3. ``POST /run_code`` (SandboxFusion's request and response) the same way.

The three alternate in ``--rounds`` rounds of ``--runs`` requests each, so that they see the same
background load; the table gives the median and p90 per request (ms) over all rounds, and the
service's overhead as the difference of medians.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import uvicorn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sandbox import Sandbox, wire
from sandbox.service import ServiceSettings, build_app
from sandbox.service_cli import bind, url_of

HELLO = "print('hello')"


def _time(fn: Callable[[], object], runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return times


def main() -> None:
    """Measure and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with Sandbox(workers=1) as box:
        sock = bind("127.0.0.1", 0)
        server = uvicorn.Server(
            uvicorn.Config(
                build_app(ServiceSettings(port=0, workers=1), box),
                log_level="warning",
                access_log=False,
            )
        )
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        while not server.started:
            time.sleep(0.01)
        url = url_of(sock)
        with httpx.Client(timeout=60) as client:

            def local() -> None:
                assert box.run(HELLO).stdout == "hello\n"

            def run() -> None:
                reply = client.post(f"{url}{wire.RUN_PATH}", json={"code": HELLO})
                assert reply.json()["result"]["stdout"] == "hello\n"

            def run_code() -> None:
                body = {"code": HELLO, "language": "python"}
                reply = client.post(f"{url}{wire.RUN_CODE_PATH}", json=body)
                assert reply.json()["run_result"]["stdout"] == "hello\n"

            ways = {"Sandbox.run (local)": local, "POST /v1/run": run, "POST /run_code": run_code}
            for fn in ways.values():  # warm up: slots, connections
                _time(fn, 10)
            times: dict[str, list[float]] = {name: [] for name in ways}
            for _ in range(args.rounds):
                for name, fn in ways.items():
                    times[name] += _time(fn, args.runs)
        server.should_exit = True
        thread.join()
    base = statistics.median(times["Sandbox.run (local)"])
    print(f"{'way':<22} {'median ms':>10} {'p90 ms':>8} {'overhead ms':>12}")
    for name, values in times.items():
        median = statistics.median(values)
        p90 = statistics.quantiles(values, n=10)[-1]
        print(f"{name:<22} {median:>10.2f} {p90:>8.2f} {median - base:>12.2f}")


if __name__ == "__main__":
    main()
