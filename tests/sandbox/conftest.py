"""Shared fixtures: one Sandbox per module, canaries, and host checks after every attack."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from sandbox_helpers import CANARY_ENV, CANARY_VALUE, FAST, processes_of, server_pids

from sandbox import Sandbox


@pytest.fixture(scope="module")
def sb() -> Iterator[Sandbox]:
    # The canary is in THIS process's environment before the slot servers start.
    os.environ[CANARY_ENV] = CANARY_VALUE
    with Sandbox(limits=FAST, workers=2) as box:
        yield box
    os.environ.pop(CANARY_ENV, None)


@pytest.fixture
def canary(tmp_path: Path) -> Iterator[Path]:
    """A host file the sandbox can see but must neither change nor delete.

    It sits in a world-writable directory under /usr (visible inside the sandbox), so file
    permissions do not protect it: only Landlock (and the uid for the parent dir) do.
    """
    base = Path("/usr/local/share")
    folder = base / f"grpo-sandbox-canary-{os.getpid()}" if os.access(base, os.W_OK) else tmp_path
    folder.mkdir(exist_ok=True)
    path = folder / "canary.txt"
    path.write_text("precious")
    os.chmod(folder, 0o777)
    os.chmod(path, 0o666)
    yield path
    try:
        assert path.read_text() == "precious"
        assert sorted(p.name for p in folder.iterdir()) == ["canary.txt"]
    finally:
        if folder != tmp_path:
            shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(autouse=True)
def no_leftovers(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each test: no process of the sandbox's uids survives its run."""
    yield
    if "sb" in request.fixturenames:
        box: Sandbox = request.getfixturevalue("sb")
        assert processes_of(box.uids, server_pids(box)) == []
