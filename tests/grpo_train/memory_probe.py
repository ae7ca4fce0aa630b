"""Peak-memory probes run in fresh processes (not a test module).

A probe script starts with ``PRELUDE``: ``start_peak()`` resets the kernel's high-water mark of
the resident set (``VmHWM``, through ``/proc/self/clear_refs``) and returns the current one, so
what came before (imports, the random initialisation of the model, whose temporaries alone
reach ~75 MiB here) is not counted; ``high_water_kib()`` reads the mark; ``tiny_qwen3(max_positions,
**extra)`` is a 2-layer Qwen3 config with Qwen's 151,936-row tied vocabulary head. The script
prints ``{"kib": ...}`` as its last line. One process per measurement keeps probes apart.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

PRELUDE = r"""
import json, sys, torch
from transformers import Qwen3Config, Qwen3ForCausalLM

torch.manual_seed(0)
torch.set_num_threads(1)

def _status_kib(key):
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(key))

def start_peak():  # forget the peak so far; the resident set now
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")
    return _status_kib("VmRSS:")

def high_water_kib():
    return _status_kib("VmHWM:")

def tiny_qwen3(max_positions, **extra):
    return Qwen3Config(vocab_size=151936, hidden_size=128, intermediate_size=384,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=32, max_position_embeddings=max_positions,
                       tie_word_embeddings=True, **extra)
"""


def peak_kib(script: str, *args: object, repeats: int = 1) -> float:
    """Run ``PRELUDE + script`` with ``args`` in ``repeats`` fresh interpreters; the least KiB
    printed (a process now and then gains 20-45 MiB that no argument explains; it only adds)."""
    return min(_one_peak_kib(script, args) for _ in range(repeats))


PROBE_ENV = {"MALLOC_MMAP_THRESHOLD_": str(128 * 1024)}
"""glibc raises its mmap threshold each time a large block is freed (up to 32 MiB), after which
blocks of that size come from the heap, where fragmentation can keep freed ones resident: the
high-water mark then counts memory that is free. A fixed threshold (glibc's initial 128 KiB;
setting it turns the raising off) returns every large block to the kernel when it is freed, so
the mark counts what was live."""


def _one_peak_kib(script: str, args: tuple[object, ...]) -> float:
    done = subprocess.run(
        [sys.executable, "-c", PRELUDE + script, *map(str, args)],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
        env={**os.environ, **PROBE_ENV},
    )
    return float(json.loads(done.stdout.strip().splitlines()[-1])["kib"])
