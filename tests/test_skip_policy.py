"""The skip policy (skip_policy.py) on tiny pytest sessions run in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from skip_policy import FAIL_ON_SKIP

TESTS = Path(__file__).resolve().parent

FILES = {
    # The policy as tests/conftest.py installs it.
    "conftest.py": "from skip_policy import install\n\n"
    "def pytest_configure(config):\n    install(config)\n",
    "test_plain.py": "import pytest\n\n"
    "def test_runs():\n    pass\n\n"
    "def test_needs_a_package():\n    pytest.skip('trl not installed')\n\n"
    "@pytest.mark.xfail(reason='a known bug', strict=True)\n"
    "def test_known_bug():\n    assert False\n",
    "test_gpu.py": "import pytest\n\n"
    "@pytest.mark.skipif(True, reason='needs CUDA')\n"
    "def test_on_the_gpu():\n    pass\n",
    "test_module_skip.py": "import pytest\n\n"
    "pytest.importorskip('no_such_module_grpo')\n\n"
    "def test_never_collected():\n    pass\n",
}


@pytest.fixture(scope="module")
def session_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("skip-policy")
    for name, text in FILES.items():
        (folder / name).write_text(text)
    return folder


def _pytest(folder: Path, *args: str, fail_on_skip: bool) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != FAIL_ON_SKIP}
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")])
    if fail_on_skip:
        env[FAIL_ON_SKIP] = "1"
    command = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider"]
    return subprocess.run(
        [*command, "--rootdir", str(folder), *args],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one-process", "xdist"])
def test_an_unexpected_skip_fails_the_session_and_is_listed(session_dir, workers):
    res = _pytest(session_dir, *workers, fail_on_skip=True)
    assert res.returncode == 1, res.stdout + res.stderr
    summary = res.stdout.split("unexpected skips (GRPO_FAIL_ON_SKIP=1)", 1)[1]
    listed = sorted(line for line in summary.splitlines() if line.startswith("UNEXPECTED SKIP "))
    assert listed == [
        "UNEXPECTED SKIP test_module_skip.py: could not import 'no_such_module_grpo': "
        "No module named 'no_such_module_grpo'",
        "UNEXPECTED SKIP test_plain.py::test_needs_a_package: trl not installed",
    ]
    assert "1 passed" in res.stdout and "1 xfailed" in res.stdout  # the rest ran as usual


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one-process", "xdist"])
def test_an_allowed_cuda_skip_and_an_xfail_pass(session_dir, workers):
    res = _pytest(session_dir, *workers, "test_gpu.py", "test_plain.py::test_known_bug",
                  fail_on_skip=True)  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    assert "1 skipped" in res.stdout and "1 xfailed" in res.stdout
    assert "unexpected skips" not in res.stdout


def test_without_the_variable_skips_pass_as_before(session_dir):
    res = _pytest(session_dir, fail_on_skip=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "unexpected skips" not in res.stdout
    assert "1 passed, 3 skipped, 1 xfailed" in res.stdout
