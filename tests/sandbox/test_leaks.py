"""Runs in a row leak no processes, fds, temp dirs or memory (the 1,000-run test is slow)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from sandbox_helpers import processes_of, server_pids

from sandbox import CallTest, Job, Limits, Sandbox, Status, TestJob, TestStatus

SHORT = Limits(timeout_s=0.3, memory_mb=256, output_bytes=1 << 14, max_processes=16)
MIXED = [
    Job("print('ok')"),
    Job("1/0"),
    Job("while True: pass", limits=SHORT),
    Job("while True: print('x' * 100)", limits=SHORT),
    Job("x = bytearray(1 << 30)", limits=SHORT),
    Job("import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(30)\nprint(1)"),
    Job("open('f.txt', 'w').write('x' * 1000)\nimport os\nos.mkdir('d')"),
    Job("import threading, time\nfor _ in range(8):\n    threading.Thread(target=time.sleep,"
        " args=(10,), daemon=True).start()"),
    Job("print(input())", stdin="echo\n"),
    Job("import os\nfd = os.open('/tmp/held', os.O_CREAT | os.O_WRONLY)\nos._exit(0)"),
]  # fmt: skip
TESTS = TestJob(
    "def f(x):\n    return x + 1\n",
    (CallTest("assert candidate(1) == 2"), CallTest("assert f(2) == 4")),
    entry_point="f",
)


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        try:
            kids = Path(f"/proc/{current}/task/{current}/children").read_text().split()
        except OSError:
            continue
        out += [int(k) for k in kids]
        todo += [int(k) for k in kids]
    return out


def settle(servers: list[int]) -> None:
    """Each server prepares its next child right after replying: wait until all have one."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        # the template, the verdict server and the prepared child, each ready (blocked)
        kids = [descendants(s) for s in servers]
        if all(len(k) == 3 for k in kids):
            fds = [fd_count(s) for s in servers]
            time.sleep(0.2)
            if fds == [fd_count(s) for s in servers]:
                return
        time.sleep(0.05)


def snapshot(box: Sandbox) -> dict[str, int]:
    servers = [slot.proc.pid for slot in box._all]
    settle(servers)
    tree = [p for s in servers for p in descendants(s)]
    return {
        "parent_fds": fd_count(os.getpid()),
        "server_fds": sum(fd_count(p) for p in servers),
        "server_rss_kb": sum(rss_kb(p) for p in servers + tree),
        "tree_size": len(tree),  # the templates, verdict servers and prepared children
        "tmp_entries": len([e for e in os.listdir("/tmp") if e.startswith("grpo-sandbox")]),
    }


@pytest.mark.slow
def test_thousand_mixed_runs_leak_nothing() -> None:
    with Sandbox(limits=Limits(timeout_s=5.0, memory_mb=512), workers=2) as box:
        box.run_many(MIXED)  # warm up (allocator arenas, verdict servers)
        box.run_tests_many([TESTS, TESTS])
        before = snapshot(box)
        statuses: list[Status] = []
        for _ in range(9):  # 9 x (100 runs + 10 run_tests jobs) = 990 + 20 warm-up
            statuses += [r.status for r in box.run_many(MIXED * 10)]
            reports = box.run_tests_many([TESTS] * 10)
            assert all(r.passed == 1 for r in reports)
        after = snapshot(box)
        assert processes_of(box.uids, server_pids(box)) == []
        assert statuses.count(Status.OK) >= 9 * 10 * 5
        assert Status.TIMEOUT in statuses and Status.OUTPUT_LIMIT in statuses
        assert after["parent_fds"] == before["parent_fds"]
        assert after["server_fds"] == before["server_fds"]
        assert after["tree_size"] == before["tree_size"]
        assert after["tmp_entries"] <= before["tmp_entries"]
        assert after["server_rss_kb"] < before["server_rss_kb"] + 20_000


def _resident_kb(uid: int) -> int:
    """Resident memory of the processes of ``uid`` (the verdict server's uid), in KiB."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if int(fields["Uid"].split()[0]) == uid and "VmRSS" in fields:
            total += int(fields["VmRSS"].split()[0])
    return total


def test_verdict_server_returns_the_memory_of_huge_values() -> None:
    """A candidate returning ~6 MB of values left 5-11 MB in the verdict server's heap."""
    program = "def f(x):\n    return [str(i) * 4 for i in range(200_000)] if x else 0\n"
    with Sandbox(workers=1) as box:
        if not box.uids:
            pytest.skip("needs the per-slot uids (root)")
        verdict_uid = box.uids[0] + 1  # the slot's second uid (``_slot.SlotResources``)
        box.run_tests(program, [CallTest("assert candidate(0) == 0")], entry_point="f")
        before = _resident_kb(verdict_uid)
        for _ in range(2):
            report = box.run_tests(program, [CallTest("assert candidate(1) == 4")], entry_point="f")
            assert report.results[0].status is TestStatus.FAILED
        assert _resident_kb(verdict_uid) - before < 3 << 10
