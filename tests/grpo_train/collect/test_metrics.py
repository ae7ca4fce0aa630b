"""Step metrics besides the loss: this process's peak memory."""

from pathlib import Path

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
