"""Helpers shared by the sandbox tests (imported as a top-level module by pytest's rootdir logic).

``tests/conftest.py`` puts ``tests/`` on ``sys.path``, where this folder (no ``__init__.py``)
would shadow the real ``sandbox`` package as a namespace package. Importing this module first
imports the real package with such folders hidden, so later ``import sandbox`` hits the cache.
"""

from __future__ import annotations

import importlib
import os
import socket
import sys
from pathlib import Path


def _import_real_sandbox() -> None:
    module = sys.modules.get("sandbox")
    if module is not None and getattr(module, "__file__", None):
        return
    sys.modules.pop("sandbox", None)
    saved = sys.path[:]

    def shadows(entry: str) -> bool:
        folder = os.path.join(entry or ".", "sandbox")
        return os.path.isdir(folder) and not os.path.isfile(os.path.join(folder, "__init__.py"))

    sys.path[:] = [entry for entry in sys.path if not shadows(entry)]
    try:
        importlib.import_module("sandbox")
    finally:
        sys.path[:] = saved


_import_real_sandbox()

from sandbox import Limits  # noqa: E402

CANARY_ENV = "GRPO_SANDBOX_TEST_SECRET"
CANARY_VALUE = "canary-7f3a9c1e-do-not-leak"
FAST = Limits(timeout_s=3.0, memory_mb=512, output_bytes=1 << 16, max_processes=32, max_file_mb=8)


def processes_of(uids: tuple[int, ...], prepared_by: tuple[int, ...] = ()) -> list[int]:
    """Pids of live (non-zombie) processes whose real uid is one of ``uids``.

    Direct children of the slot servers ``prepared_by`` are skipped: each server keeps one
    isolated child prepared (as its slot uid) for the next run.
    """
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        uid = int(fields.get("Uid", "-1").split()[0])
        ppid = int(fields.get("PPid", "0").strip() or 0)
        if ppid in prepared_by:
            continue
        if uid in uids and not fields.get("State", "").strip().startswith("Z"):
            found.append(int(entry))
    return found


def server_pids(box: object) -> tuple[int, ...]:
    """The slot-server pids of a Sandbox (test-only peek at a private attribute)."""
    return tuple(slot.proc.pid for slot in box._all)  # type: ignore[attr-defined]


def require_any(box: object, *layers: str) -> None:
    """Skip the calling test unless the sandbox applies at least one of ``layers``.

    An attack is only expected to fail when some layer stops it; on hosts without any of them
    (no root, old kernel) the test says so instead of failing or harming the host.
    """
    import pytest

    if not set(layers) & set(box.isolation):  # type: ignore[attr-defined]
        pytest.skip(f"needs one of the layers {layers} (have {box.isolation})")  # type: ignore[attr-defined]


def drain_listener(listener: socket.socket) -> list[bytes]:
    """Accept whatever reached ``listener`` (until its timeout), then close it.

    The first bytes of each connection: what a run that should have no network got through.
    """
    accepted = []
    try:
        while True:
            conn, _ = listener.accept()
            accepted.append(conn.recv(100))
    except (TimeoutError, OSError):
        pass
    finally:
        listener.close()
    return accepted
