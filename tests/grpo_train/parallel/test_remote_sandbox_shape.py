"""The multi-machine recipe of ``examples/README.md`` on localhost: its config, and its shape.

``examples/multi_node_code.yaml`` must load with the real config loader, and the recipe's
command-line form must parse and say the same. The slow tests run the recipe's shape on one
machine: two ``grpo sandbox serve --port 0`` processes (the scoring machines, requiring a token
as off loopback) and the real ``grpo train`` on two gloo ranks under ``accelerate launch`` (the
trainer machines), scoring through ``--sandbox_backend remote --sandbox_urls <both>
--sandbox_token_env``; then again with one of the two services stopped first. Generation is
colocated (the ``hf`` engine on the tiny model): a ``grpo serve`` replica of vLLM takes about a
minute to start on a loaded 2-core machine, and two of them beside two trainer ranks and two
services would not fit this test's budget (~90 s) in CI;
``tests/grpo_train/rollout/test_server_mode.py`` covers server mode on its own. The environment
is ``faults/remote-code-v0``, whose completions all run one fixed program that passes, so every
completion reaches a service and every reward is 1.0.

Launched by ``accelerate``, this file is also each rank's script (``python
test_remote_sandbox_shape.py grpo train ...``): the guard at the bottom registers the test
environment and runs the real CLI.
"""

from __future__ import annotations

import dataclasses
import os
import re
import select
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "multi_node_code.yaml"


def test_the_example_config_loads_with_server_generation_and_two_sandbox_services() -> None:
    import grpo_envs
    from grpo_train.config import TrainConfig
    from grpo_train.rollout.server_address import parse_server_urls
    from grpo_train.setup.settings import sandbox_settings

    cfg = TrainConfig.from_yaml(EXAMPLE)
    assert cfg.rollout.vllm_mode == "server"
    assert len(parse_server_urls(cfg.rollout.vllm_server_urls)) >= 2
    settings = sandbox_settings(cfg)
    assert settings is not None and len(settings.urls) == 2
    assert (settings.protocol, settings.token_env) == ("grpo", "GRPO_SANDBOX_TOKEN")
    for entry in cfg.data.env:  # code environments, known to the registry
        assert entry.id.startswith("code/") and entry.id in grpo_envs.registration.registry
    # The saved config (every run writes one) reads back equal: resuming it works.
    assert TrainConfig.from_yaml(EXAMPLE) == TrainConfig.from_flat(
        {k: v for section in cfg.to_dict().values() for k, v in section.items()}
    )


def _recipe_flags_command() -> list[str]:
    """The recipe's ``grpo launch ... train --config run.yaml --vllm_mode server ...`` line."""
    text = (ROOT / "examples" / "README.md").read_text()
    section = text.split("## Several machines: trainers, generation, scoring", 1)[1]
    blocks = re.findall(r"```bash\n(.*?)```", section, flags=re.DOTALL)
    (block,) = [b for b in blocks if "--sandbox_token_env" in b and "--config run.yaml" in b]
    return shlex.split(block.replace("\\\n", " "))


def test_the_recipe_flags_say_what_the_example_config_says() -> None:
    from grpo_train.config import TrainConfig, field_owners
    from grpo_train.train_cli import build_parser

    command = _recipe_flags_command()
    train = command[command.index("train") + 1 :]
    assert train[:2] == ["--config", "run.yaml"]
    args = build_parser().parse_args(train[2:])  # an unknown flag fails here
    given = {n: getattr(args, n) for n in field_owners() if getattr(args, n) is not None}
    flags, example = TrainConfig.from_flat(given), TrainConfig.from_yaml(EXAMPLE)
    # Every sandbox field the same, but the in-flight bound the example sizes to its services.
    in_flight = flags.sandbox.sandbox_max_in_flight
    assert flags.sandbox == dataclasses.replace(example.sandbox, sandbox_max_in_flight=in_flight)
    for name in ("vllm_mode", "vllm_server_urls", "vllm_sync_address"):
        assert getattr(flags.rollout, name) == getattr(example.rollout, name), name


# -- the shape on localhost ------------------------------------------------------------------


@dataclass
class Service:
    """One ``grpo sandbox serve`` process and the URL it printed."""

    proc: subprocess.Popen[str]
    url: str


#: The bearer token of the test that uses one (loopback needs none; the recipe's machines do).
TOKEN = "shape-token-5be1"
#: The environment variable the trainer ranks read it from (``--sandbox_token_env``).
TOKEN_ENV = "SHAPE_SANDBOX_TOKEN"


def _service_env(token: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "GRPO_SANDBOX_TOKEN"}
    env["PYTHONPATH"] = str(ROOT)
    return {**env, "GRPO_SANDBOX_TOKEN": token} if token else env


@contextmanager
def sandbox_service(token: str = "") -> Iterator[Service]:
    """Start ``grpo sandbox serve --port 0 --workers 1`` (with ``$GRPO_SANDBOX_TOKEN`` =
    ``token`` when given); kill it if the test did not stop it."""
    command = [sys.executable, "-m", "grpo_train.cli", "sandbox", "serve", "--port", "0"]
    proc = subprocess.Popen(
        [*command, "--workers", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_service_env(token),
        cwd=ROOT,
    )  # fmt: skip
    assert proc.stdout is not None
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        line = proc.stdout.readline() if ready else ""
        found = re.search(r"listening on (http://127\.0\.0\.1:\d+)", line)
        assert found, line
        yield Service(proc, found.group(1))
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        proc.stdout.close()


def served(url: str) -> int:
    """Requests the service at ``url`` has answered (its ``/health`` ``served``, all paths);
    asserts that it refused none (a 401 would be a rank without the token)."""
    import httpx

    reply = httpx.get(f"{url}/health", timeout=10)  # no token needed
    assert reply.status_code == 200, reply.text
    counts, refused = reply.json()["served"], reply.json()["refused"]
    assert isinstance(counts, dict) and refused == {}, refused
    return sum(int(n) for n in counts.values())


def stop(service: Service) -> None:
    """SIGTERM the service; it exits 0 and leaves none of its processes (slot servers...)."""
    # Imported here: this file is also each rank's script, where tests/ is not on sys.path.
    from process_tree import alive, descendants

    below = descendants(service.proc.pid)
    assert below  # its Sandbox's slot servers, templates, verdict servers
    service.proc.send_signal(signal.SIGTERM)
    assert service.proc.wait(timeout=30) == 0
    deadline = time.monotonic() + 5
    while [pid for pid in below if alive(pid)] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [pid for pid in below if alive(pid)] == []


def _train_args(model: Path, out: Path, urls: list[str], token_env: str) -> list[str]:
    return [
        "grpo", "train", "--model", str(model), "--env", "faults/remote-code-v0",
        "--engine", "hf", "--max_steps", "1", "--num_generations", "4",
        "--prompts_per_step", "4", "--max_prompt_length", "64", "--max_completion_length", "4",
        "--eval_size", "0", "--save_every", "0", "--progress", "false",
        "--log_every_samples", "0", "--output_dir", str(out),
        "--sandbox_backend", "remote", "--sandbox_urls", ",".join(urls),
        "--sandbox_token_env", token_env,
    ]  # fmt: skip


def train_on_two_ranks(
    model: Path, out: Path, urls: list[str], token: str = ""
) -> dict[str, float]:
    """Run the real ``grpo train`` on 2 gloo ranks (``token`` in ``$SHAPE_SANDBOX_TOKEN``, named
    by ``--sandbox_token_env``); assert that both end 0; return the step's metrics."""
    from collective_guard.nccl_guard import guarded_env
    from two_ranks import accelerate_two_ranks

    from grpo_train.run.run_log import read_metrics

    launch = accelerate_two_ranks(__file__)
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env = guarded_env({**env, "TOKENIZERS_PARALLELISM": "false"})
    env.pop("GRPO_SANDBOX_TOKEN", None)
    env.pop(TOKEN_ENV, None)
    if token:
        env[TOKEN_ENV] = token
    proc = subprocess.Popen(
        launch + _train_args(model, out, urls, TOKEN_ENV if token else ""),
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        stdout, stderr = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stdout[-2000:] + stderr[-4000:]
    assert "Traceback" not in stderr, stderr[-4000:]
    (row,) = [r for r in read_metrics(out) if r["step"] == 1]
    return row


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_trainer_ranks_score_on_two_sandbox_services(
    tmp_path: Path, tiny_model_path: Path
) -> None:
    with ExitStack() as stack:
        # As on the recipe's machines: the services require a token, the ranks send it.
        services = [stack.enter_context(sandbox_service(TOKEN)) for _ in range(2)]
        row = train_on_two_ranks(tiny_model_path, tmp_path, [s.url for s in services], TOKEN)
        counts = [served(s.url) for s in services]
        for service in services:
            stop(service)
    # Both ranks' requests, summed: every one answered by one of the two services, each of
    # which got a share (the client starts each job on the next URL, round-robin).
    assert row["sandbox/requests"] > 0 and sum(counts) == row["sandbox/requests"], counts
    assert all(n > 0 for n in counts), counts
    assert row["sandbox/retries"] == row["sandbox/failovers"] == row["sandbox/failed_jobs"] == 0
    assert row["score/sandbox_error_share"] == 0.0
    assert row["reward/mean"] == 1.0  # the fixed program passes, judged by the services


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_service_dead_before_the_run_costs_failovers_not_rewards(
    tmp_path: Path, tiny_model_path: Path
) -> None:
    with ExitStack() as stack:
        dead, alive = (stack.enter_context(sandbox_service()) for _ in range(2))
        served(dead.url)  # it was up: its slot servers started
        stop(dead)
        row = train_on_two_ranks(tiny_model_path, tmp_path, [dead.url, alive.url])
        count = served(alive.url)
        stop(alive)
    # The jobs sent to the dead URL failed over to the live one; none failed, none scored wrong.
    assert row["sandbox/failovers"] > 0
    assert row["sandbox/failed_jobs"] == 0 and row["score/sandbox_error_share"] == 0.0
    assert row["reward/mean"] == 1.0
    assert 0 < count <= row["sandbox/requests"]


def _grpo_with_remote_code_env(argv: list[str]) -> int:
    """``grpo`` (the real CLI) with ``faults/remote-code-v0`` registered in this rank."""
    sys.path.insert(0, str(Path(__file__).parents[1]))
    import remote_code_env  # noqa: F401 - registers faults/remote-code-v0

    from grpo_train.cli import main

    return main(argv)


if __name__ == "__main__" and sys.argv[1:2] == ["grpo"]:
    raise SystemExit(_grpo_with_remote_code_env(sys.argv[2:]))
