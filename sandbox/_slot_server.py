"""The slot server S: one per worker slot, serving the library's requests (its entry point).

Started by ``sandbox.core`` as ``/usr/bin/python3 -I -S _slot_server.py CONFIG`` with an EMPTY
environment, so no process below it can inherit a secret. Standard library only (plus
pyseccomp, loaded by file path in a throw-away child). It serves one request at a time over
length-prefixed JSON frames on stdin/stdout; every reply echoes its request's ``id``.

    slot server S (trusted, root)   holds the jobs; supervises: output caps, wall clock,
                                    reaping, OOM counts, verdict rounds (``_supervise``,
                                    ``_calltests``)
      T template (trusted)          a fresh interpreter started before any job; clones every C
                                    and V on a one-byte command and never sees a job
                                    (``_template``)
      C one child per run           a child of S (CLONE_PARENT), pid 1 of a fresh PID
                                    namespace; gets its kind of run, then its program, from S
                                    directly (``_spawn``, ``_child``)
      V verdict server (trusted)    run_tests only, unprivileged uid, long-lived: runs the
                                    TRUSTED test code against proxies that call C's function
                                    over a private socket (``_verdict_server``, ``_verdict``)

Slot resources (uid pair, cgroups) are in ``_slot``, the seccomp policy in ``_seccomp``.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import sys
import time
import traceback
import types

if __name__ == "__main__" and "sandbox" not in sys.modules:
    # Run as a script under -I -S: make the sibling modules importable as ``sandbox._x``
    # without executing the package's ``__init__`` (the library side, with its heavy imports).
    _package = types.ModuleType("sandbox")
    _package.__path__ = [os.path.dirname(os.path.abspath(__file__))]
    sys.modules["sandbox"] = _package

from sandbox import _codec, _runspec
from sandbox._calltests import handle_tests
from sandbox._slot_state import SlotState
from sandbox._supervise import Supervisor, classify, decode_output

_PROBE_LIMITS = {
    "timeout_s": 10, "cpu_s": 5, "memory_mb": 512, "output_bytes": 1024,
    "max_processes": 8, "max_file_mb": 1, "network": False,
}  # fmt: skip


def handle_run(server: SlotState, req: dict[str, object]) -> dict[str, object]:
    """Run one program; the reply mirrors ``sandbox.ExecResult``."""
    spec = _runspec.RunSpec(req)
    start = time.monotonic()
    child = server.spawn(spec)
    # The child has its own copy now: free ours (up to 64 MiB, charged to the run's cgroup).
    req.clear()
    spec.code = spec.stdin = ""
    spec.files = {}
    server.prepare_next(child)
    sup = Supervisor(child, spec.output_bytes, server.cleanup)
    try:
        sup.loop(start + spec.timeout_s)
    finally:
        server.cleanup(child)
        child.close()
    status, detail, code = classify(sup, spec, server.res.oom_kills_of_job())
    return {
        "status": status,
        "stdout": decode_output(sup.out, spec.output_bytes),
        "stderr": decode_output(sup.err, spec.output_bytes),
        "exit_code": code if status != "sandbox_error" else None,
        "wall_s": time.monotonic() - start,
        "isolation": child.layers,
        "truncated": sup.truncated,
        "detail": detail,
    }


def _terminate(_signum: int, _frame: object) -> None:
    """SIGTERM from the library (an abandoned call): unwind, so that ``finally`` cleans up."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: never cut the clean-up short
    raise SystemExit(0)


def main() -> None:
    """Serve requests until stdin closes (or SIGTERM)."""
    config = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    # Keep the protocol on private fds; 0/1 become /dev/null so nothing can corrupt the stream.
    req_fd = fcntl.fcntl(0, fcntl.F_DUPFD_CLOEXEC, 10)
    rep_fd = fcntl.fcntl(1, fcntl.F_DUPFD_CLOEXEC, 10)
    null = os.open("/dev/null", os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    if not config.get("debug"):
        os.dup2(null, 2)
    os.close(null)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _terminate)
    pyseccomp = config.get("pyseccomp")
    exposed = config.get("expose_dirs")
    server = SlotState(
        pyseccomp if isinstance(pyseccomp, str) else None,
        [str(d) for d in exposed] if isinstance(exposed, list) else [],
    )
    try:
        _serve(server, config, req_fd, rep_fd)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        server.close()


def _serve(server: SlotState, config: dict[str, object], req_fd: int, rep_fd: int) -> None:
    probe = handle_run(server, {"code": "pass", "limits": _PROBE_LIMITS})
    if probe["status"] != "ok":
        # Most likely mounts are refused here: retry without the mount namespace.
        server.spawner.use_mount_ns = False
        probe = handle_run(server, {"code": "pass", "limits": _PROBE_LIMITS})
    hello = {
        "op": "hello",
        "isolation": list(probe["isolation"]),  # type: ignore[call-overload]
        "probe_status": probe["status"],
        "probe_detail": probe["detail"],
        "uid": server.res.uid,
        "pid": os.getpid(),
        "template_pid": server.template.pid,
    }
    default = config.get("default_limits")
    if isinstance(default, dict):
        server.spawner.last_key = (
            bool(default.get("network")),
            int(default.get("max_file_mb", 64)),
        )
        server.spawner.prewarm()
    server.verdict_server()
    _codec.write_frame(rep_fd, _codec.dumps(hello))
    while True:
        raw = _codec.read_frame(req_fd, 1 << 30)
        if raw is None:
            return
        req = json.loads(raw)
        del raw
        op = req.get("op")
        request_id = req.get("id")
        try:
            if op == "run":
                reply = handle_run(server, req)
            elif op == "tests":
                reply = handle_tests(server, req)
            else:
                reply = {"error": f"unknown op {op!r}"}
        except Exception as exc:
            reply = {"error": f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"[:4000]}
        reply["id"] = request_id
        _codec.write_frame(rep_fd, _codec.dumps(reply))
        del req, reply
        server.spawner.prewarm()  # unless prepared during the run (``SlotState.prepare_next``)


if __name__ == "__main__":
    main()
