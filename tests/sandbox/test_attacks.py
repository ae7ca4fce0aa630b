"""The adversarial suite: each attack has an asserted outcome, and the host is checked after."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import threading
from pathlib import Path

import pytest
from sandbox_helpers import CANARY_ENV, CANARY_VALUE, FAST, drain_listener, require_any, server_pids

from sandbox import CallTest, Limits, Sandbox, Status, TestJob


def test_infinite_loop_times_out_on_time(sb: Sandbox) -> None:
    limits = Limits(timeout_s=1.0, memory_mb=256)
    res = sb.run("while True:\n    pass\n", limits=limits)
    # Killed by the supervisor for the wall-clock limit (not the CPU limit, not by itself).
    # No absolute bound on the time it took: on a loaded machine that is noise.
    assert res.status is Status.TIMEOUT
    assert res.exit_code == -signal.SIGKILL
    assert res.detail == "wall-clock limit of 1 s"
    assert res.wall_s < 10 * limits.timeout_s


def test_ignored_sigalrm_does_not_help(sb: Sandbox) -> None:
    code = (
        "import signal\n"
        "signal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "signal.alarm(1)\n"
        "while True:\n    pass\n"
    )
    res = sb.run(code, limits=Limits(timeout_s=1.0))
    assert res.status is Status.TIMEOUT
    assert res.detail == "wall-clock limit of 1 s"  # the supervisor's clock, not an alarm
    assert res.wall_s < 10.0


def test_cpu_limit_kills_busy_loop(sb: Sandbox) -> None:
    res = sb.run("while True:\n    pass\n", limits=Limits(timeout_s=20.0, cpu_s=1.0))
    assert res.status is Status.TIMEOUT
    assert "CPU" in res.detail  # the kernel's RLIMIT_CPU, not the (much later) wall clock


def test_fork_bomb_is_bounded(sb: Sandbox) -> None:
    require_any(sb, "uid", "cgroup")
    code = (
        "import os, time\n"
        "n = 0\n"
        "for _ in range(500):\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError:\n"
        "        break\n"
        "    if pid == 0:\n"
        "        time.sleep(60)\n"
        "        os._exit(0)\n"
        "    n += 1\n"
        "print(n, flush=True)\n"
    )
    res = sb.run(code, limits=Limits(timeout_s=5.0, max_processes=16))
    assert res.status is Status.OK, res
    assert int(res.stdout) < 16  # the 17th process was refused
    # ``ok``, not ``timeout``: the sleeping children did not keep the run alive to its limit.


def test_memory_bomb(sb: Sandbox) -> None:
    res = sb.run("x = bytearray(4 << 30)\n", limits=Limits(memory_mb=256))
    assert res.status is Status.MEMORY
    grow = "blocks = []\nwhile True:\n    blocks.append(bytearray(16 << 20))\n"
    res = sb.run(grow, limits=Limits(memory_mb=256, timeout_s=5.0))
    assert res.status is Status.MEMORY


def test_memory_bomb_across_processes_hits_cgroup(sb: Sandbox) -> None:
    if "cgroup" not in sb.isolation:
        pytest.skip("no cgroup layer on this machine")
    # Each child stays under RLIMIT_AS, together they exceed the cgroup limit.
    code = (
        "import os, time\n"
        "for _ in range(8):\n"
        "    if os.fork() == 0:\n"
        "        x = bytearray(200 << 20)\n"
        "        for i in range(0, len(x), 4096): x[i] = 1\n"
        "        time.sleep(30)\n"
        "        os._exit(0)\n"
        "time.sleep(30)\n"
    )
    res = sb.run(code, limits=Limits(memory_mb=256, timeout_s=4.0, max_processes=16))
    assert res.status in (Status.MEMORY, Status.TIMEOUT)
    assert res.status is not Status.OK


def test_output_flood_is_capped_and_killed(sb: Sandbox) -> None:
    res = sb.run("while True:\n    print('x' * 1000)\n", limits=Limits(output_bytes=1 << 16))
    assert res.status is Status.OUTPUT_LIMIT
    assert res.truncated
    assert len(res.stdout) + len(res.stderr) <= 1 << 16
    assert res.wall_s < Limits().timeout_s  # killed for its output, long before its time limit


def test_huge_file_write_fails(sb: Sandbox) -> None:
    code = (
        "data = b'x' * (1 << 20)\n"
        "try:\n"
        "    with open('big.bin', 'wb') as f:\n"
        "        for _ in range(200):\n"
        "            f.write(data)\n"
        "except OSError as e:\n"
        "    print('refused', e.errno)\n"
    )
    free_before = shutil.disk_usage("/").free
    res = sb.run(code, limits=Limits(max_file_mb=8))
    assert res.status is Status.OK
    assert res.stdout.startswith("refused")
    assert shutil.disk_usage("/").free > free_before - (32 << 20)


def test_writes_and_deletes_outside_workdir_fail(sb: Sandbox, canary: Path) -> None:
    require_any(sb, "landlock")  # the canary is world-writable on purpose
    code = f"""
import os
target = {str(canary)!r}
outcomes = []
for action in (
    lambda: open(target, "w").write("pwned"),
    lambda: os.remove(target),
    lambda: os.rename(target, target + ".x"),
    lambda: open(os.path.dirname(target) + "/new.txt", "w").write("x"),
    lambda: open("/etc/passwd", "a").write("x"),
    lambda: os.mkdir("/usr/local/evil"),
):
    try:
        action()
        outcomes.append("ok")
    except OSError as e:
        outcomes.append(type(e).__name__)
print(outcomes)
open("inside.txt", "w").write("fine")
print(open("inside.txt").read())
"""
    res = sb.run(code)
    assert res.status is Status.OK, res
    assert "'ok'" not in res.stdout
    assert res.stdout.strip().endswith("fine")
    assert canary.read_text() == "precious"


def test_environment_secrets_do_not_leak(sb: Sandbox) -> None:
    require_any(sb, "landlock", "uid", "pid_ns")  # /proc/<parent>/environ
    code = """
import os
found = [str(os.environ)]
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            found.append(open(f"/proc/{pid}/environ", "rb").read().decode(errors="replace"))
        except OSError:
            pass
print("\\n".join(found))
"""
    assert os.environ[CANARY_ENV] == CANARY_VALUE
    res = sb.run(code)
    assert res.status is Status.OK
    assert CANARY_VALUE not in res.stdout + res.stderr
    assert CANARY_ENV not in res.stdout + res.stderr


def test_host_processes_invisible_and_secret_files_unreadable(sb: Sandbox) -> None:
    require_any(sb, "pid_ns")
    require_any(sb, "mount_ns")
    code = f"""
import os
pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
print("pids", pids)
print("host pid visible", os.path.exists("/proc/{os.getpid()}/environ"))
for path in ("/etc/shadow", "/root/.bashrc", "/work", "/root", "/home", "/run/secrets"):
    try:
        if os.path.isdir(path):
            print(path, "listing", os.listdir(path))
        else:
            print(path, "read", len(open(path).read()))
    except OSError as e:
        print(path, type(e).__name__)
"""
    res = sb.run(code)
    assert res.status is Status.OK, res
    out = res.stdout
    assert "pids [1]" in out  # only itself: a private PID namespace with a fresh /proc
    assert "/etc/shadow PermissionError" in out
    for line in out.splitlines():
        if " listing " in line:
            assert line.endswith("listing []"), line  # hidden or denied, never content


def test_network_is_unreachable_and_host_listener_gets_nothing(sb: Sandbox) -> None:
    require_any(sb, "net_ns", "seccomp")
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(5)
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    code = f"""
import socket
for addr in (("127.0.0.1", {port}), ("1.1.1.1", 80), ("8.8.8.8", 53)):
    try:
        s = socket.create_connection(addr, timeout=1)
        s.sendall(b"exfiltrated")
        print("connected", addr)
    except OSError as e:
        print("refused", addr, type(e).__name__)
try:
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.sendto(b"x", ("127.0.0.1", {port}))
    print("udp sent")
except OSError as e:
    print("udp refused", type(e).__name__)
"""
    res = sb.run(code)
    accepted = drain_listener(listener)
    assert res.status is Status.OK, res
    assert "connected" not in res.stdout
    assert "udp sent" not in res.stdout
    assert accepted == []


def test_killing_parent_group_and_everyone_fails(sb: Sandbox) -> None:
    require_any(sb, "pid_ns", "uid")  # else kill(-1) could reach this very test process
    me = os.getpid()
    code = f"""
import os, signal
for target in ({me}, os.getppid(), 0, -1, -{os.getpgid(0)}):
    try:
        os.kill(target, signal.SIGKILL)
        print("sent", target)
    except OSError as e:
        print("denied", target, type(e).__name__)
"""
    res = sb.run(code)
    # We are alive to assert this. kill(0)/kill(-1) may only hit the run's own processes.
    assert f"sent {me}" not in res.stdout
    assert f"sent -{os.getpgid(0)}" not in res.stdout
    assert sb.run("print('still serving')").stdout == "still serving\n"


def test_sibling_sandboxes_survive_a_killer(sb: Sandbox) -> None:
    require_any(sb, "pid_ns", "uid")
    killer = """
import os, signal, time
time.sleep(0.3)
for pid in range(2, 400000):
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
os.kill(-1, signal.SIGKILL)
"""
    sleeper = "import time\ntime.sleep(1.0)\nprint('survived')\n"
    results = sb.run_many([sleeper, killer])
    assert results[0].status is Status.OK
    assert results[0].stdout == "survived\n"


def test_double_fork_daemon_dies_with_the_run(sb: Sandbox) -> None:
    code = """
import os, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        # Keeps stdout open and outlives its parents: a plain subprocess.run would hang.
        while True:
            print("daemon alive", flush=True)
            time.sleep(0.05)
    os._exit(0)
time.sleep(0.2)
print("main done", flush=True)
"""
    res = sb.run(code, limits=Limits(timeout_s=5.0))
    assert res.status is Status.OK  # not ``timeout``: the daemon did not hold the run open
    assert "main done" in res.stdout
    # The autouse fixture then asserts that no process of the sandbox uids is left.


def test_privileged_syscalls_are_refused(sb: Sandbox) -> None:
    require_any(sb, "seccomp")
    code = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
out = {}
out["ptrace_traceme"] = libc.ptrace(0, 0, None, None)
out["ptrace_attach_1"] = libc.ptrace(16, 1, None, None)
out["mount"] = libc.mount(b"none", b"/tmp", b"tmpfs", 0, None)
out["unshare_user"] = libc.unshare(0x10000000)
out["unshare_net"] = libc.unshare(0x40000000)
out["setns"] = libc.setns(0, 0)
out["bpf"] = libc.syscall(321, 0, None, 0)
out["keyctl"] = libc.syscall(250, 0, 0, 0, 0, 0)
for name, fn in (("setuid", lambda: os.setuid(0)), ("setgid", lambda: os.setgid(0)),
                 ("chroot", lambda: os.chroot("/tmp"))):
    try:
        fn()
        out[name] = 0
    except OSError:
        out[name] = -1
print(out)
print("uid", os.getuid(), os.geteuid())
"""
    res = sb.run(code)
    assert res.status is Status.OK, res
    values = eval(res.stdout.splitlines()[0])  # our own dict literal of ints
    assert all(v == -1 for v in values.values()), values
    if "uid" in sb.isolation:
        assert "uid 0 " not in res.stdout


def test_hundred_thousand_threads(sb: Sandbox) -> None:
    # Small stacks: memory (1 GiB of 8 MiB stacks) would stop the threads long before the process
    # limit, and the test would pass whatever max_processes does.
    code = """
import threading, time
threading.stack_size(256 << 10)
started = 0
try:
    for _ in range(100_000):
        t = threading.Thread(target=time.sleep, args=(5,), daemon=True)
        t.start()
        started += 1
except RuntimeError:
    pass
print(started, flush=True)
"""
    started = {}
    for limit in (32, 64):
        res = sb.run(code, limits=Limits(timeout_s=5.0, max_processes=limit))
        assert res.status is Status.OK, res  # refused threads, not a hang to the timeout
        started[limit] = int(res.stdout)
    # A thread is a task: the main thread and the started ones stay within max_processes, and a
    # higher limit lets more start (the limit, not something else, stopped the first run).
    assert started[32] < 32 < started[64] < 64, started


def test_dev_shm_filling_is_private_and_capped(sb: Sandbox) -> None:
    require_any(sb, "mount_ns", "landlock")
    before = shutil.disk_usage("/dev/shm").used if os.path.isdir("/dev/shm") else 0
    code = """
import os
written = 0
try:
    with open("/dev/shm/fill", "wb") as f:
        for _ in range(256):
            f.write(b"x" * (1 << 20))
            written += 1
except OSError as e:
    print("stopped", type(e).__name__)
print("written_mb", written)
"""
    res = sb.run(code, limits=Limits(max_file_mb=512, memory_mb=1024))
    assert res.status is Status.OK, res
    assert "stopped" in res.stdout
    assert int(res.stdout.split("written_mb")[1]) < 256
    assert not os.path.exists("/dev/shm/fill")
    if os.path.isdir("/dev/shm"):
        # Other processes write /dev/shm too (a test running beside this one: a vLLM engine's
        # buffers): a larger use counts only if the sandbox's uids own it.
        grown = shutil.disk_usage("/dev/shm").used - before
        assert grown < (8 << 20) or _bytes_owned_by("/dev/shm", sb.uids) < (8 << 20)


def _bytes_owned_by(root: str, uids: tuple[int, ...]) -> int:
    """Bytes of the files under ``root`` that one of ``uids`` owns."""
    total = 0
    for folder, _, files in os.walk(root):
        for name in files:
            try:
                st = os.lstat(os.path.join(folder, name))
            except OSError:
                continue
            total += st.st_size if st.st_uid in uids else 0
    return total


def test_strict_mode_refuses_missing_layers() -> None:
    with Sandbox(limits=FAST, workers=1) as probe:
        available = set(probe.isolation)
    from sandbox import ALL_LAYERS, SandboxUnavailableError

    missing = [layer for layer in ALL_LAYERS if layer not in available]
    if missing:
        with pytest.raises(SandboxUnavailableError):
            Sandbox(limits=FAST, workers=1, strict=True)
    else:
        with Sandbox(limits=FAST, workers=1, strict=True) as strict:
            res = strict.run("print(1)")
            assert res.status is Status.OK
            assert set(res.isolation) == set(ALL_LAYERS)


def test_concurrent_callers_share_the_pool(sb: Sandbox) -> None:
    servers = server_pids(sb)  # more callers than slots: they queue for these, none is added
    assert len(servers) < 6
    out: list[str] = []

    def worker(i: int) -> None:
        out.append(sb.run(f"print({i})").stdout.strip())

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(out, key=int) == [str(i) for i in range(6)]
    assert server_pids(sb) == servers


def test_consecutive_runs_of_one_slot_share_nothing() -> None:
    """State a slot server sets up once (its mount namespace with the hidden host folders, the
    Landlock rules' O_PATH fds, the network namespace) is reused by every run of that slot:
    nothing one run leaves there may reach the next, and the inherited fds are closed."""
    leave = """
import os, socket
open("/tmp/left-behind", "w").write("x")
open("/dev/shm/left-behind", "w").write("x")
for folder in ("/work", "/root", "/run"):
    try:
        open(folder + "/left-behind", "w").write("x")
        print("wrote", folder)
    except OSError:
        pass
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind("\\0grpo-left-behind")
s.listen(1)
if os.fork() == 0:  # a daemon holding the socket
    os.setsid()
    import time
    time.sleep(30)
print("left")
"""
    look = """
import os, socket
print("fds", max(int(fd) for fd in os.listdir("/proc/self/fd")))
print("tmp", os.listdir("/tmp"), "shm", os.listdir("/dev/shm"))
for folder in ("/work", "/root", "/run"):
    print(folder, os.path.exists(folder + "/left-behind"))
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.connect("\\0grpo-left-behind")
    print("connected")
except OSError as exc:
    print("socket gone", type(exc).__name__)
"""
    with Sandbox(limits=FAST, workers=1) as box:  # one slot: both runs use the same slot server
        first = box.run(leave)
        assert first.status is Status.OK, first
        assert "wrote" not in first.stdout
        second = box.run(look)
    assert second.status is Status.OK, second
    lines = dict(line.split(" ", 1) for line in second.stdout.splitlines())
    # 0-2, plus the fd of the /proc/self/fd listing itself: no inherited Landlock path fds.
    assert int(lines["fds"]) <= 3, second
    assert lines["tmp"] == "[] shm []"
    assert lines["/work"] == lines["/root"] == lines["/run"] == "False"
    assert lines["socket"].startswith("gone"), second


def test_run_killed_before_it_starts_spares_the_verdict_server() -> None:
    """A run whose wall clock ends while its child is still being set up (here: writing 3,000
    input files) reports no layers; it once made the slot server clean up as if there were no
    PID namespace and kill its whole cgroup, verdict server included, so that the next
    ``run_tests`` failed with a broken pipe."""
    job = TestJob("def f(x):\n    return x + 1\n", (CallTest("assert f(1) == 2"),), entry_point="f")
    with Sandbox(limits=FAST, workers=1) as box:  # one slot: the same verdict server throughout
        assert box.run_tests_many([job])[0].all_passed
        files = {f"f{i}.txt": "x" for i in range(3000)}
        res = box.run("print(1)", files=files, limits=Limits(timeout_s=0.001))
        assert res.status is Status.TIMEOUT, res
        report = box.run_tests_many([job])[0]
    assert report.all_passed, report
