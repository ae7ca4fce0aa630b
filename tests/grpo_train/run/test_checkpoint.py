import json
import random
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from grpo_train.config import TrainConfig
from grpo_train.parallel import distributed
from grpo_train.run import checkpoint
from grpo_train.run.checkpoint import (
    CheckpointError,
    SamplerState,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)


@pytest.fixture(scope="module")
def parts(tiny_model_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    return model, tokenizer


def _optim(model):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    model(input_ids=torch.tensor([[1, 2, 3]])).logits.sum().backward()
    opt.step()
    sched.step()
    opt.zero_grad()
    return opt, sched


def _save(run_dir, step, model, tokenizer, opt, sched, keep_last=2):
    return save_checkpoint(
        run_dir,
        step,
        model=model,
        tokenizer=tokenizer,
        optimizer=opt,
        scheduler=sched,
        sampler=SamplerState(step * 4, (step * 3, step)),
        config_yaml=TrainConfig().to_yaml(),
        keep_last=keep_last,
    )


def test_round_trip_restores_optimizer_scheduler_rng_and_position(parts, tmp_path):
    model, tokenizer = parts
    opt, sched = _optim(model)
    torch.manual_seed(1)
    random.seed(1)
    np.random.seed(1)
    path = _save(tmp_path, 5, model, tokenizer, opt, sched)
    expected = (torch.rand(3), random.random(), np.random.rand())

    opt2, sched2 = torch.optim.AdamW(model.parameters(), lr=1e-3), None
    sched2 = torch.optim.lr_scheduler.LambdaLR(opt2, lambda s: 1.0 / (1 + s))
    torch.manual_seed(99)
    state = load_checkpoint(path, optimizer=opt2, scheduler=sched2)
    assert (torch.rand(3).tolist(), random.random(), np.random.rand()) == (
        expected[0].tolist(),
        *expected[1:],
    )
    assert state.step == 5 and state.sampler == SamplerState(20, (15, 5))
    assert sched2.last_epoch == sched.last_epoch
    saved = opt.state_dict()["state"][0]["exp_avg"]
    assert torch.equal(opt2.state_dict()["state"][0]["exp_avg"], saved)
    assert (path / "model" / "config.json").is_file() and (path / "config.yaml").is_file()
    assert TrainConfig.from_yaml(path / "config.yaml") == TrainConfig()


def test_keeps_only_the_last_k_and_leaves_no_temp_folders(parts, tmp_path):
    model, tokenizer = parts
    opt, sched = _optim(model)
    for step in (1, 2, 3):
        _save(tmp_path, step, model, tokenizer, opt, sched, keep_last=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-000002", "step-000003"]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        "step-000002",
        "step-000003",
    ]


def test_a_failed_save_leaves_the_previous_checkpoint_and_no_partial_one(
    parts, tmp_path, monkeypatch
):
    model, tokenizer = parts
    opt, sched = _optim(model)
    good = _save(tmp_path, 1, model, tokenizer, opt, sched)

    def disk_full(*args, **kwargs):
        raise OSError("No space left on device")

    monkeypatch.setattr(torch, "save", disk_full)
    with pytest.raises(OSError, match="No space"):
        _save(tmp_path, 2, model, tokenizer, opt, sched)
    assert latest_checkpoint(tmp_path) == good
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step-000001"]


def test_incomplete_folders_are_ignored_and_a_step_can_be_saved_again(parts, tmp_path):
    model, tokenizer = parts
    opt, sched = _optim(model)
    first = _save(tmp_path, 4, model, tokenizer, opt, sched)
    (tmp_path / "checkpoints" / "step-000009").mkdir()  # e.g. copied by hand, no trainer_state.pt
    assert latest_checkpoint(tmp_path) == first
    again = _save(tmp_path, 4, model, tokenizer, opt, sched)
    assert again == first and (again / "trainer_state.pt").is_file()


def test_loading_a_non_checkpoint_names_the_problem(parts, tmp_path):
    model, _ = parts
    opt, sched = _optim(model)
    with pytest.raises(FileNotFoundError, match="not a checkpoint"):
        load_checkpoint(tmp_path, optimizer=opt, scheduler=sched)
    assert latest_checkpoint(tmp_path / "nothing") is None


class _FakeShardedAccelerator:
    """Stands in for an FSDP ``Accelerator`` on one process: records save_state / load_state."""

    def __init__(self) -> None:
        from accelerate.utils import DistributedType

        self.distributed_type = DistributedType.FSDP
        self.is_main_process = True
        self.calls: list[tuple[str, str]] = []

    def save_state(self, output_dir: str) -> None:
        Path(output_dir).mkdir(parents=True)
        (Path(output_dir) / "optimizer_0").write_text("shards")
        self.calls.append(("save_state", output_dir))

    def load_state(self, input_dir: str) -> None:
        self.calls.append(("load_state", input_dir))


def test_sharded_runs_save_and_load_the_optimizer_through_accelerate(parts, tmp_path):
    model, tokenizer = parts
    opt, sched = _optim(model)
    acc = _FakeShardedAccelerator()
    path = save_checkpoint(
        tmp_path, 3, model=model, tokenizer=tokenizer, optimizer=opt, scheduler=sched,
        sampler=SamplerState(12, (9, 3)), config_yaml=TrainConfig().to_yaml(), keep_last=2,
        accelerator=acc,
    )  # fmt: skip
    # save_state ran inside the temporary folder, which was then renamed into place.
    assert [c for c, _ in acc.calls].count("save_state") == 1
    assert Path(acc.calls[[c for c, _ in acc.calls].index("save_state")][1]).parent.name.startswith(
        ".tmp-"
    )
    assert (path / "accelerate" / "optimizer_0").read_text() == "shards"
    assert torch.load(path / "trainer_state.pt", weights_only=True)["optimizer"] is None
    assert not [p for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith(".")]

    opt2 = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched2 = torch.optim.lr_scheduler.LambdaLR(opt2, lambda s: 1.0 / (1 + s))
    acc2 = _FakeShardedAccelerator()
    state = load_checkpoint(path, optimizer=opt2, scheduler=sched2, accelerator=acc2)
    assert ("load_state", str(path / "accelerate")) in acc2.calls
    assert state.step == 3 and state.sampler == SamplerState(12, (9, 3))
    assert sched2.last_epoch == sched.last_epoch
    assert opt2.state_dict()["state"] == {}  # the optimizer is accelerate's to restore


class _FakeDataParallelAccelerator:
    """One rank of a 2-process DDP run (its ranks are threads)."""

    def __init__(self, rank: int) -> None:
        from accelerate.utils import DistributedType

        self.distributed_type = DistributedType.MULTI_CPU
        self.process_index, self.num_processes = rank, 2
        self.is_main_process = rank == 0


def _agreements_at(barrier: threading.Barrier):
    """``failed_rank`` for thread ranks: they meet at ``barrier`` where processes all-reduce.

    Without it rank 1 would write into the temporary folder before rank 0 made it.
    """

    def failed_rank(error: str | None) -> distributed.RankFailure | None:
        barrier.wait(timeout=60)
        return None if error is None else distributed.RankFailure(0, error)

    return failed_rank


def test_each_rank_of_a_launched_run_resumes_its_own_random_states(parts, tmp_path, monkeypatch):
    """Rank 1's CUDA and CPU generators are its own after a resume, not a copy of rank 0's."""
    model, tokenizer = parts
    opt, sched = _optim(model)
    # Threads share the process's generators: each "rank" reports its own name as its state.
    monkeypatch.setattr(checkpoint, "rng_state", lambda: {"rank": threading.current_thread().name})
    barrier = threading.Barrier(2)
    monkeypatch.setattr(distributed, "failed_rank", _agreements_at(barrier))
    saved: dict[int, Path] = {}
    failures: list[BaseException] = []

    def save(rank: int) -> None:
        try:
            saved[rank] = save_checkpoint(
                tmp_path, 4, model=model, tokenizer=tokenizer, optimizer=opt, scheduler=sched,
                sampler=SamplerState(8, (4, 4)), config_yaml=TrainConfig().to_yaml(),
                keep_last=2, accelerator=_FakeDataParallelAccelerator(rank),
            )  # fmt: skip
        except BaseException as err:  # surfaced below: a thread's exception is otherwise lost
            failures.append(err)
            barrier.abort()

    ranks = [threading.Thread(target=save, args=(r,), name=f"rank{r}") for r in (0, 1)]
    for thread in ranks:
        thread.start()
    for thread in ranks:
        thread.join(timeout=120)
    assert not failures and saved[0] == saved[1]
    restored: list[object] = []
    monkeypatch.setattr(checkpoint, "set_rng_state", restored.append)

    def resume(accelerator: object) -> list[object]:
        restored.clear()
        opt2 = torch.optim.AdamW(model.parameters(), lr=1e-3)
        sched2 = torch.optim.lr_scheduler.LambdaLR(opt2, lambda s: 1.0 / (1 + s))
        load_checkpoint(saved[0], optimizer=opt2, scheduler=sched2, accelerator=accelerator)
        return list(restored)

    rank1 = resume(_FakeDataParallelAccelerator(1))
    assert rank1 == [{"rank": "rank0"}, {"rank": "rank1"}]  # rank 0's first, then its own
    rank0 = resume(_FakeDataParallelAccelerator(0))
    assert rank0 == [{"rank": "rank0"}, {"rank": "rank0"}]
    assert resume(None)[-1] == {"rank": "rank0"}  # one process resuming a launched run's step


def test_resuming_across_sharded_and_replicated_runs_is_refused(parts, tmp_path):
    model, tokenizer = parts
    opt, sched = _optim(model)
    plain = _save(tmp_path / "plain", 1, model, tokenizer, opt, sched)
    with pytest.raises(ValueError, match="--model"):
        load_checkpoint(
            plain, optimizer=opt, scheduler=sched, accelerator=_FakeShardedAccelerator()
        )
    sharded = save_checkpoint(
        tmp_path / "sharded", 1, model=model, tokenizer=tokenizer, optimizer=opt, scheduler=sched,
        sampler=SamplerState(), config_yaml=TrainConfig().to_yaml(), keep_last=1,
        accelerator=_FakeShardedAccelerator(),
    )  # fmt: skip
    with pytest.raises(ValueError, match="saved by a sharded"):
        load_checkpoint(sharded, optimizer=opt, scheduler=sched)


def _save_in(run_dir, step, parts, launch):
    from grpo_train.run.checkpoint import RunIdentity

    model, tokenizer = parts
    opt, sched = _optim(model)
    identity = RunIdentity(model={"architecture": "x"}, envs=[], config={"seed": 0})
    return save_checkpoint(
        run_dir, step, model=model, tokenizer=tokenizer, optimizer=opt, scheduler=sched,
        sampler=SamplerState(step, (step,)), config_yaml=TrainConfig().to_yaml(), keep_last=10,
        identity=identity, launch=launch,
    )  # fmt: skip


def test_latest_follows_the_lineage_not_the_highest_step(parts, tmp_path):
    from grpo_train.run.checkpoint import (
        Head,
        checkpoint_path,
        read_head,
        read_manifest,
        start_lineage,
        verify_files,
        write_head,
    )

    start_lineage(tmp_path, None, "a")
    for step in (1, 2, 3):
        _save_in(tmp_path, step, parts, "a")
    assert latest_checkpoint(tmp_path) == checkpoint_path(tmp_path, 3)
    assert read_manifest(checkpoint_path(tmp_path, 3)).parent == "step-000002"
    verify_files(checkpoint_path(tmp_path, 3))
    # Roll back to step 1: steps 2 and 3 belong to the abandoned branch and are moved aside.
    moved = start_lineage(tmp_path, checkpoint_path(tmp_path, 1), "b")
    assert [p.name for p in moved] == ["step-000002", "step-000003"]
    assert latest_checkpoint(tmp_path) == checkpoint_path(tmp_path, 1)
    _save_in(tmp_path, 2, parts, "b")
    # A crash between publishing step 2 and moving the head: still found (launch b wrote it).
    write_head(tmp_path, Head("step-000001", "b"))
    assert latest_checkpoint(tmp_path) == checkpoint_path(tmp_path, 2)
    # An old branch's higher step put back by hand is not picked either.
    moved[1].rename(checkpoint_path(tmp_path, 3))
    assert latest_checkpoint(tmp_path) == checkpoint_path(tmp_path, 2)
    assert read_head(tmp_path) == Head("step-000001", "b")


def test_the_learning_signal_guard_state_survives_a_resume_and_old_files_still_load(
    parts, tmp_path
):
    model, tokenizer = parts
    opt, sched = _optim(model)
    guard = SamplerState(8, (8,), signal_streak=2, signal_fired=False, signal_eased=True)
    path = save_checkpoint(
        tmp_path, 2, model=model, tokenizer=tokenizer, optimizer=opt, scheduler=sched,
        sampler=guard, config_yaml=TrainConfig().to_yaml(), keep_last=2,
    )  # fmt: skip
    assert load_checkpoint(path, optimizer=opt, scheduler=sched).sampler == guard
    # A checkpoint from before the eased flag: [streak, fired] only.
    state = torch.load(path / "trainer_state.pt", weights_only=True)
    state["sampler"]["signal"] = [3, True]
    torch.save(state, path / "trainer_state.pt")
    old = load_checkpoint(path, optimizer=opt, scheduler=sched).sampler
    assert (old.signal_streak, old.signal_fired, old.signal_eased) == (3, True, False)


def test_the_automatic_switches_survive_a_resume_and_old_checkpoints_have_none(parts, tmp_path):
    model, tokenizer = parts
    opt, sched = _optim(model)
    switches = [(3, "curriculum=auto sent x stage 1/2"), (6, "dynamic_sampling=auto on")]
    path = save_checkpoint(
        tmp_path, 6, model=model, tokenizer=tokenizer, optimizer=opt, scheduler=sched,
        sampler=SamplerState(), config_yaml=TrainConfig().to_yaml(), keep_last=2, switches=switches,
    )  # fmt: skip
    assert load_checkpoint(path, optimizer=opt, scheduler=sched).switches == tuple(switches)
    assert json.loads((path / "switches.json").read_text())[1] == {
        "step": 6,
        "what": "dynamic_sampling=auto on",
    }
    (path / "switches.json").write_text("[{'step': 3}")
    with pytest.raises(CheckpointError, match=r"switches\.json cannot be read"):
        load_checkpoint(path, optimizer=opt, scheduler=sched)
    # A checkpoint written before switches were recorded: None (not "no switches").
    (path / "switches.json").unlink()
    assert load_checkpoint(path, optimizer=opt, scheduler=sched).switches is None
    empty = _save(tmp_path, 7, model, tokenizer, opt, sched)
    assert load_checkpoint(empty, optimizer=opt, scheduler=sched).switches == ()


@pytest.mark.parametrize(("saved", "here"), [(8, 1), (2, 2), (1, 4)])
def test_cuda_rng_states_restore_on_a_machine_with_fewer_gpus(monkeypatch, saved, here):
    """A checkpoint keeps one CUDA generator state per GPU its process saw; a resume that sees
    fewer GPUs restores the ones it has. Only the device query and the per-device setter are
    stood in for (a CPU has no CUDA generators): the setter fails as torch's does for a device
    index past ``torch.cuda.default_generators``."""
    from grpo_train.run.checkpoint import rng_state, set_rng_state

    restored: dict[int, torch.Tensor] = {}

    def set_one(new_state: torch.Tensor, device: int | str = "cuda") -> None:
        index = device if isinstance(device, int) else 0
        if index >= here:
            raise IndexError("tuple index out of range")  # default_generators[index]
        restored[index] = new_state

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: here)
    monkeypatch.setattr(torch.cuda, "set_rng_state", set_one)
    monkeypatch.setattr(torch.cuda.random, "set_rng_state", set_one)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: [])
    state = rng_state()
    state["cuda"] = [torch.full((16,), i, dtype=torch.uint8) for i in range(saved)]
    set_rng_state(state)
    assert sorted(restored) == list(range(min(saved, here)))
    assert all(int(restored[i][0]) == i for i in restored)


# A rank of a 2-process DDP run (real gloo process group, real accelerate Accelerator): save
# step 1, then save step 2 with rank 1's writes failing (a full disk); report how long the save
# took and what it raised. Then stay alive until the other rank has reported, as a rank on
# another node would (a rank that exits makes gloo fail its peers at once, which NCCL across
# nodes does not).
_FAILING_RANK_SCRIPT = """
import errno, json, os, sys, time
from datetime import timedelta
from pathlib import Path
import torch
from accelerate import Accelerator
from accelerate.utils import InitProcessGroupKwargs
from transformers import AutoModelForCausalLM, AutoTokenizer
from grpo_train.config import TrainConfig
from grpo_train.run.checkpoint import RunIdentity, SamplerState, save_checkpoint

model_path, run_dir, timeout_s = sys.argv[1], Path(sys.argv[2]), float(sys.argv[3])
group_timeout = InitProcessGroupKwargs(timeout=timedelta(seconds=timeout_s))
accelerator = Accelerator(cpu=True, kwargs_handlers=[group_timeout])
rank = accelerator.process_index
model = AutoModelForCausalLM.from_pretrained(model_path)
tokenizer = AutoTokenizer.from_pretrained(model_path)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
identity = RunIdentity(model={"architecture": "x"}, envs=[], config={"seed": 0})

def save(step):
    return save_checkpoint(
        run_dir, step, model=model, tokenizer=tokenizer, optimizer=optimizer,
        scheduler=scheduler, sampler=SamplerState(step, (step,)),
        config_yaml=TrainConfig().to_yaml(), keep_last=3, accelerator=accelerator,
        identity=identity, launch="L",
    )

save(1)
if rank == 1:
    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")
    torch.save = disk_full
start = time.monotonic()
try:
    save(2)
    outcome = "saved"
except BaseException as err:
    outcome = f"{type(err).__name__}: {err}"
report = {"seconds": time.monotonic() - start, "outcome": outcome}
(run_dir / f"rank{rank}.json").write_text(json.dumps(report))
other = run_dir / f"rank{1 - rank}.json"
deadline = time.monotonic() + 3 * timeout_s
while not other.exists() and time.monotonic() < deadline:
    time.sleep(0.1)
os._exit(0)
"""


@pytest.mark.timeout(240)
def test_a_rank_failing_mid_save_stops_every_rank_at_once(parts, tiny_model_path, tmp_path):
    """Rank 1 cannot write its part of step 2: both ranks raise within seconds, naming rank 1,
    instead of rank 0 waiting at the next barrier until the process group's timeout; no
    temporary folder is left and step 1 (the last good checkpoint) still loads."""
    import os
    import socket
    import subprocess
    import sys

    from collective_guard.nccl_guard import guarded_env

    group_timeout_s = 30.0
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    procs = []
    for rank in (0, 1):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "OMP_NUM_THREADS": "1"}  # fmt: skip
        cmd = [sys.executable, "-c", _FAILING_RANK_SCRIPT, str(tiny_model_path), str(tmp_path),
               str(group_timeout_s)]  # fmt: skip
        procs.append(subprocess.Popen(cmd, env=guarded_env(env), stderr=subprocess.PIPE, text=True))
    errors = [proc.communicate(timeout=200)[1] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], errors
    reports = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    for rank, report in enumerate(reports):
        # Well below the group's timeout: the failure is agreed on, not waited out.
        assert report["seconds"] < group_timeout_s / 3, (rank, report)
        assert report["outcome"].startswith("OutputWriteError"), (rank, report)
        assert "rank 1" in report["outcome"] and "No space left" in report["outcome"], report
    assert len(reports[0]["outcome"].splitlines()) == 1
    good = checkpoint.checkpoint_path(tmp_path, 1)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        "lineage.json",
        "step-000001",
    ]
    assert latest_checkpoint(tmp_path) == good
    checkpoint.verify_files(good)
    model, _ = parts
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    assert load_checkpoint(good, optimizer=opt, scheduler=sched).step == 1
