"""`grpo train` under faults, as users meet them: wrong resumes, damaged checkpoints, bad input,
broken scorers, signals. Each test drives the real CLI (``train_cli.main``) on the tiny model."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import fault_envs  # noqa: F401 - registers the faults/* environments
import pytest
import torch

from grpo_train import train_cli
from grpo_train.config import (
    RESUME_FIXED,
    RESUME_FREE,
    RESUME_IDENTITY,
    field_owners,
)
from grpo_train.parallel.distributed import RankInfo
from grpo_train.run import stop
from grpo_train.run.checkpoint import (
    ABANDONED_DIR,
    MANIFEST_FILE,
    MODEL_DIR,
    STATE_FILE,
    checkpoint_path,
    latest_checkpoint,
    read_manifest,
)
from grpo_train.run.run_log import read_metrics
from grpo_train.trainer import Trainer


def args(model: Path, out: Path, *extra: str, env: str = "faults/digit-v0") -> list[str]:
    return [
        "--model", str(model), "--env", env, "--engine", "hf", "--max_steps", "2",
        "--num_generations", "4", "--prompts_per_step", "2", "--max_prompt_length", "64",
        "--max_completion_length", "4", "--eval_size", "2", "--save_every", "1",
        "--keep_last", "5", "--learning_rate", "1e-2", "--progress", "false",
        "--log_every_samples", "0", "--seed", "5", "--output_dir", str(out), *extra,
    ]  # fmt: skip


def train(argv: list[str], capsys) -> tuple[int, str]:
    code = train_cli.main(argv)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


def message(err: str) -> str:
    """The `grpo train:` line of stderr (exactly one)."""
    lines = [line for line in err.splitlines() if line.startswith("grpo train:")]
    assert len(lines) == 1, err[-2000:]
    return lines[0]


@pytest.fixture(scope="module")
def finished_run(tiny_model_path, tmp_path_factory) -> Path:
    """A 2-step run with checkpoints at steps 1 and 2."""
    out = tmp_path_factory.mktemp("finished") / "run"
    assert train_cli.main(args(tiny_model_path, out)) == 0
    return out


def _copy(run: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(run, dst)
    return dst


# ------------------------------------------------------------------ 1. resume checks the config


def test_every_field_is_classified_for_resume():
    groups = (RESUME_FIXED, RESUME_FREE, RESUME_IDENTITY)
    assert set().union(*groups) == set(field_owners()), "classify new fields in config/sections.py"
    assert sum(len(g) for g in groups) == len(field_owners())


@pytest.fixture(scope="module")
def other_models(tmp_path_factory):
    from grpo_train.models.loading import build_tiny_model

    root = tmp_path_factory.mktemp("models")
    return {
        "qwen2": build_tiny_model(root / "qwen2", "qwen2"),
        "vocab": build_tiny_model(root / "vocab", vocab_size=300),
        "seed": build_tiny_model(root / "seed", seed=1),
    }


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ("qwen2", ["model architecture", "Qwen2ForCausalLM", "model model_type"]),
        ("vocab", ["model vocab_size"]),
        ("seed", ["model weights"]),
        (["--beta", "0.1"], ["beta: checkpoint 0.0, now 0.1"]),
        (["--env", "faults/digit-v0,faults/flaky-v0"], ["env: checkpoint"]),
        (["--lora_r", "4"], ["model lora"]),
        (["--num_generations", "8"], ["num_generations: checkpoint 4, now 8"]),
    ],
)
def test_resume_refuses_a_checkpoint_of_other_settings(
    finished_run, other_models, tiny_model_path, tmp_path, capsys, change, expected
):
    run = _copy(finished_run, tmp_path)
    model = other_models[change] if isinstance(change, str) else tiny_model_path
    extra = change if isinstance(change, list) else []
    argv = args(model, run, "--resume", "--max_steps", "3", *extra)  # a later flag wins
    code, err = train(argv, capsys)
    line = message(err)
    assert code == 2
    for text in expected:
        assert text in line
    assert "--init_from" in line and "--resume" in line and "config.yaml" in line
    assert [r["step"] for r in read_metrics(run)] == [0, 1, 2]  # nothing trained


def test_init_from_starts_a_new_run_from_the_weights(
    finished_run, tiny_model_path, tmp_path, capsys
):
    from safetensors.torch import load_file

    ckpt = checkpoint_path(finished_run, 2)
    out = tmp_path / "new"
    code, _ = train(
        args(tiny_model_path, out, "--init_from", str(ckpt), "--beta", "0.1", "--max_steps", "1"),
        capsys,
    )
    assert code == 0
    assert [r["step"] for r in read_metrics(out)] == [0, 1]  # a new run: from step 0
    first = load_file(ckpt / MODEL_DIR / "model.safetensors")
    new = load_file(checkpoint_path(out, 1) / MODEL_DIR / "model.safetensors")
    assert set(first) == set(new) and any(not torch.equal(first[k], new[k]) for k in first)
    manifest = read_manifest(checkpoint_path(out, 1))
    assert manifest is not None and manifest.parent is None  # a lineage of its own
    # Its first evaluation is the checkpoint's policy (same greedy outputs as the old run's end).
    assert read_metrics(out)[0]["eval/accuracy"] == read_metrics(finished_run)[-1]["eval/accuracy"]


def test_changing_max_steps_and_lr_on_resume_is_applied_and_logged(
    tiny_model_path, tmp_path, capsys
):
    out = tmp_path / "run"
    base = ["--lr_scheduler", "cosine", "--eval_size", "0"]
    assert train(args(tiny_model_path, out, *base), capsys)[0] == 0
    # The log goes to stderr (the command configures logging itself).
    code, text = train(
        args(
            tiny_model_path, out, *base, "--resume", "--max_steps", "4", "--learning_rate", "5e-3"
        ),
        capsys,
    )
    assert code == 0
    assert "max_steps 2 -> 4" in text and "learning_rate 0.01 -> 0.005" in text
    # Cosine over 4 steps at peak 5e-3, at update 2: 5e-3 * (1 + cos(pi / 2)) / 2; the saved
    # 2-step schedule had reached 0.
    assert "lr for step 3: 0.0025 (the saved schedule had 0)" in text
    assert f"resuming from {checkpoint_path(out, 2)} (step 2)" in text
    assert [r["step"] for r in read_metrics(out)] == [1, 2, 3, 4]


# ------------------------------------------------------------------------- 2. lineage on resume


def test_roll_back_then_crash_resumes_the_new_branch(
    finished_run, tiny_model_path, tmp_path, capsys, monkeypatch
):
    run = _copy(finished_run, tmp_path)
    step1 = checkpoint_path(run, 1)
    original = Trainer.train_step

    def crash_at_2(self, step, log):
        if step == 2:
            raise SystemExit(137)  # as a kill -9 during step 2: nothing more is written
        return original(self, step, log)

    monkeypatch.setattr(Trainer, "train_step", crash_at_2)
    with pytest.raises(SystemExit):
        train_cli.main(
            args(tiny_model_path, run, "--resume", str(step1), "--learning_rate", "5e-3")
        )
    capsys.readouterr()
    # The old run's step 2 is kept aside, never picked by --resume.
    assert not checkpoint_path(run, 2).exists()
    assert list((run / "checkpoints" / ABANDONED_DIR).glob("*/step-000002"))
    assert latest_checkpoint(run) == step1
    monkeypatch.setattr(Trainer, "train_step", original)
    code, err = train(args(tiny_model_path, run, "--resume", "--learning_rate", "5e-3"), capsys)
    assert code == 0
    assert f"resuming from {step1} (step 1)" in err
    assert [r["step"] for r in read_metrics(run)] == [0, 1, 2]
    manifest = read_manifest(checkpoint_path(run, 2))
    assert manifest is not None and manifest.parent == "step-000001"


# ------------------------------------------------------------------ 3. damaged checkpoints


def _zero(path):
    path.write_bytes(b"")


def _truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _garbage(path):
    path.write_bytes(b";" * path.stat().st_size)


def _flip(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("file", "damage", "without_manifest"),
    [
        (STATE_FILE, _zero, False),
        (STATE_FILE, _truncate, False),
        (STATE_FILE, _garbage, False),
        (f"{MODEL_DIR}/model.safetensors", _truncate, False),
        (f"{MODEL_DIR}/model.safetensors", _flip, False),
        (MANIFEST_FILE, _truncate, False),
        ("config.yaml", _flip, False),
        (STATE_FILE, _zero, True),
        (STATE_FILE, _garbage, True),
        (f"{MODEL_DIR}/model.safetensors", _truncate, True),
    ],
)
def test_a_damaged_checkpoint_names_the_file_and_the_previous_good_one(
    finished_run, tiny_model_path, tmp_path, capsys, file, damage, without_manifest
):
    run = _copy(finished_run, tmp_path)
    ckpt = checkpoint_path(run, 2)
    damage(ckpt / file)
    if without_manifest:  # a checkpoint of an older grpo-kit: found when loading
        (ckpt / MANIFEST_FILE).unlink()
    code, err = train(args(tiny_model_path, run, "--resume", "--max_steps", "3"), capsys)
    line = message(err)
    assert code == 2
    assert str(ckpt) in line and "damaged" in line
    assert (file.split("/")[0] if without_manifest else file) in line
    if not without_manifest or file == STATE_FILE:
        assert f"--resume {checkpoint_path(run, 1)}" in line


# --------------------------------------------------------------------------- 4. bad input


@pytest.mark.parametrize(
    ("extra", "yaml_text", "expected"),
    [
        (["--env", "nosuchmod:math/add2-v0"], None, "env: nosuchmod:math/add2-v0: cannot import"),
        ([], "env: [{id: faults/digit-v0, kwargs: {nope: 1}}]\n", "does not accept kwargs"),
        (["--learning_rate", "-1e-5"], None, "learning_rate: -1e-05; must be > 0"),
        (["--env", "faults/digit-v0:heavy"], None, "env: weight of 'faults/digit-v0:heavy'"),
        ([], "env: [{id: faults/digit-v0, weight: heavy}]\n", "env: weight of faults/digit-v0"),
        ([], "optim: 3\n", "optim: is a section"),
        (["--resume", "/nope"], None, "resume: /nope does not exist"),
        (["--init_from", "/nope"], None, "init_from: /nope does not exist"),
        (["--use_qlora", "--lora_r", "8"], None, "use_qlora: QLoRA"),
        (["--attn_implementation", "flash_attention_2"], None, "flash_attention_2 runs on a CUDA"),
        (["--attn_implementation", "flash"], None, "attn_implementation: 'flash' is not"),
        (["--collective_timeout_s", "0"], None, "collective_timeout_s"),
        (["--max_reward_errors", "2"], None, "max_reward_errors"),
        # nothing to resume in a new folder: not a silent fresh start
        (["--resume"], None, "holds no checkpoint to resume"),
        # a missing data file is the data file's fault, named with its option
        (
            ["--env", "{id: math/dataset-v0, kwargs: {path: nope/q.jsonl}}"],
            None,
            "env: math/dataset-v0: data file missing: nope/q.jsonl (the environment's path=",
        ),
        ([], "learning_rte: 0.1\n", "'learning_rte' (did you mean learning_rate?)"),
        ([], "optim: {lr_schedler: cosine}\n", "did you mean lr_scheduler?"),
    ],
)
def test_bad_input_is_one_line_naming_the_field_exit_2(
    tiny_model_path, tmp_path, capsys, extra, yaml_text, expected
):
    argv = args(tiny_model_path, tmp_path / "run", *extra)
    if yaml_text is not None:
        (tmp_path / "c.yaml").write_text(yaml_text)
        argv = ["--config", str(tmp_path / "c.yaml")] + [
            a for a in argv if a not in ("--env", "faults/digit-v0")
        ]
    code, err = train(argv, capsys)
    assert code == 2
    assert expected in message(err)
    assert not (tmp_path / "run").exists()  # a failed start leaves no folder behind


def test_output_dir_that_is_a_file_or_unwritable_exits_2(tiny_model_path, tmp_path, capsys):
    file = tmp_path / "file"
    file.write_text("x")
    for out, expected in ((file, "is a file"), (file / "run", "is a file")):
        code, err = train(args(tiny_model_path, out), capsys)
        assert code == 2 and expected in message(err) and str(file) in message(err)
    code, err = train(args(tiny_model_path, Path("/proc/grpo-run")), capsys)
    assert code == 2 and "output_dir: cannot write in /proc/grpo-run" in message(err)


def test_zero_steps_and_no_eval_finish_cleanly(tiny_model_path, tmp_path, capsys):
    code, _ = train(args(tiny_model_path, tmp_path, "--max_steps", "0", "--eval_size", "0"), capsys)
    assert code == 0


def test_a_full_disk_names_the_path_and_the_space(tiny_model_path, tmp_path, capsys, monkeypatch):
    (tmp_path / "run").mkdir()
    os.symlink("/dev/full", tmp_path / "run" / "metrics.jsonl")  # logs on a full device
    code, err = train(args(tiny_model_path, tmp_path / "run"), capsys)
    assert code == 1
    assert f"cannot write {tmp_path / 'run' / 'metrics.jsonl'}: No space left" in message(err)

    def full(*args, **kwargs):  # what torch.save raises when the disk fills mid-checkpoint
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0")

    monkeypatch.setattr(torch, "save", full)
    code, err = train(args(tiny_model_path, tmp_path / "run2"), capsys)
    line = message(err)
    assert code == 1
    assert f"cannot write checkpoint {checkpoint_path(tmp_path / 'run2', 1)}" in line
    assert "MiB" in line and "needs about" in line


def test_out_of_gpu_memory_in_the_update_says_what_to_lower_and_resumes_with_it(
    tiny_model_path, tmp_path, capsys, monkeypatch
):
    # torch raises OutOfMemoryError (a RuntimeError) from inside the update: one line with
    # torch's own allocation, the settings that lower the update's memory (flags the resume
    # command takes) and the checkpoint to resume from, not a traceback.
    from grpo_train.learner import update

    run = tmp_path / "run"
    real = update.token_logprobs

    def out_of_memory_at_step_2(*a, **k):
        if torch.is_grad_enabled() and latest_checkpoint(run) is not None:
            raise torch.OutOfMemoryError(
                "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
                "23.64 GiB of which 1.06 GiB is free. Including non-PyTorch memory, this "
                "process has 22.56 GiB memory in use."
            )
        return real(*a, **k)

    monkeypatch.setattr(update, "token_logprobs", out_of_memory_at_step_2)
    code, err = train(args(tiny_model_path, run), capsys)
    assert code == 1
    assert message(err) == (
        "grpo train: aborted: out of GPU memory during the update (CUDA out of memory. Tried to "
        "allocate 2.00 GiB. GPU 0 has a total capacity of 23.64 GiB of which 1.06 GiB is free); "
        "settings that lower it: --micro_batch_tokens 1024 (now 2048), --gradient_checkpointing "
        f"true (now false); for a new run: --lora_r 16 (now 0); last checkpoint "
        f"{checkpoint_path(run, 1)}; resume with `grpo train --config {run / 'config.yaml'} "
        "--resume`"
    )
    monkeypatch.setattr(update, "token_logprobs", real)
    resumed = ["--config", str(run / "config.yaml"), "--resume", "--micro_batch_tokens", "1024"]
    code, err = train(resumed, capsys)
    assert code == 0, err
    assert [r["step"] for r in read_metrics(run)] == [0, 1, 2]


# ------------------------------------------------------------------------ 5. reward failures


def test_flaky_scorer_warns_each_step_and_trains_on(tiny_model_path, tmp_path, capsys):
    code, err = train(args(tiny_model_path, tmp_path, env="faults/flaky-v0"), capsys)
    assert code == 0
    steps = [r for r in read_metrics(tmp_path) if r["step"] > 0 and "score/error_share" in r]
    assert [r["score/error_share"] for r in steps] == [0.25, 0.25]  # every 4th of 8 completions
    warned = [line for line in err.splitlines() if "failed to score" in line]
    assert any("step 1: 2 of 8" in w and "reward server timed out" in w for w in warned)
    assert any("step 2: 2 of 8" in w for w in warned)


def test_broken_scorer_stops_the_run(tiny_model_path, tmp_path, capsys):
    code, err = train(args(tiny_model_path, tmp_path, env="faults/broken-v0"), capsys)
    assert code == 1
    line = message(err)
    assert "8 of 8 completions failed to score" in line and "max_reward_errors=0.5" in line
    assert "KeyError" in line and not (tmp_path / "checkpoints" / "step-000001").exists()


def test_none_and_nan_rewards_are_errors_in_training_and_evaluation(
    tiny_model_path, tmp_path, capsys
):
    code, _ = train(
        args(tiny_model_path, tmp_path, "--max_reward_errors", "1", env="faults/bad-reward-v0"),
        capsys,
    )
    assert code == 0
    rows = read_metrics(tmp_path)
    assert (
        rows[0]["eval/accuracy"] == 0.0
        and rows[-1]["eval/faults/bad-reward-v0/score_error_rate"] == 1.0
    )
    # all 8 completions failed, both groups of 4 dropped
    assert all(
        r["score/error_share"] == 1.0 and r["score/dropped_group_share"] == 1.0 for r in rows[1:]
    )

    from grpo_train.eval_cli import main as eval_main

    out = tmp_path / "eval"
    code = eval_main(
        ["--model", str(tiny_model_path), "--suite", "faults/bad-reward-v0", "--limit", "2",
         "--max_tokens", "4", "--engine", "hf", "--out", str(out), "--no_progress"]
    )  # fmt: skip
    assert code == 0
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert {r["outcome"] for r in records} == {"error"}
    assert all("malformed score" in r["score"]["details"]["reason"] for r in records)


# ----------------------------------------------------------------------------------- 7. minor


def test_second_signal_exits_without_traceback(tiny_model_path, tmp_path, capsys, monkeypatch):
    original = Trainer.train_step

    def twice(self, step, log):
        if step == 2:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(stop.REPEAT_WINDOW_S + 0.1)  # a person's second Ctrl-C, not a repeat
            os.kill(os.getpid(), signal.SIGINT)
        return original(self, step, log)

    monkeypatch.setattr(Trainer, "train_step", twice)
    code, err = train(args(tiny_model_path, tmp_path), capsys)
    assert code == 143  # the first signal's
    line = message(err)
    assert "second signal" in line and "--resume" in line
    assert f"last checkpoint {checkpoint_path(tmp_path, 1)}" in line


def test_the_same_signal_twice_at_once_is_one_stop(tiny_model_path, tmp_path, capsys, monkeypatch):
    # A job runner signals the group and a launcher forwards it: two copies within milliseconds.
    original = Trainer.train_step

    def repeated(self, step, log):
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)
        return original(self, step, log)

    monkeypatch.setattr(Trainer, "train_step", repeated)
    code = train_cli.main(args(tiny_model_path, tmp_path))
    out = capsys.readouterr().out
    assert code == 143
    assert f"interrupted by SIGTERM: saved step 1 in {checkpoint_path(tmp_path, 1)}" in out


def test_second_signal_while_saving_keeps_the_checkpoints_valid(
    tiny_model_path, tmp_path, capsys, monkeypatch
):
    import grpo_train.run.checkpoint as ckpt

    original = ckpt._write_files
    target = 2

    def interrupted_write(folder, step, **kwargs):
        original(folder, step, **kwargs)
        if step == target:  # the files are written, the manifest and the rename are not
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(stop.REPEAT_WINDOW_S + 0.1)
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(ckpt, "_write_files", interrupted_write)
    code, err = train(args(tiny_model_path, tmp_path, "--max_steps", "3"), capsys)
    assert code == 130 and "second signal" in message(err)
    assert not list((tmp_path / "checkpoints").glob(".tmp-*"))  # the partial one is gone
    assert latest_checkpoint(tmp_path) == checkpoint_path(tmp_path, 1)  # whole and valid
    monkeypatch.setattr(ckpt, "_write_files", original)
    code, _ = train(args(tiny_model_path, tmp_path, "--max_steps", "3", "--resume"), capsys)
    assert code == 0 and latest_checkpoint(tmp_path) == checkpoint_path(tmp_path, 3)


def test_an_interrupted_rank_other_than_the_main_one_exits_0(
    tiny_model_path, tmp_path, capsys, monkeypatch
):
    # The launcher stops every rank once one exits non-zero: an interrupted non-main rank that
    # exited 130 could kill the main rank before it printed how to resume. The main rank's exit
    # code carries the interruption.
    train, train_step = Trainer.train, Trainer.train_step

    def signalled(self, step, log):
        os.kill(os.getpid(), signal.SIGTERM)
        return train_step(self, step, log)

    def then_seen_from_rank_1(self):
        result = train(self)
        self.setup = dataclasses.replace(
            self.setup, rank=RankInfo(rank=1, world_size=2, local_rank=1)
        )
        return result

    monkeypatch.setattr(Trainer, "train_step", signalled)
    code = train_cli.main(args(tiny_model_path, tmp_path / "main"))
    assert code == 143 and "interrupted by SIGTERM: saved step" in capsys.readouterr().out

    monkeypatch.setattr(Trainer, "train", then_seen_from_rank_1)
    code = train_cli.main(args(tiny_model_path, tmp_path / "rank1"))
    out = capsys.readouterr().out
    assert code == 0 and "resume with" not in out and "held-out accuracy" not in out
    assert latest_checkpoint(tmp_path / "rank1") is not None  # it saved before leaving


def test_resume_from_step_0_keeps_one_step_0_row(tiny_model_path, tmp_path, capsys, monkeypatch):
    original = Trainer.evaluate

    def stop_during_first_eval(self):
        monkeypatch.setattr(Trainer, "evaluate", original)
        os.kill(os.getpid(), signal.SIGTERM)
        return original(self)

    monkeypatch.setattr(Trainer, "evaluate", stop_during_first_eval)
    code, _ = train(args(tiny_model_path, tmp_path), capsys)
    assert code == 143 and latest_checkpoint(tmp_path) == checkpoint_path(tmp_path, 0)  # SIGTERM
    code, _ = train(args(tiny_model_path, tmp_path, "--resume"), capsys)
    assert code == 0
    assert [r["step"] for r in read_metrics(tmp_path)] == [0, 1, 2]


# ------------------------------------------------- kill -9 and resume: bit-identical weights


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("moment", ["inside a checkpoint write", "after a checkpoint"])
def test_kill_9_then_resume_ends_with_the_uninterrupted_weights(
    tiny_model_path, tmp_path, capsys, moment
):
    from safetensors.torch import load_file

    extra = ("--max_steps", "3", "--num_threads", "1", "--eval_size", "0")
    full, cut = tmp_path / "full", tmp_path / "cut"
    assert train(args(tiny_model_path, full, *extra), capsys)[0] == 0
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen(
        [sys.executable, __file__, "train", *args(tiny_model_path, cut, *extra)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    root = cut / "checkpoints"
    try:
        deadline = time.monotonic() + 300
        while proc.poll() is None and time.monotonic() < deadline:
            names = {p.name for p in root.iterdir()} if root.is_dir() else set()
            if (moment == "inside a checkpoint write" and ".tmp-step-000002" in names) or (
                moment == "after a checkpoint" and "step-000002" in names
            ):
                proc.kill()  # SIGKILL: no handler, no cleanup
                break
            time.sleep(0.001)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run ended before the aimed moment"
    code, _ = train(args(tiny_model_path, cut, *extra, "--resume"), capsys)
    assert code == 0
    name = f"checkpoints/step-000003/{MODEL_DIR}/model.safetensors"
    a, b = load_file(full / name), load_file(cut / name)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [r["step"] for r in read_metrics(cut)] == [1, 2, 3]


# ---------------------------------------------------------------------------- 6. distributed


def _launch(script_args: list[str], *, multi: bool = True) -> subprocess.Popen:
    """`accelerate launch` of this file as a `grpo train` entry point (gloo ranks on CPU)."""
    accelerate = Path(sys.executable).with_name("accelerate")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mode = ["--multi_gpu"] if multi else ["--cpu"]
    cmd = [
        str(accelerate), "launch", *mode, "--num_processes", "2", "--num_machines", "1",
        "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(port),
        __file__, "train", *script_args,
    ]  # fmt: skip
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1"}
    env["TOKENIZERS_PARALLELISM"] = "false"
    return subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip


def _ranks(root: int) -> dict[int, int]:
    """pid of each rank among the descendants of ``root`` (read from their RANK variable)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            status = (entry / "status").read_text()
        except OSError:
            continue
        if f"NSpgid:\t{root}" not in status and not _descends(int(entry.name), root):
            continue
        for item in environ:
            if item.startswith(b"RANK=") and b"LOCAL_RANK" not in item:
                found[int(item[5:])] = int(entry.name)
    return found


def _descends(pid: int, root: int) -> bool:
    while pid > 1:
        if pid == root:
            return True
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return False


def _wait_for_step(run: Path, proc: subprocess.Popen, step: int, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(r["step"] >= step for r in read_metrics(run)) if run.is_dir() else False:
            return
        if proc.poll() is not None:
            raise AssertionError("the launch ended early:\n" + "".join(proc.communicate())[-4000:])
        time.sleep(0.5)
    raise AssertionError(f"no step {step} within {timeout} s")


def _distributed_args(model: Path, out: Path, *extra: str) -> list[str]:
    return args(
        model, out, "--max_steps", "200", "--save_every", "0", "--eval_size", "0",
        "--seed_per_prompt", "true", *extra,
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_sigterm_to_one_rank_saves_the_same_step_on_every_rank(tiny_model_path, tmp_path):
    out = tmp_path / "run"
    proc = _launch(_distributed_args(tiny_model_path, out))
    try:
        _wait_for_step(out, proc, 1)
        os.kill(_ranks(proc.pid)[1], signal.SIGTERM)  # rank 1 only
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert "Connection closed by peer" not in stderr, stderr[-3000:]
    assert "stop on another rank: saving step" in stdout  # rank 0 saves although not signalled
    assert "interrupted by SIGTERM: saved step" in stdout
    ckpt = latest_checkpoint(out)
    assert ckpt is not None
    manifest = read_manifest(ckpt)
    assert manifest is not None and manifest.step == max(r["step"] for r in read_metrics(out))


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_stopped_rank_fails_the_others_within_collective_timeout(tiny_model_path, tmp_path):
    out = tmp_path / "run"
    proc = _launch(_distributed_args(tiny_model_path, out, "--collective_timeout_s", "15"))
    stopped = None
    try:
        _wait_for_step(out, proc, 1)
        stopped = _ranks(proc.pid)[1]
        os.kill(stopped, signal.SIGSTOP)
        start = time.monotonic()
        while proc.poll() is None and time.monotonic() - start < 150:
            rank0 = _ranks(proc.pid).get(0)
            if rank0 is None:
                break
            time.sleep(0.5)
        elapsed = time.monotonic() - start
    finally:
        if stopped is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(stopped, signal.SIGKILL)
        try:
            _, stderr = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            _, stderr = proc.communicate()
    assert elapsed < 90, f"rank 0 still waiting after {elapsed:.0f} s"
    assert "rank 0: a collective operation timed out after collective_timeout_s=15" in stderr


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_cpu_launch_that_would_run_one_process_is_refused(tiny_model_path, tmp_path):
    proc = _launch(args(tiny_model_path, tmp_path / "run"), multi=False)
    _, stderr = proc.communicate(timeout=240)
    assert proc.returncode != 0
    assert "asked for --num_processes 2 but started 1 process" in stderr
    assert "--multi_gpu --num_processes 2" in stderr
    assert not (tmp_path / "run" / "checkpoints").exists()


if __name__ == "__main__" and sys.argv[1:2] == ["train"]:
    raise SystemExit(train_cli.main(sys.argv[2:]))
