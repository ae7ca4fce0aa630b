"""``grpo sandbox serve`` as a process: its URL, its token, and a clean stop on SIGTERM."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import sandbox_helpers  # noqa: F401  (imports the real package first)
from process_tree import alive, descendants
from service_helpers import health

from sandbox import wire

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "cli-token-93c1f2"


def _command(*args: str) -> list[str]:
    return [sys.executable, "-m", "grpo_train.cli", "sandbox", "serve", *args]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "GRPO_SANDBOX_TOKEN"}
    env["PYTHONPATH"] = str(ROOT)
    return {**env, **extra}


@contextmanager
def serving(*args: str, **env: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """Start ``grpo sandbox serve --port 0 ...``; yield the process and the URL it printed."""
    proc = subprocess.Popen(
        _command("--port", "0", *args),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=_env(**env),
        cwd=ROOT,
    )
    assert proc.stdout is not None
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        line = proc.stdout.readline() if ready else ""
        found = re.search(r"listening on (http://127\.0\.0\.1:(\d+))", line)
        assert found and int(found.group(2)) > 0, line  # the real port, not 0
        yield proc, found.group(1)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        proc.stdout.close()


def test_refuses_a_public_address_without_a_token() -> None:
    done = subprocess.run(
        _command("--host", "0.0.0.0", "--port", "0"),
        capture_output=True,
        text=True,
        env=_env(),
        cwd=ROOT,
        timeout=60,
    )
    assert done.returncode == 2
    assert "without a token" in done.stderr and "listening" not in done.stdout


def test_token_from_the_environment_or_a_file(tmp_path: Path) -> None:
    body = {"code": "print('ran')"}
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)  # else a warning: other users could read it
    for args, env in (((), {"GRPO_SANDBOX_TOKEN": TOKEN}), (("--token-file", str(token_file)), {})):
        with serving("--workers", "1", *args, **env) as (proc, url):
            assert TOKEN not in " ".join(proc.args)  # never on the command line (ps shows it)
            refused = httpx.post(f"{url}{wire.RUN_PATH}", json=body, timeout=60)
            assert refused.status_code == 401
            auth = {"Authorization": f"Bearer {TOKEN}"}
            ran = httpx.post(f"{url}{wire.RUN_PATH}", json=body, headers=auth, timeout=60)
            assert ran.status_code == 200 and ran.json()["result"]["stdout"] == "ran\n"


def test_sigterm_with_a_run_in_flight_stops_cleanly() -> None:
    with serving("--workers", "1") as (proc, url):
        replies: list[object] = []

        def slow() -> None:
            try:
                body = {"code": "import time\ntime.sleep(60)\n"}
                replies.append(httpx.post(f"{url}{wire.RUN_PATH}", json=body, timeout=120))
            except httpx.HTTPError as exc:  # the connection may close without an answer
                replies.append(exc)

        caller = threading.Thread(target=slow)
        caller.start()
        deadline = time.monotonic() + 30
        while health(url)["in_flight"] != 1:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        below = descendants(proc.pid)
        assert below  # the slot server, its template, the run's child
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        assert time.monotonic() - start < 10
        caller.join(timeout=30)
        assert not caller.is_alive()
        assert proc.stdout is not None
        assert "stopped" in proc.stdout.read()
    reply = replies[0]  # the Sandbox closes first: the run in flight is answered, not dropped
    assert isinstance(reply, httpx.Response) and reply.status_code == 503, reply
    time.sleep(0.5)
    assert [pid for pid in below if alive(pid)] == []


def test_the_command_imports_no_torch_nor_the_environments() -> None:
    """A scoring machine runs it without torch, vLLM or the trainer's packages."""
    code = (
        "import sys\n"
        "from grpo_train import cli\n"
        "try:\n"
        "    cli.main(['sandbox', 'serve', '--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "import sandbox.service, sandbox.service_cli\n"
        "heavy = ('torch', 'vllm', 'transformers', 'numpy', 'grpo_envs')\n"
        "print('loaded', [m for m in heavy if m in sys.modules])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=_env(), cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    assert "--token-file" in done.stdout  # the help was printed: the command was reached
    assert done.stdout.splitlines()[-1] == "loaded []"
