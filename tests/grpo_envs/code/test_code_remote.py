"""Code environments scoring on remote sandbox services (``grpo_envs.code.backend``).

The services are fakes on loopback (tests/remote_fakes.py); the ``grpo`` one runs the jobs in a
local ``Sandbox`` behind ``sandbox.wire``, so the real verdict path decides.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from remote_fakes import FakeService, dead_url, fusion_handler, grpo_handler, silent_listener

import grpo_envs
from grpo_envs.code import close_shared_sandboxes, shared_sandbox
from grpo_envs.code.backend import (
    check_sandbox_backend,
    remote_sandbox_settings,
    use_remote_sandbox,
)
from grpo_envs.types import Outcome, Sample
from sandbox import Sandbox
from sandbox.remote import CALL_TESTS_NEED_GRPO, RemoteSandbox, RemoteSettings, RemoteStats

FIXTURES = Path(__file__).parents[1] / "fixtures" / "code"


@pytest.fixture(scope="module")
def local() -> Iterator[Sandbox]:
    with Sandbox(workers=2) as box:
        yield box


@pytest.fixture
def remote() -> Iterator[None]:
    """Leave the process on the local sandbox after each test, whatever it chose."""
    yield
    use_remote_sandbox(None)
    close_shared_sandboxes()


def use(url: str, protocol: str = "grpo", **overrides: object) -> RemoteSandbox:
    use_remote_sandbox(RemoteSettings(urls=(url,), protocol=protocol, **overrides))  # type: ignore[arg-type]
    box = shared_sandbox()
    assert isinstance(box, RemoteSandbox)
    return box


def stdio_env() -> tuple[grpo_envs.Environment, Sample]:
    env = grpo_envs.make("code/stdio-v0", data_files=str(FIXTURES / "stdio.jsonl"))
    return env, Sample.from_row(env.dataset("test")[0])


def mbpp_env() -> tuple[grpo_envs.Environment, Sample]:
    env = grpo_envs.make("code/mbpp-v0", data_files=str(FIXTURES / "mbpp_full.jsonl"))
    return env, Sample.from_row(env.dataset("test")[0])


def test_function_tasks_score_right_through_a_grpo_service(local: Sandbox, remote: None) -> None:
    env, sample = mbpp_env()
    name = str(sample.metadata["entry_point"])
    right = f"```python\n{sample.answer}\n```"
    wrong = f"```python\ndef {name}(*args):\n    return None\n```"
    with FakeService(grpo_handler(local)) as service:
        box = use(service.url)
        assert env.unwrapped.sandbox is box  # type: ignore[attr-defined]
        scores = env.score_batch([right, wrong, right + "\n# again"], [sample] * 3)
    assert [s.outcome for s in scores] == [Outcome.PASSED, Outcome.FAILED, Outcome.PASSED]
    assert [s.reward for s in scores] == [1.0, 0.0, 1.0]
    assert {path for path, _ in service.requests} == {"/v1/run_tests"}
    assert scores[0].details["isolation"]  # the service's sandbox reported its layers


def test_stdio_tasks_score_right_through_sandbox_fusion(local: Sandbox, remote: None) -> None:
    env, sample = stdio_env()
    right = f"```python\n{sample.answer}\n```"
    wrong = "```python\na, b = map(int, input().split())\nprint(a - b)\n```"
    slow = "```python\nwhile True:\n    pass\n```"
    with FakeService(fusion_handler(local)) as service:
        use(service.url, "sandbox_fusion")
        check_sandbox_backend([env], "test")  # stdin/stdout tasks: fine on SandboxFusion
        scores = env.score_batch([right, wrong, slow], [sample] * 3, timeout_s=60)
    assert [s.outcome for s in scores] == [Outcome.PASSED, Outcome.FAILED, Outcome.TIMEOUT]
    assert {path for path, _ in service.requests} == {"/run_code"}


def test_function_tasks_on_a_plain_sandbox_fusion_fail_early_with_the_fix(remote: None) -> None:
    env, sample = mbpp_env()
    use(dead_url(), "sandbox_fusion")
    with pytest.raises(ValueError, match="grpo sandbox serve") as caught:
        check_sandbox_backend([env], "test")
    assert "sandbox_protocol grpo" in str(caught.value)
    # Scored anyway, each item is a sandbox error saying the same (never a wrong answer).
    score = env.score(f"```python\n{sample.answer}\n```", sample)
    assert score.outcome is Outcome.SANDBOX_ERROR
    assert CALL_TESTS_NEED_GRPO[:60] in str(score.details.get("first_failure"))


def test_a_dead_service_fails_a_whole_batch_fast_as_sandbox_errors(remote: None) -> None:
    env, sample = stdio_env()
    box = use(dead_url(), max_in_flight=4, backoff_base_s=0.05, backoff_cap_s=0.1, cooldown_s=0.2)
    completions = [f"```python\n{sample.answer}\n# {i}\n```" for i in range(16)]
    start = time.monotonic()
    scores = env.score_batch(completions, [sample] * 16)
    elapsed = time.monotonic() - start
    assert {s.outcome for s in scores} == {Outcome.SANDBOX_ERROR}
    assert all(s.reward == 0.0 for s in scores)
    assert "connection failed" in str(scores[0].details.get("first_failure"))
    assert elapsed < 3.0, elapsed
    assert box.stats().failures == 16


def test_a_hung_service_fails_a_whole_batch_within_its_deadline(remote: None) -> None:
    env, sample = stdio_env()
    completions = [f"```python\n{sample.answer}\n# {i}\n```" for i in range(16)]
    with silent_listener() as url:
        box = use(url, max_in_flight=4, request_timeout_s=1.0, cooldown_s=0.2)
        before = box.stats()
        start = time.monotonic()
        scores = env.score_batch(completions, [sample] * 16)
        elapsed = time.monotonic() - start
    assert {s.outcome for s in scores} == {Outcome.SANDBOX_ERROR}
    # The first wave times out (1 s), the URL is then down, its probes time out, and the rest
    # fail at once.
    assert elapsed < 4.0, elapsed
    stats = box.stats().minus(before)
    assert isinstance(stats, RemoteStats) and stats.failures == 16


def test_the_backend_is_the_processes_and_local_is_the_default(remote: None) -> None:
    assert remote_sandbox_settings() is None
    settings = RemoteSettings(urls=("http://127.0.0.1:9",))
    use_remote_sandbox(settings)
    assert remote_sandbox_settings() is settings
    assert shared_sandbox() is shared_sandbox()  # one per process and settings
    use_remote_sandbox(None)
    assert remote_sandbox_settings() is None


def test_a_missing_token_fails_when_the_backend_is_chosen(
    remote: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GRPO_TEST_SANDBOX_TOKEN", raising=False)
    settings = RemoteSettings(urls=("http://a",), token_env="GRPO_TEST_SANDBOX_TOKEN")
    with pytest.raises(ValueError, match="GRPO_TEST_SANDBOX_TOKEN"):
        use_remote_sandbox(settings)
    assert remote_sandbox_settings() is None


def test_grpo_envs_score_scores_on_the_remote_service(
    local: Sandbox, remote: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from grpo_envs.cli import main

    _, sample = stdio_env()
    lines = [
        {"id": sample.id, "completion": f"```python\n{sample.answer}\n```"},
        {"id": sample.id, "completion": "```python\nprint(0)\n```"},
    ]
    path = tmp_path / "completions.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    data = json.dumps({"data_files": str(FIXTURES / "stdio.jsonl")})
    with FakeService(grpo_handler(local)) as service:
        argv = ["score", "code/stdio-v0", "--completions", str(path), "--kwargs", data]
        code = main([*argv, "--sandbox_backend", "remote", "--sandbox_urls", service.url])
    out = capsys.readouterr().out
    assert code == 0 and "2 completions, accuracy 0.5000" in out
    assert len(service.requests) == 2
    assert main([*argv, "--sandbox_urls", "http://a:1"]) == 2
    assert "add sandbox_backend remote" in capsys.readouterr().err
