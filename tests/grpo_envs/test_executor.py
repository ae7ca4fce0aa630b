"""The killable worker pool: a worker starts whatever its interpreter imported at start-up."""

from __future__ import annotations

import sys

from grpo_envs.executor import ReplyStatus, WorkerPool


def echo():
    """A worker target: the handler returns its request."""
    return lambda request: ("echo", request)


def test_a_worker_starts_in_an_interpreter_whose_startup_imported_nothing(tmp_path, monkeypatch):
    # Without site hooks (no setuptools .pth in the venv, or -S) the standard library's `types`
    # is not loaded when the worker script starts: grpo_envs/types.py, beside the script, must
    # not stand in for it.
    python = tmp_path / "python-without-site"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')
    python.chmod(0o755)
    monkeypatch.setenv("GRPO_MATH_PYTHON", str(python))
    pool = WorkerPool(f"{__name__}:echo", 1)
    try:
        reply = pool.call(7, timeout_s=60)
    finally:
        pool.close()
    assert reply.status is ReplyStatus.OK, reply.detail
    assert reply.value == ("echo", 7)
