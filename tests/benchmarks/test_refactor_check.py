"""The refactor check's digests: blind to timings, sensitive to every computed value."""

import json

import torch
from bench_scripts import load
from safetensors.torch import save_file

check = load("refactor_check")


def _run_dir(tmp_path, name, loss, step_time, weight):
    run = tmp_path / name
    last = run / "checkpoints" / "step-000001"
    (last / "model").mkdir(parents=True)
    row = {"step": 1, "loss": loss, "time/step": step_time, "memory/peak_mb": step_time * 10}
    (run / "metrics.jsonl").write_text(json.dumps(row) + "\n")
    save_file({"w": torch.tensor([weight, 0.0])}, last / "model" / "model.safetensors")
    torch.save({"step": 1, "optimizer": {"m": torch.tensor([weight])}}, last / "trainer_state.pt")
    return run


def test_timings_do_not_change_a_digest_and_computed_values_do(tmp_path):
    base = _run_dir(tmp_path, "a", loss=0.5, step_time=1.0, weight=1.0)
    slower = _run_dir(tmp_path, "b", loss=0.5, step_time=9.0, weight=1.0)
    other_loss = _run_dir(tmp_path, "c", loss=0.25, step_time=1.0, weight=1.0)
    other_weight = _run_dir(tmp_path, "d", loss=0.5, step_time=1.0, weight=1.0 + 2**-23)
    assert check.metrics_digest(base) == check.metrics_digest(slower)
    assert check.metrics_digest(base) != check.metrics_digest(other_loss)
    assert check.weights_digest(base) == check.weights_digest(slower)
    weights, state = check.weights_digest(other_weight)
    assert weights != check.weights_digest(base)[0] and state != check.weights_digest(base)[1]
