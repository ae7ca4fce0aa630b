"""Step metrics besides the loss: this process's peak memory, sandbox errors and counts."""

from pathlib import Path

import pytest
import torch

from grpo_train.collect.metrics import peak_memory, peak_memory_mb


def test_peak_memory_reads_this_process() -> None:
    current_kib = next(
        int(line.split()[1])
        for line in Path("/proc/self/status").read_text().splitlines()
        if line.startswith("VmRSS:")
    )
    peak = peak_memory()
    assert peak.rss_mb >= current_kib / 1024 * 0.99
    if not torch.cuda.is_available():
        assert peak.cuda_allocated_mb is None and peak.cuda_reserved_mb is None
    expected = peak.rss_mb if peak.cuda_allocated_mb is None else peak.cuda_allocated_mb
    assert peak_memory_mb() >= expected * 0.99


def test_sandbox_errors_have_their_own_share_beside_the_error_share() -> None:
    from grpo_envs.types import Outcome, Sample, Score
    from grpo_train.collect.groups import Group
    from grpo_train.collect.metrics import rollout_metrics
    from grpo_train.rollout.base import Completion

    outcomes = [Outcome.PASSED, Outcome.SANDBOX_ERROR, Outcome.ERROR, Outcome.FAILED]
    scores = [Score(1.0, o) if o is Outcome.PASSED else Score.failure(o, "x") for o in outcomes]
    completions = [Completion(0, "c", (1, 2), (-0.1, -0.2), "stop") for _ in outcomes]
    group = Group(Sample(id="s", prompt=(), answer=""), 0, [1], completions, scores)
    m = rollout_metrics([group], ["code"])
    assert (m["score/sandbox_error_share"], m["score/error_share"]) == (0.25, 0.5)


def test_remote_sandbox_counts_are_per_step_and_absent_without_requests(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from grpo_train.collect.metrics import RemoteSandboxCounts
    from sandbox import remote

    counts = RemoteSandboxCounts()
    assert counts.step_metrics() == {}  # the local sandbox: no sandbox/* metrics
    start = remote.process_stats()
    monkeypatch.setattr(remote, "_PROCESS_STATS", start.plus(requests=5, retries=2, failures=1))
    assert counts.step_metrics() == {
        "sandbox/requests": 5.0,
        "sandbox/retries": 2.0,
        "sandbox/failovers": 0.0,
        "sandbox/failed_jobs": 1.0,
    }
    assert counts.step_metrics() == {}  # nothing new since
