"""``benchmarks/gpu_check.py`` on CPU: a verdict line per path; a failing path fails the run."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from bench_scripts import load

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "gpu_check.py"
#: The paths the check must cover (the GPU-only branches it guards); the script's own list is
#: compared with it, so a path dropped from the script fails here.
PATHS = {
    "bf16-full-ft", "logprob-heads", "lora-gc-kl", "qlora-export", "liger-head", "vllm-sync",
    "checkpoint-resume", "long-completion", "fsdp2-save-resume", "multi-process", "train-cli",
    "hf-out-of-memory",
}  # fmt: skip


def run_check(*args: str, blocker: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run the check on CPU; ``blocker``: a folder whose ``sitecustomize`` every process of the
    check (paths, ranks, CLI commands) imports first."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, filter(None, [blocker, REPO])))}
    return subprocess.run(
        # A generous per-path limit: CI machines are shared (train-cli takes ~40 s alone).
        [sys.executable, str(SCRIPT), "--device", "cpu", "--timeout", "300", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=600,
    )


def verdicts(stdout: str) -> dict[str, str]:
    return {
        m.group(2): m.group(1)
        for m in re.finditer(r"^(PASS|FAIL|SKIP)\s+(\S+)\s", stdout, flags=re.MULTILINE)
    }


@pytest.mark.slow
def test_every_path_passes_or_skips_on_cpu() -> None:
    done = run_check()
    found = verdicts(done.stdout)
    assert set(found) == PATHS == set(load("gpu_check").PATHS), done.stdout
    assert set(found.values()) <= {"PASS", "SKIP"}, done.stdout + done.stderr
    assert done.returncode == 0, done.stdout
    assert re.search(r"^summary: \d+ PASS, 0 FAIL, \d+ SKIP$", done.stdout, re.MULTILINE)


@pytest.mark.parametrize("failing", ["logprob-heads", "qlora-export"])
def test_a_failing_path_is_reported_and_fails_the_run(failing: str) -> None:
    """A forced failure (also in a path that would otherwise SKIP) prints FAIL and exits 1."""
    done = run_check("--paths", f"checkpoint-resume,{failing}", "--fail-path", failing)
    assert verdicts(done.stdout) == {"checkpoint-resume": "PASS", failing: "FAIL"}, done.stdout
    assert "failure forced by --fail-path" in done.stdout
    assert done.returncode == 1
    assert "summary: 1 PASS, 1 FAIL, 0 SKIP" in done.stdout


@pytest.mark.parametrize(
    ("paths", "message"),
    [("no-such-path", "unknown paths ['no-such-path']"), (",", "--paths names no path")],
)
def test_an_unknown_or_empty_path_list_is_a_usage_error(paths: str, message: str) -> None:
    done = run_check("--paths", paths)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert "choose from bf16-full-ft," in done.stderr


#: Packages a GPU machine with only torch, transformers, peft and accelerate lacks, which the
#: check's paths must not need: datasets brings pyarrow (55 MB) and pandas (12 MB) with it.
ABSENT_ON_A_BARE_GPU_MACHINE = ("datasets", "pyarrow", "pandas", "vllm")
#: grpo-kit's other dependencies that neither torch nor transformers bring (the wheel goes in
#: with ``--no-deps``): the trainer runs without them. httpx (huggingface-hub 2 brings httpx2, a
#: package of another name) loads only with a remote sandbox.
NOT_BROUGHT_BY_TORCH = (
    "latex2sympy2_extended", "pyseccomp", "gguf", "tensorboard", "matplotlib", "httpx",
)  # fmt: skip


def blocking(folder: Path, names: tuple[str, ...]) -> Path:
    """Write ``folder/sitecustomize.py``, which makes ``names`` unimportable; return ``folder``."""
    listed = ", ".join(repr(name) for name in names)
    (folder / "sitecustomize.py").write_text(
        f"import sys\nfor name in ({listed},):\n    sys.modules[name] = None\n"
    )
    return folder


@pytest.mark.slow
def test_the_trainer_paths_run_without_the_packages_a_bare_gpu_machine_lacks(
    tmp_path: Path,
) -> None:
    """Every process of the check (paths, ranks, the CLI's commands) sees those packages as not
    installed (``sys.modules[name] = None`` in a ``sitecustomize``): the launched paths and the
    CLI pass, train-cli with its prompt rows as a list."""
    absent = ABSENT_ON_A_BARE_GPU_MACHINE + NOT_BROUGHT_BY_TORCH
    paths = ("fsdp2-save-resume", "multi-process", "train-cli")
    done = run_check("--paths", ",".join(paths), blocker=blocking(tmp_path, absent))
    assert verdicts(done.stdout) == dict.fromkeys(paths, "PASS"), done.stdout + done.stderr[-3000:]
    assert "(prompt rows as a list: datasets is not installed)" in done.stdout
    assert done.returncode == 0


def test_the_modules_the_paths_import_need_no_package_a_bare_gpu_machine_lacks() -> None:
    """What the docstring's wheel list rests on: ``setup.run`` (bf16-full-ft, fsdp2-save-resume),
    ``update``, ``checkpoint``, ``lora``, the forward pass, micro-batches, the objective,
    ``logprobs``, the weight export and the data-parallel helpers, the hf engine and the memory
    advice (hf-out-of-memory), and the commands train-cli runs, import with those packages
    unimportable."""
    modules = (
        "setup.run",
        "learner.update",
        "run.checkpoint",
        "learner.lora",
        "learner.forward",
        "learner.micro_batches",
        "algorithm.objective",
        "learner.logprobs",
        "learner.memory",
        "learner.weight_export",
        "parallel.distributed",
        "models.loading",
        "rollout.hf",
        "run.memory_advice",
        "setup.settings",
        "cli",
        "train_cli",
        "eval_cli",
        "trainer",
    )
    absent = (*ABSENT_ON_A_BARE_GPU_MACHINE, *NOT_BROUGHT_BY_TORCH)
    code = f"import sys\nfor name in {absent!r}: sys.modules[name] = None\n" + "".join(
        f"import grpo_train.{m}\n" for m in modules
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr[-1500:]
