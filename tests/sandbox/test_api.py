"""The public API: limits validation, files, stdin, ordering, isolation records, results."""

from __future__ import annotations

import hashlib
import os
import socket

import pytest
from sandbox_helpers import FAST, server_pids

from sandbox import (
    ALL_LAYERS,
    MAX_REQUEST_BYTES,
    CallTest,
    ExecResult,
    IOTest,
    Job,
    Limits,
    Sandbox,
    Status,
    _codec,
    _runspec,
    normalize_output,
)
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
    assert "KeyError" in results[2].stderr and "_slot_server" not in results[2].stderr
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
    # Only ASCII whitespace is trailing whitespace: other characters are output.
    for char in ("\x85", "\u3000", "\x1c", "\xa0"):
        assert normalize_output(f"YES{char}\n") == [f"YES{char}"]
    assert normalize_output("YES \t\x0b\x0c\r\n") == ["YES"]


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


# -- large inputs and outputs -------------------------------------------------------------------
# A request used to travel as one SOCK_SEQPACKET message; above ~4 MiB (the kernel's largest
# kmalloc) sendmsg failed with ENOBUFS and the run came back as "could not start a child".

READ_BACK = (
    "import hashlib, sys\n"
    "data = open('big.txt', encoding='utf-8').read()\n"
    "text = sys.stdin.read()\n"
    "print(len(data), hashlib.sha256(data.encode()).hexdigest(), len(text))\n"
)


def test_inputs_of_several_megabytes_arrive_intact(sb: Sandbox) -> None:
    content = "x" * 8_000_000
    res = sb.run("import os\nprint(os.path.getsize('big.txt'))", files={"big.txt": content})
    assert (res.status, res.stdout) == (Status.OK, "8000000\n"), res.detail
    res = sb.run("import sys\nprint(len(sys.stdin.read()))", stdin="y" * 8_000_000)
    assert (res.status, res.stdout) == (Status.OK, "8000000\n"), res.detail
    program = "x = 41\n" + "# padding\n" * 500_000 + "print(x + 1)\n"  # a 5 MB program
    res = sb.run(program)
    assert (res.status, res.stdout) == (Status.OK, "42\n"), res.detail
    # Non-ASCII text (2-, 3- and 4-byte UTF-8) in a file and on stdin, 2.7 MB each.
    text = "é✓😀" * 300_000
    res = sb.run(READ_BACK, stdin=text, files={"big.txt": text})
    digest = hashlib.sha256(text.encode()).hexdigest()
    assert (res.status, res.stdout) == (Status.OK, f"{len(text)} {digest} {len(text)}\n")


def test_a_request_of_exactly_the_limit_works_and_one_byte_more_raises(sb: Sandbox) -> None:
    limits = Limits(timeout_s=20.0, memory_mb=512, output_bytes=1 << 16, max_file_mb=40)
    stdin = "s" * (1 << 20)
    file_size = MAX_REQUEST_BYTES - _codec.texts_size([READ_BACK, stdin, "big.txt", ""])
    content = "f" * file_size
    with pytest.raises(ValueError, match="64 MiB"):
        sb.run(READ_BACK, stdin=stdin + "s", files={"big.txt": content}, limits=limits)
    pids = server_pids(sb)
    res = sb.run(READ_BACK, stdin=stdin, files={"big.txt": content}, limits=limits)
    digest = hashlib.sha256(content.encode()).hexdigest()
    assert (res.status, res.stdout) == (Status.OK, f"{file_size} {digest} {1 << 20}\n"), res
    assert server_pids(sb) == pids  # neither request restarted a slot server


def test_requests_over_the_limit_raise_before_running(sb: Sandbox) -> None:
    over = "x" * MAX_REQUEST_BYTES
    pids = server_pids(sb)
    with pytest.raises(ValueError, match="MAX_REQUEST_BYTES"):
        sb.run("pass", stdin=over)
    with pytest.raises(ValueError, match="64 MiB"):
        sb.run(over)
    with pytest.raises(ValueError, match="64 MiB"):
        sb.run_many(
            [
                "print(1)",
                Job(
                    "pass",
                    files={"a.txt": over[: MAX_REQUEST_BYTES // 2]}
                    | {"b.txt": over[: MAX_REQUEST_BYTES // 2]},
                ),
            ]
        )
    with pytest.raises(ValueError, match="64 MiB"):  # UTF-8 bytes count, not characters
        sb.run("pass", stdin="é" * (MAX_REQUEST_BYTES // 2))
    with pytest.raises(ValueError, match="64 MiB"):
        sb.run_tests("def f(): pass", [CallTest("assert f() is None")], entry_point="f", setup=over)
    with pytest.raises(ValueError, match="64 MiB"):
        sb.run_tests("print(1)", [IOTest("", "1\n"), IOTest(over, "1\n")])
    # Files larger than the run's private /tmp (2 x max_file_mb, FAST: 16 MiB) cannot be written.
    with pytest.raises(ValueError, match="max_file_mb"):
        sb.run("pass", files={"a.txt": "x" * (17 << 20)})
    assert server_pids(sb) == pids
    assert sb.run("print('still fine')").stdout == "still fine\n"


def test_run_tests_with_large_program_and_setup(sb: Sandbox) -> None:
    padding = "# padding\n" * 600_000  # 6 MB each
    report = sb.run_tests(
        padding + "def add(a, b):\n    return a + b\n",
        [CallTest("assert candidate(1, 2) == 3"), CallTest("check(add)")],
        entry_point="add",
        setup=padding + "def check(f):\n    assert f(2, 2) == 4\n",
    )
    assert report.all_passed, report
    report = sb.run_tests(
        "import sys\nprint(len(sys.stdin.read()))", [IOTest("z" * 6_000_000, "6000000\n")]
    )
    assert report.all_passed, report


def test_output_near_the_cap_truncates_exactly(sb: Sandbox) -> None:
    cap = 1 << 20
    limits = Limits(timeout_s=5.0, output_bytes=cap)
    write = "import sys\nsys.stdout.write('a' * {})\nsys.stderr.write('b' * {})\n"
    exact, over, split, echo = sb.run_many(
        [
            Job(write.format(cap, 0), limits=limits),
            Job(write.format(cap + 1, 0), limits=limits),
            Job(write.format(cap // 2, cap // 2 + 1), limits=limits),
            # A large input echoed back: the output cap still holds.
            Job("import sys\nsys.stdout.write(sys.stdin.read())", stdin="e" * 8_000_000,
                limits=limits),
        ]
    )  # fmt: skip
    assert (exact.status, exact.truncated, len(exact.stdout)) == (Status.OK, False, cap)
    for res in (over, split, echo):
        assert res.status is Status.OUTPUT_LIMIT and res.truncated, res.detail
        assert len(res.stdout) + len(res.stderr) == cap
        assert str(cap) in res.detail
    assert set(over.stdout) == {"a"} and set(echo.stdout) == {"e"}


def test_input_files_that_do_not_fit_the_work_dir_are_a_clear_error(sb: Sandbox) -> None:
    """15 MB in 3,000 files passes the library's check but takes 24 MB of tmpfs pages."""
    if "mount_ns" not in sb.isolation:
        pytest.skip("the size-capped private /tmp needs the mount namespace")
    files = {f"f{i}.txt": "x" * 5000 for i in range(3000)}
    res = sb.run("pass", files=files)
    assert res.status is Status.SANDBOX_ERROR
    assert "do not fit" in res.detail and "max_file_mb" in res.detail, res.detail
    assert sb.run("print(1)").stdout == "1\n"


@pytest.mark.parametrize("size", [10, _codec.INLINE_MAX, 5_000_000])
def test_request_messages_round_trip_inline_and_in_a_memfd(size: int) -> None:
    """The zygote -> child transport: exact text round trip, fds passed along, memfd closed."""
    texts = ["a" * size, "", "é\x00\ud800😀" * 3, "\n"]
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    extra_r, extra_w = os.pipe()
    message = _codec.Message(b"R", {"k": [1, "v"]}, texts)
    try:
        assert (message.memfd >= 0) == (size > _codec.INLINE_MAX // 2)
        message.send(ours, [extra_w])
        kind, payload, fds = _codec.recv_message(
            theirs, _codec.MAX_REQUEST + _codec.MAX_META, maxfds=1
        )
        assert kind == b"R" and len(fds) == 1
        assert _codec.unpack_texts(payload) == ({"k": [1, "v"]}, texts)
        os.write(fds[0], b"!")
        assert os.read(extra_r, 1) == b"!"
        os.close(fds[0])
        message.send(ours)  # sendable again (a retry with a fresh child)
        if message.memfd >= 0:
            with pytest.raises(_codec.CodecError, match="exceeds the cap"):
                _codec.recv_message(theirs, 1000)
        else:
            assert _codec.recv_message(theirs, 1000)[0] == b"R"
    finally:
        message.close()
        for fd in (extra_r, extra_w):
            os.close(fd)
        ours.close()
        theirs.close()
    with pytest.raises(_codec.CodecError):
        _codec.unpack_texts(b"".join(_codec.pack_texts({}, texts))[:-1])


def test_child_messages_use_fixed_fields_and_one_recvmsg() -> None:
    """What S sends a child and the child reports back (binary fields, not JSON) round-trips."""
    spec = _runspec.RunSpec(
        {
            "code": "x",
            "limits": {
                "timeout_s": 1, "cpu_s": 86401, "memory_mb": 1 << 24, "output_bytes": 1,
                "max_processes": 1 << 22, "max_file_mb": 1 << 20, "network": False,
            },
            "required": ["seccomp", "uid", "no_such_layer"],
            "entry_point": "add",
        }
    )  # fmt: skip
    meta = spec.program_meta()
    fields = _runspec.PROGRAM_META.unpack_from(meta)
    assert fields[:4] == (86401, 1 << 24, 1 << 20, 1 << 22)
    assert _runspec.layer_names(fields[4]) == ["uid", "seccomp"]
    assert fields[4] & _runspec.UNKNOWN_LAYER
    assert meta[_runspec.PROGRAM_META.size :] == b"add\0no_such_layer"
    every = _runspec.layer_mask(list(_runspec.ALL_LAYERS))
    assert _runspec.layer_names(every) == list(_runspec.ALL_LAYERS) == list(ALL_LAYERS)
    # One recvmsg: fds come back in order; a message larger than the buffer is refused (and
    # its fds closed), never silently cut.
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    r, w = os.pipe()
    try:
        socket.send_fds(ours, [b"K" * 10], [r, w])
        msg, fds = _codec.recv_exact(theirs, 64, socket.CMSG_SPACE(8))
        assert msg == b"K" * 10 and len(fds) == 2
        os.write(fds[1], b"!")
        assert os.read(fds[0], 1) == b"!"
        for fd in fds:
            os.close(fd)
        socket.send_fds(ours, [b"K" * 100], [r])
        with pytest.raises(_codec.CodecError, match="cut short"):
            _codec.recv_exact(theirs, 64, socket.CMSG_SPACE(8))
        socket.send_fds(ours, [b"K"], [r, w, r])  # more fds than room for
        with pytest.raises(_codec.CodecError, match="cut short"):
            _codec.recv_exact(theirs, 64, socket.CMSG_SPACE(8))
    finally:
        for fd in (r, w):
            os.close(fd)
        ours.close()
        theirs.close()


def test_max_processes_are_all_the_programs_own(sb: Sandbox) -> None:
    """A program may run ``max_processes`` processes, itself included, in every run.

    The next run's child is prepared while a run executes; it must not count against the
    running program's per-uid ``RLIMIT_NPROC`` (it once did, and a program allowed 3 processes
    could fork only one child, depending on timing).
    """
    code = (
        "import os, time\n"
        "pids = []\n"
        "for _ in range(2):\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        time.sleep(0.2)\n"
        "        os._exit(0)\n"
        "    pids.append(pid)\n"
        "for pid in pids:\n"
        "    os.waitpid(pid, 0)\n"
        "print('forked', len(pids))\n"
    )
    limits = Limits(timeout_s=5.0, memory_mb=256, max_processes=3)
    for _ in range(4):
        res = sb.run(code, limits=limits)
        assert res.status == Status.OK, res.stderr
        assert res.stdout == "forked 2\n"
    # And no more than that: a third child is refused.
    res = sb.run(code.replace("range(2)", "range(3)"), limits=limits)
    assert res.status == Status.RUNTIME_ERROR and "BlockingIOError" in res.stderr
