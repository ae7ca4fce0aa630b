"""The public API: limits validation, files, stdin, ordering, isolation records, results."""

from __future__ import annotations

import pytest
from sandbox_helpers import FAST

from sandbox import ALL_LAYERS, ExecResult, Job, Limits, Sandbox, Status, normalize_output
from sandbox.types import check_files


@pytest.mark.parametrize(
    "kwargs",
    [
        {"timeout_s": 0}, {"timeout_s": float("inf")}, {"cpu_s": -1}, {"memory_mb": 10},
        {"output_bytes": 0}, {"max_processes": 0}, {"max_file_mb": 1.5},
    ],
)  # fmt: skip
def test_limits_reject_unenforceable_values(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        Limits(**kwargs)  # type: ignore[arg-type]


def test_cpu_limit_default_follows_timeout() -> None:
    assert Limits(timeout_s=2.5).effective_cpu_s == 4
    assert Limits(timeout_s=2.5, cpu_s=0.2).effective_cpu_s == 1


@pytest.mark.parametrize("name", ["/etc/x", "../x", "a/../../x", "", "a\x00b", ".", "./a"])
def test_file_names_must_stay_inside(name: str) -> None:
    with pytest.raises(ValueError):
        check_files({name: "x"})


def test_run_with_stdin_files_and_isolation(sb: Sandbox) -> None:
    code = (
        "import os\n"
        "print(input().upper())\n"
        "print(open('data/in.txt').read())\n"
        "print(os.getcwd(), sorted(os.listdir('.')))\n"
    )
    res = sb.run(code, stdin="abc\n", files={"data/in.txt": "payload", "x.py": "y = 1"})
    assert isinstance(res, ExecResult)
    assert res.status is Status.OK, res
    lines = res.stdout.splitlines()
    assert lines[:2] == ["ABC", "payload"]
    assert "'data'" in lines[2] and "'x.py'" in lines[2]
    assert res.exit_code == 0 and not res.truncated
    assert res.isolation == sb.isolation
    assert set(res.isolation) <= set(ALL_LAYERS)
    assert {"rlimits", "no_new_privs", "session"} <= set(res.isolation)


def test_statuses_and_exit_codes(sb: Sandbox) -> None:
    results = sb.run_many(
        [
            "print('a')",
            Job("import sys\nsys.exit(3)"),
            Job("raise KeyError('k')"),
            Job("import ctypes\nctypes.string_at(0)"),  # a real segfault
            Job("print(input())", stdin="x\n"),
        ]
    )
    assert [r.status for r in results] == [
        Status.OK, Status.RUNTIME_ERROR, Status.RUNTIME_ERROR, Status.KILLED, Status.OK,
    ]  # fmt: skip
    assert results[1].exit_code == 3
    assert "KeyError" in results[2].stderr and "_zygote" not in results[2].stderr
    assert results[3].exit_code is not None and results[3].exit_code < 0
    assert results[4].stdout == "x\n"


def test_output_written_just_before_exit_is_complete(sb: Sandbox) -> None:
    """Everything a program writes to both streams right before it exits is kept, in full."""
    big = Limits(timeout_s=5.0, output_bytes=1 << 20)
    code = (
        "import sys\nsys.stdout.write('x' * 300_000)\nsys.stderr.write('y' * 200_000)\nsys.exit(4)"
    )
    for res in sb.run_many([Job(code, limits=big)] * 4):
        assert (res.status, res.exit_code) == (Status.RUNTIME_ERROR, 4)
        assert (res.stdout, res.stderr) == ("x" * 300_000, "y" * 200_000)
        assert not res.truncated


def test_run_many_is_in_input_order(sb: Sandbox) -> None:
    jobs = [f"import time\ntime.sleep({0.05 * (i % 3)})\nprint({i})" for i in range(8)]
    assert [r.stdout for r in sb.run_many(jobs)] == [f"{i}\n" for i in range(8)]


def test_syntax_error_is_a_runtime_error(sb: Sandbox) -> None:
    res = sb.run("def (:\n")
    assert res.status is Status.RUNTIME_ERROR
    assert "SyntaxError" in res.stderr


def test_bad_arguments_raise(sb: Sandbox) -> None:
    with pytest.raises(TypeError):
        sb.run(b"print(1)")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        sb.run("pass", files={"../x": ""})
    with pytest.raises(ValueError):
        Sandbox(workers=0)
    with pytest.raises(ValueError):
        Sandbox(required_layers=["no_such_layer"])


def test_required_layers_that_exist_are_accepted() -> None:
    with Sandbox(limits=FAST, workers=1, required_layers=["rlimits", "no_new_privs"]) as box:
        assert box.run("print(2)").stdout == "2\n"
    with pytest.raises(RuntimeError):
        box.run("print(2)")  # closed


def test_normalize_output() -> None:
    assert normalize_output("a  \r\nb\t\n\n\n") == ["a", "b"]
    assert normalize_output("") == []


def test_network_true_reaches_a_local_listener() -> None:
    import socket

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(5)
    port = listener.getsockname()[1]
    code = (
        "import socket\n"
        f"s = socket.create_connection(('127.0.0.1', {port}), timeout=5)\n"
        "s.sendall(b'hi')\n"
    )
    with Sandbox(limits=Limits(timeout_s=5, network=True), workers=1) as box:
        assert "net_ns" not in box.run("pass").isolation
        res = box.run(code)
        conn, _ = listener.accept()
        assert conn.recv(2) == b"hi"
        conn.close()
    listener.close()
    assert res.status is Status.OK, res


def test_runs_do_not_share_state(sb: Sandbox) -> None:
    # Each run is a fresh fork: module state and the RNG are not shared between runs.
    first = sb.run("import random, math\nmath.pi = 3\nprint(random.random())")
    second = sb.run("import random, math\nprint(math.pi, random.random())")
    assert first.status is Status.OK and second.status is Status.OK
    pi, rand = second.stdout.split()
    assert pi.startswith("3.14")
    assert rand != first.stdout.strip()
    leftover = sb.run("import os\nprint(sorted(os.listdir('.')))", files={"a.txt": "x"})
    assert leftover.stdout.strip() == "['a.txt']"
    again = sb.run("import os\nprint(sorted(os.listdir('.')))")
    assert again.stdout.strip() == "[]"


def test_each_run_refuses_when_a_required_layer_is_missing() -> None:
    with Sandbox(limits=FAST, workers=1, required_layers=["rlimits"]) as box:
        assert box.run("print(1)").status is Status.OK
        # As if the host lost a layer after start-up: the child itself must refuse to run.
        box.required_layers = ("rlimits", "no_such_layer")
        res = box.run("print('ran anyway')")
        assert res.status is Status.SANDBOX_ERROR
        assert "no_such_layer" in res.detail
        assert "ran anyway" not in res.stdout


def test_unusable_interpreter_is_a_clear_error() -> None:
    from sandbox import SandboxUnavailableError

    with pytest.raises(SandboxUnavailableError):
        Sandbox(workers=1, python="/nonexistent/python3")
