"""No job may see another job, and a caller's failure must never shift results.

Every test here is an attack through the public API; afterwards it checks the host and the NEXT
job. One-worker sandboxes make consecutive jobs share a slot (the hardest case).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sandbox_helpers import FAST, processes_of, require_any, server_pids

from sandbox import CallTest, IOTest, Limits, Sandbox, Status, TestStatus, _slot

#: Untrusted-side helper: every match of a regex in this process's anonymous memory (heap,
#: stack, mmapped arenas: where freed buffers stay; read with ctypes, as a real attack would)
#: and in the repr of every frame's locals.
SCANNER = r"""
import ctypes, os, re, sys

def scan(pattern):
    rx = re.compile(pattern, re.S)
    found = []
    frame = sys._getframe()
    while frame is not None:
        try:
            found += rx.findall(repr(frame.f_locals).encode("utf-8", "backslashreplace"))
        except Exception:
            pass
        frame = frame.f_back
    with open("/proc/self/maps") as maps:
        regions = [line.split() for line in maps]
    for fields in regions:
        span, perms, path = fields[0], fields[1], (fields[5] if len(fields) > 5 else "")
        lo, hi = (int(x, 16) for x in span.split("-"))
        if perms[0] != "r" or path not in ("", "[heap]", "[stack]") or hi - lo > (512 << 20):
            continue
        found += rx.findall(ctypes.string_at(lo, hi - lo))
    return [m if isinstance(m, bytes) else m[0] for m in found]
"""
#: A token the scanner pattern matches; the pattern itself (``XQZ[0-9a-f]``) does not.
TOKEN_RX = "rb'XQZ[0-9a-f]{24}'"


def token() -> str:
    return "XQZ" + secrets.token_hex(12)


@pytest.fixture
def one_slot() -> Iterator[Sandbox]:
    with Sandbox(limits=Limits(timeout_s=10.0, memory_mb=512), workers=1) as box:
        yield box


def scan_program(own: str) -> str:
    """A program that prints every token it can find, its own (given on stdin) included."""
    return SCANNER + (
        "import json\n"
        "mine = sys.stdin.read()\n"
        f"hits = sorted(set(t.decode() for t in scan({TOKEN_RX})))\n"
        "print(json.dumps(hits))\n"
    )


def found_tokens(box: Sandbox, own: str) -> set[str]:
    res = box.run(scan_program(own), stdin=own)
    assert res.status is Status.OK, res
    hits = set(json.loads(res.stdout))
    assert own in hits, "the scanner must find the job's own token (else it proves nothing)"
    return hits - {own}


def test_the_next_job_cannot_read_a_previous_run(one_slot: Sandbox) -> None:
    secret = token()
    first = one_slot.run(
        f"import sys\ndata = sys.stdin.read()\nprint(data, {secret!r}, open('f.txt').read())\n"
        f"sys.stderr.write({secret!r})",
        stdin=secret * 3,
        files={"f.txt": secret},
    )
    assert first.status is Status.OK and secret in first.stdout
    assert secret not in found_tokens(one_slot, token())


def test_the_next_job_cannot_read_previous_tests_or_setup(one_slot: Sandbox) -> None:
    secret_test, secret_setup = token(), token()
    report = one_slot.run_tests(
        "def f(x):\n    return x\n",
        [CallTest(f"assert f({secret_test!r}) == {secret_test!r}")],
        entry_point="f",
        setup=f"KEY = {secret_setup!r}\n",
    )
    assert report.all_passed, report
    leaked = found_tokens(one_slot, token())
    assert secret_test not in leaked and secret_setup not in leaked


def test_a_respawned_program_cannot_read_its_own_tests() -> None:
    """After a test kills the program, the next round's program must not find the remaining
    tests (the expected values) anywhere in its memory: it used to be forked from the process
    that held them (the ``reward="fraction"`` path)."""
    answers = [token() for _ in range(4)]
    tests = [CallTest(f"assert f({i}) == {a!r}") for i, a in enumerate(answers)]
    hack = SCANNER + (
        "def collect():\n"
        "    out = {}\n"
        "    for blob in scan(rb\"f\\(\\d+\\) == 'XQZ[0-9a-f]{24}'\"):\n"
        "        m = re.match(rb\"f\\((\\d+)\\) == '(XQZ[0-9a-f]{24})'\", blob)\n"
        "        if m:\n"
        "            out[int(m.group(1))] = m.group(2).decode()\n"
        "    return out\n"
        "table = collect()\n"
        "def f(x):\n"
        "    if x in table:\n"
        "        return table[x]\n"
        "    os._exit(1)\n"
    )
    with Sandbox(limits=Limits(timeout_s=10.0, memory_mb=512), workers=1) as box:
        report = box.run_tests(hack, tests, entry_point="f", per_test_timeout_s=5.0)
        honest = box.run_tests(
            "def f(x):\n    return " + repr(dict(enumerate(answers))) + "[x]\n",
            tests,
            entry_point="f",
        )
    assert report.passed == 0, report
    assert all(r.status is TestStatus.RUNTIME_ERROR for r in report.results), report
    assert honest.all_passed, honest


def test_frames_of_the_server_are_not_reachable(one_slot: Sandbox) -> None:
    """The frames above the program's own hold nothing of any job: not the last reply, not the
    last request (the previous job's stdout was readable from the server loop's locals)."""
    secret = token()
    one_slot.run(f"print({secret!r})")
    probe = (
        "import sys\n"
        "frame, seen = sys._getframe(), []\n"
        "while frame is not None:\n"
        "    seen.append(repr(frame.f_locals))\n"
        "    frame = frame.f_back\n"
        "print('\\n'.join(seen))\n"
    )
    res = one_slot.run(probe, limits=Limits(timeout_s=10.0, output_bytes=1 << 24))
    assert res.status is Status.OK, res
    assert secret not in res.stdout
    assert "'stdout':" not in res.stdout  # no reply of any run up there


@pytest.mark.parametrize("seccomp", [True, False])
def test_abstract_socket_names_do_not_reach_the_next_job(
    seccomp: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With seccomp no socket can outlive its run (no SCM_RIGHTS), so the slot's network
    namespace stays empty between runs; without it each run gets a namespace of its own."""
    import sandbox.core

    if not seccomp:
        monkeypatch.setattr(sandbox.core, "_pyseccomp_path", lambda: None)
    with Sandbox(limits=Limits(timeout_s=10.0), workers=1) as box:
        if seccomp:
            require_any(box, "seccomp")
        else:
            assert "seccomp" not in box.isolation
        _abstract_sockets_attack(box)


def _abstract_sockets_attack(one_slot: Sandbox) -> None:
    require_any(one_slot, "net_ns")
    secret = token()
    leave = f"""
import os, socket, time
kept = []
for i in range(4):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(b"\\0" + {secret!r}.encode() + str(i).encode())
    kept.append(s)
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:  # leave it queued in flight, so that it outlives every process of the run
        socket.send_fds(a, [b"x"], [s.fileno(), a.fileno(), b.fileno()])
    except OSError as exc:
        print("queue refused", type(exc).__name__)
if os.fork() == 0:
    os.setsid()
    time.sleep(30)
print(open("/proc/net/unix").read())
"""
    first = one_slot.run(leave)
    assert first.status is Status.OK, first
    assert secret in first.stdout  # the run saw its own names
    own = token()
    look = (
        "import socket\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
        f"s.bind(b'\\0' + {own!r}.encode())\n"
        "print(open('/proc/net/unix').read())\n"
    )
    second = one_slot.run(look)
    assert second.status is Status.OK, second
    assert own in second.stdout and secret not in second.stdout


@contextlib.contextmanager
def host_sockets(folders: list[Path]) -> Iterator[list[tuple[socket.socket, Path]]]:
    """World-writable listening stream and datagram sockets in each folder (removed after)."""
    listeners: list[tuple[socket.socket, Path]] = []
    made: list[Path] = []
    try:
        for folder in folders:
            base = folder / f"grpo-sock-{os.getpid()}-{secrets.token_hex(3)}"
            base.mkdir()
            made.append(base)
            base.chmod(0o777)
            for kind, name in ((socket.SOCK_STREAM, "s.sock"), (socket.SOCK_DGRAM, "d.sock")):
                sock = socket.socket(socket.AF_UNIX, kind)
                sock.bind(str(base / name))
                (base / name).chmod(0o777)
                if kind == socket.SOCK_STREAM:
                    sock.listen(8)
                sock.setblocking(False)
                listeners.append((sock, base / name))
        yield listeners
    finally:
        for sock, path in listeners:
            sock.close()
            path.unlink(missing_ok=True)
        for base in made:
            with contextlib.suppress(OSError):
                base.rmdir()


def reach_program(paths: list[str]) -> str:
    """A program that tries every way to talk to each socket path; prints REACHED on success."""
    return f"""
import socket
for path in {paths!r}:
    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
        try:
            s = socket.socket(socket.AF_UNIX, kind)
        except OSError as exc:
            try:
                s, _ = socket.socketpair(socket.AF_UNIX, kind)
            except OSError:
                print("no socket", type(exc).__name__)
                continue
        for how in ("connect", "sendto", "sendmsg"):
            try:
                if how == "connect":
                    s.connect(path)
                    s.send(b"leak")
                elif how == "sendto":
                    s.sendto(b"leak", path)
                else:
                    s.sendmsg([b"leak"], [], 0, path)
                print("REACHED", path, how)
            except OSError as exc:
                print("refused", path, how, type(exc).__name__)
"""


def assert_nothing_arrived(listeners: list[tuple[socket.socket, Path]]) -> None:
    for sock, path in listeners:
        with contextlib.suppress(BlockingIOError):
            if sock.type == socket.SOCK_STREAM:
                sock.accept()
                raise AssertionError(f"a run connected to {path}")
            raise AssertionError(f"a run sent {sock.recv(100)!r} to {path}")


def writable(*folders: str) -> list[Path]:
    return [Path(f) for f in folders if os.path.isdir(f) and os.access(f, os.W_OK)]


@pytest.mark.parametrize("network", [False, True])
def test_host_unix_sockets_are_unreachable(network: bool, tmp_path: Path) -> None:
    """World-writable stream and datagram sockets in host folders a run can see (or that a
    host service would use) get nothing, with or without network; the next run is fine."""
    folders = [*writable("/usr/local/share", "/var/lib", "/var/cache", "/dev"), tmp_path]
    with host_sockets(folders) as listeners:
        limits = Limits(timeout_s=10.0, network=network)
        with Sandbox(limits=limits, workers=1) as box:
            require_any(box, "seccomp")
            res = box.run(reach_program([str(p) for _, p in listeners]))
            after = box.run("print('next')")
        assert res.status is Status.OK, res
        assert "REACHED" not in res.stdout, res.stdout
        assert after.stdout == "next\n"
        assert_nothing_arrived(listeners)


def test_without_seccomp_the_mount_namespace_still_hides_host_sockets(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The fallback layer on its own: sockets under /var, /run, /dev and the host's /tmp are
    out of sight (a socket in a folder a run must read, such as /usr, is not: see README)."""
    import sandbox.core

    monkeypatch.setattr(sandbox.core, "_pyseccomp_path", lambda: None)
    folders = [*writable("/var/lib", "/var/cache", "/run", "/dev"), tmp_path]
    with host_sockets(folders) as listeners:
        with Sandbox(limits=Limits(timeout_s=10.0), workers=1) as box:
            assert "seccomp" not in box.isolation
            require_any(box, "mount_ns")
            res = box.run(reach_program([str(p) for _, p in listeners]))
        assert res.status is Status.OK, res
        assert "REACHED" not in res.stdout, res.stdout
        assert "refused" in res.stdout
        assert_nothing_arrived(listeners)


def test_unix_sockets_inside_a_run_still_work(one_slot: Sandbox) -> None:
    """What honest programs use keeps working: socketpairs (asyncio's self-pipe) and binding."""
    code = (
        "import asyncio, socket\n"
        "a, b = socket.socketpair()\n"
        "a.sendall(b'ping')\n"
        "print(b.recv(4).decode())\n"
        "async def main():\n"
        "    await asyncio.sleep(0)\n"
        "    return 'loop'\n"
        "print(asyncio.run(main()))\n"
    )
    res = one_slot.run(code)
    assert (res.status, res.stdout) == (Status.OK, "ping\nloop\n"), res


# -- a caller's failure never shifts results --------------------------------------------------


def _interrupt_after(seconds: float) -> threading.Timer:
    """Ctrl-C for the main thread in ``seconds``: a real SIGINT, so a blocking wait is cut short
    (``_thread.interrupt_main`` would only be noticed once the wait ended).

    Python's own Ctrl-C handling is put back first: the signal disposition is process-wide, and
    a library loaded by an earlier test in this process may have replaced or blocked it.
    """
    main = threading.main_thread().ident
    assert main is not None
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    timer = threading.Timer(seconds, signal.pthread_kill, (main, signal.SIGINT))
    timer.start()
    return timer


def test_a_signal_handler_raising_mid_run_does_not_shift_results() -> None:
    def give_up(_signum: int, _frame: object) -> None:
        raise RuntimeError("the caller gave up")

    with Sandbox(limits=FAST, workers=1) as box:
        pids = server_pids(box)
        old = signal.signal(signal.SIGALRM, give_up)
        try:
            signal.setitimer(signal.ITIMER_REAL, 0.3)
            with pytest.raises(RuntimeError, match="gave up"):
                box.run("import time\ntime.sleep(1.0)\nprint('A')")
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
        assert box.run("print('B')").stdout == "B\n"
        assert box.run("print('C')").stdout == "C\n"
        assert server_pids(box) != pids  # the interrupted slot was replaced, not reused


def test_keyboard_interrupt_mid_run_tests_does_not_shift_results() -> None:
    slow = "import time\ntime.sleep(1.0)\ndef f(x):\n    return 'A'\n"
    with Sandbox(limits=FAST, workers=1) as box:
        timer = _interrupt_after(0.3)
        with pytest.raises(KeyboardInterrupt):
            box.run_tests(slow, [CallTest("assert f(0) == 'A'")], entry_point="f")
            time.sleep(5)  # only reached if the interrupt came after the call
        timer.cancel()
        report = box.run_tests(
            "def f(x):\n    return 'B'\n", [CallTest("assert f(0) == 'B'")], entry_point="f"
        )
        assert report.all_passed, report
        io = box.run_tests("print('C')", [IOTest("", "C\n")])
        assert io.all_passed, io
        assert box.run("print('D')").stdout == "D\n"


def test_interrupted_run_many_callers_keep_their_own_results() -> None:
    """Interrupt the main thread while worker threads are mid-call: every later result is the
    result of its own job."""
    with Sandbox(limits=FAST, workers=2) as box:
        timer = _interrupt_after(0.2)
        with pytest.raises(KeyboardInterrupt):
            box.run_many([f"import time\ntime.sleep(0.5)\nprint({i})" for i in range(6)])
            time.sleep(5)
        timer.cancel()
        outs = [r.stdout for r in box.run_many([f"print({i})" for i in range(10)])]
        assert outs == [f"{i}\n" for i in range(10)]


# -- limits the kernel and the supervisor's clocks cannot take --------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"timeout_s": 1e10}, {"timeout_s": float("nan")}, {"timeout_s": -1.0},
        {"timeout_s": 86_400.5}, {"timeout_s": True}, {"timeout_s": "5"},
        {"cpu_s": 1e12}, {"cpu_s": float("nan")}, {"cpu_s": 0},
        {"memory_mb": 1 << 40}, {"memory_mb": -5}, {"memory_mb": float("nan")},
        {"output_bytes": 1 << 40}, {"output_bytes": -1}, {"output_bytes": 2.0},
        {"max_processes": 1 << 40}, {"max_processes": -1}, {"max_processes": True},
        {"max_file_mb": 1 << 40}, {"max_file_mb": 0}, {"network": "yes"},
    ],
)  # fmt: skip
def test_limits_out_of_range_raise_value_error(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="Limits"):
        Limits(**kwargs)  # type: ignore[arg-type]


def test_huge_per_test_timeouts_raise_before_anything_is_sent(sb: Sandbox) -> None:
    pids = server_pids(sb)
    tests = [CallTest("assert f() == 1")]
    for bad in (1e12, float("nan"), float("inf"), -1.0, 0.0):
        with pytest.raises(ValueError, match="per_test_timeout_s"):
            sb.run_tests("def f():\n    return 1\n", tests, entry_point="f", per_test_timeout_s=bad)
        with pytest.raises(ValueError, match="per_test_timeout_s"):
            sb.run_tests("print(1)", [IOTest("", "1\n")], per_test_timeout_s=bad)
    # The largest accepted limits work end to end, and nothing was restarted on the way.
    day = Limits(timeout_s=86_400, cpu_s=86_400, output_bytes=1 << 27, max_file_mb=8)
    assert sb.run("print('ok')", limits=day).stdout == "ok\n"
    report = sb.run_tests(
        "def f():\n    return 1\n", tests * 3, entry_point="f", per_test_timeout_s=86_400
    )
    assert report.all_passed, report
    assert server_pids(sb) == pids


# -- per-job OOM accounting --------------------------------------------------------------------


def test_an_oom_kill_in_one_job_is_never_blamed_on_the_next(one_slot: Sandbox) -> None:
    require_any(one_slot, "cgroup")
    # Each child stays under RLIMIT_AS; together they pass the run's cgroup limit, so the OOM
    # killer takes one. The run itself waits for them and exits 0.
    oom = """
import os, time
kids = []
for _ in range(4):
    pid = os.fork()
    if pid == 0:
        block = bytearray(150 << 20)
        for i in range(0, len(block), 4096):
            block[i] = 1
        time.sleep(2)
        os._exit(0)
    kids.append(pid)
codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in kids]
print(codes)
"""
    first = one_slot.run(oom, limits=Limits(timeout_s=20.0, memory_mb=256, max_processes=16))
    assert first.status is Status.OK, first
    assert "-9" in first.stdout, first  # the OOM killer did strike (else this proves nothing)
    assert "OOM" in first.detail
    for code, status in (("import sys\nsys.exit(1)", Status.RUNTIME_ERROR), ("pass", Status.OK)):
        res = one_slot.run(code)
        assert res.status is status, res
        assert "OOM" not in res.detail


# -- untrusted text is made safe once, at the boundary ----------------------------------------


def _encodable(*texts: str) -> bool:
    for text in texts:
        text.encode("utf-8")  # raises on a lone surrogate
    return True


def test_lone_surrogates_never_leave_the_sandbox(sb: Sandbox) -> None:
    program = (
        "import sys\n"
        "sys.stdout.write(chr(0xD800) + 'out')\n"
        "sys.stderr.write(chr(0xDC80) + 'err')\n"
        "sys.stdout.flush()\n"
        "sys.stdout.buffer.write(b'\\xff\\xfe')\n"
        "def f(x):\n"
        "    if x == 0:\n"
        "        raise ValueError(chr(0xD800) + 'boom')\n"
        "    if x == 1:\n"
        "        raise KeyError(chr(0xDFFF))\n"
        "    return chr(0xDBFF) + 'ret'\n"
    )
    tests = [
        CallTest("f(0)"),
        CallTest("f(1)"),
        CallTest("assert f(2) == 'x', f(2)"),
        CallTest("assert f(2) == chr(0xDBFF) + 'ret'"),
    ]
    report = sb.run_tests(program, tests, entry_point="f")
    assert [r.status for r in report.results] == [
        TestStatus.RUNTIME_ERROR, TestStatus.RUNTIME_ERROR, TestStatus.FAILED, TestStatus.PASSED,
    ]  # fmt: skip
    assert "boom" in report.results[0].detail and "ret" in report.results[2].detail
    assert _encodable(report.stdout, report.stderr, *(r.detail for r in report.results))
    res = sb.run(program + "raise RuntimeError(chr(0xD800))\n")
    assert res.status is Status.RUNTIME_ERROR
    assert _encodable(res.stdout, res.stderr, res.detail)
    io = sb.run_tests(program, [IOTest("", chr(0xD800) + "want")])
    assert _encodable(io.stdout, io.stderr, *(r.detail for r in io.results))
    json.dumps([r.detail for r in report.results], ensure_ascii=False).encode("utf-8")


# -- close() leaves nothing behind ---------------------------------------------------------------


def _taken_again(uid: int) -> bool:
    """Whether another Sandbox on this machine holds ``uid`` now (it may, once we released it)."""
    import fcntl

    for lock_dir in _slot.LOCK_DIRS:
        try:
            fd = os.open(f"{lock_dir}/{uid}.lock", os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True
        finally:
            os.close(fd)
    return False


def _leftovers(uids: tuple[int, ...], servers: tuple[int, ...]) -> list[str]:
    uids = tuple(uid for uid in uids if not _taken_again(uid))
    found = [f"process {pid}" for pid in processes_of(uids)]
    for pid in servers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 0)
            found.append(f"server {pid}")
    for uid in uids:
        found += [p for p in _slot.cgroup_dirs(uid) if os.path.exists(p)]
        found += [f"{d}/{uid}.lock" for d in _slot.LOCK_DIRS if os.path.exists(f"{d}/{uid}.lock")]
        if os.path.exists(f"/tmp/grpo-sandbox-{uid}"):
            found.append(f"/tmp/grpo-sandbox-{uid}")
    return found


def test_close_leaves_nothing_behind() -> None:
    box = Sandbox(limits=FAST, workers=2)
    uids = box.uids
    templates = tuple(slot.template_pid for slot in box._all)  # type: ignore[attr-defined]
    box.run_many(["print(1)", "import os\nif os.fork() == 0:\n    os.setsid()\n    import time\n"
                  "    time.sleep(30)\n", "while True: pass"] * 2)  # fmt: skip
    box.run_tests("def f():\n    return 1\n", [CallTest("assert f() == 1")], entry_point="f")
    servers = server_pids(box) + templates
    box.close()
    if uids:
        assert _leftovers(uids, servers) == []
    else:  # without root: at least every process is gone
        assert _leftovers((), servers) == []


def test_close_after_an_interrupted_call_leaves_nothing_behind() -> None:
    box = Sandbox(limits=FAST, workers=1)
    uids = box.uids
    timer = _interrupt_after(0.3)
    with pytest.raises(KeyboardInterrupt):
        box.run("import time\ntime.sleep(2)")
        time.sleep(5)
    timer.cancel()
    servers = server_pids(box)
    box.close()
    assert _leftovers(uids, servers) == []


# -- the template never holds a job's data ------------------------------------------------------


def test_the_template_process_never_holds_any_job_data(one_slot: Sandbox) -> None:
    """Read from the host: the process every child is cloned from has no trace of any job."""
    secret = token()
    one_slot.run(f"print({secret!r})", stdin=secret, files={"a.txt": secret})
    one_slot.run_tests(
        f"def f():\n    return {secret!r}\n",
        [CallTest(f"assert f() == {secret!r}")],
        entry_point="f",
        setup=f"S = {secret!r}",
    )
    one_slot.run_tests(f"print({secret!r})", [IOTest(secret, secret)])
    template = one_slot._all[0].template_pid  # type: ignore[attr-defined]
    assert template > 0
    needle = secret.encode()
    with open(f"/proc/{template}/maps") as maps:
        regions = [line.split()[:2] for line in maps]
    fd = os.open(f"/proc/{template}/mem", os.O_RDONLY)
    scanned = 0
    try:
        for span, perms in regions:
            lo, hi = (int(x, 16) for x in span.split("-"))
            if not perms.startswith("r") or hi - lo > (256 << 20):
                continue
            try:
                blob = os.pread(fd, hi - lo, lo)
            except OSError:
                continue
            scanned += len(blob)
            assert needle not in blob, f"job data in the template at {span}"
    finally:
        os.close(fd)
    assert scanned > 1 << 20
