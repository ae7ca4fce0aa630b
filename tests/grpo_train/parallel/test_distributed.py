"""Data-parallel helpers: pure sharding tests and a 2-process CPU run via ``accelerate launch``.

The slow test launches this very file as the worker script (``python test_distributed.py --out``):
two gloo ranks run a few GRPO updates of the tiny model with DDP from ``accelerate.prepare``, then
check gathers, replica equality, and FSDP2 full-state-dict gathering with LoRA merged. The pytest
process runs the same updates single-process and compares the final weights.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch
from collective_guard.nccl_guard import GUARD_BANNER, guarded_env

from grpo_train.algorithm.advantages import compute_advantages
from grpo_train.algorithm.baselines import EmaBaselines, ema_advantages, group_key
from grpo_train.algorithm.global_advantages import (
    gather_step_rewards,
    global_advantages,
    global_ema_advantages,
)
from grpo_train.collect.batch import RolloutBatch
from grpo_train.config import TrainConfig
from grpo_train.learner.lora import LoraSettings, reference_logprobs
from grpo_train.learner.update import Learner, grpo_update
from grpo_train.learner.weight_export import (
    export_state_dict,
    export_stream,
    full_state_dict,
    is_sharded,
    merge_lora_state_dict,
    sync_rollout_weights,
)
from grpo_train.parallel import distributed
from grpo_train.parallel.distributed import (
    data_parallel_loss_scale,
    generation_share,
    global_loss_normalizers,
    max_rank_difference,
    micro_batch_schedule,
    rank_info,
    shard_bounds,
    shard_prompts,
    vllm_colocate_kwargs,
)
from grpo_train.setup.settings import update_settings

PROMPTS, GROUP, STEPS, LR, BETA = 4, 3, 3, 0.5, 0.1
LORA = LoraSettings(lora_r=4, lora_alpha=8)
# Section 3's EMA check: rank r's groups (r + 1 of them) and the baselines before the step.
EMA_KEYS = [[group_key(0, "a")], [group_key(0, "b"), group_key(1, "a")]]
EMA_START = EmaBaselines({"0/a": 2.0}, {"0": 5.0})

# ------------------------------------------------------------------------------- pure helpers


def test_shard_bounds_hand_cases() -> None:
    assert [shard_bounds(5, r, 2) for r in range(2)] == [(0, 3), (3, 5)]
    assert [shard_bounds(4, r, 2) for r in range(2)] == [(0, 2), (2, 4)]
    assert [shard_bounds(1, r, 3) for r in range(3)] == [(0, 1), (1, 1), (1, 1)]
    with pytest.raises(ValueError, match="rank"):
        shard_bounds(4, 2, 2)


def test_generation_share_hand_cases() -> None:
    # 10 prompts over 6 ranks: shares 0-2, 2-4, 4-6, 6-8, 8-9, 9-10. Engines of 3 ranks: the
    # first generates 0-6, the second 6-10; each rank keeps its shard_bounds share.
    shares = [generation_share(10, r, 6, tensor_parallel=3) for r in range(6)]
    assert [s.generate for s in shares] == [(0, 6)] * 3 + [(6, 10)] * 3
    assert [s.keep for s in shares] == [(0, 2), (2, 4), (4, 6), (6, 8), (8, 9), (9, 10)]
    assert shares[4].own(list("ghij")) == ["i"]
    # Fewer prompts than ranks: the second engine's ranks generate and keep nothing.
    shares = [generation_share(1, r, 4, tensor_parallel=2) for r in range(4)]
    assert [s.generate for s in shares] == [(0, 1), (0, 1), (1, 1), (1, 1)]
    assert [s.own(["a"]) if s.generate == (0, 1) else s.own([]) for s in shares] == [
        ["a"], [], [], [],
    ]  # fmt: skip
    with pytest.raises(ValueError, match="divide"):
        generation_share(4, 0, 3, tensor_parallel=2)


@pytest.mark.parametrize(("world", "tp"), [(1, 1), (2, 2), (4, 2), (6, 3), (8, 4)])
def test_generation_shares_rebuild_every_rank_share(world: int, tp: int) -> None:
    # Whatever the grouping, the kept items are exactly the ranks' shards, in order.
    for n in range(0, 13):
        items = list(range(n))
        kept = []
        for rank in range(world):
            share = generation_share(n, rank, world, tp)
            kept.append(share.own(items[share.generate[0] : share.generate[1]]))
            assert share.keep == shard_bounds(n, rank, world)
        assert [k for part in kept for k in part] == items


@pytest.mark.parametrize("n_groups", [0, 1, 5, 8, 13])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_shards_cover_in_order_and_keep_groups_whole(n_groups: int, world: int) -> None:
    group = 3
    rows = [(g, k) for g in range(n_groups) for k in range(group)]  # (group id, member)
    shards = [shard_prompts(rows, r, world, group_size=group) for r in range(world)]
    assert [row for shard in shards for row in shard] == rows  # deterministic, nothing lost
    owners = {
        g: {r for r, s in enumerate(shards) for gid, _ in s if gid == g} for g in range(n_groups)
    }
    assert all(len(o) == 1 for o in owners.values())  # a group lives on exactly one rank
    sizes = [len(s) // group for s in shards]
    assert max(sizes) - min(sizes) <= 1
    assert shard_prompts(rows, 0, world, group_size=group) == shards[0]  # same call, same answer


def test_partial_group_is_refused() -> None:
    with pytest.raises(ValueError, match="whole groups"):
        shard_prompts(list(range(7)), 0, 2, group_size=3)


def test_backend_device_follows_the_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    """NCCL communicates CUDA tensors only; gloo takes CPU ones; no CUDA under NCCL is an error."""
    import torch.distributed as dist

    import grpo_train.parallel.distributed as d

    assert d.backend_device() == torch.device("cpu")  # no process group
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_backend", lambda *a: "nccl")
    monkeypatch.setattr(d, "_backend_device_types", lambda: [torch.device("cuda")])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert d.backend_device() == torch.device("cuda", 1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="no cuda device"):
        d.backend_device()
    gloo = [torch.device("cuda"), torch.device("cpu")]  # what torch records for a gloo group
    monkeypatch.setattr(d, "_backend_device_types", lambda: gloo)
    assert d.backend_device() == torch.device("cpu")


def test_collective_guard_rejects_a_tensor_the_backend_was_not_given() -> None:
    """The guard the multi-rank tests run under: an unplaced tensor from our code is refused."""
    from collective_guard import nccl_guard

    calls: list[int] = []
    guarded = nccl_guard._guarded("all_reduce", lambda t: calls.append(t.numel()))
    ours: dict[str, Any] = {"__name__": "grpo_train.fake", "reduce": guarded, "torch": torch}
    with pytest.raises(RuntimeError, match="NCCL would reject"):
        exec("reduce(torch.zeros(3))", ours)
    placed = nccl_guard._marking(lambda t: t.clone())(torch.zeros(2))
    exec("reduce(placed)", {**ours, "placed": placed})
    exec("reduce(torch.zeros(4))", {**ours, "__name__": "accelerate.utils"})  # not our call
    assert calls == [2, 4]


def test_single_process_helpers_are_identities() -> None:
    assert distributed.any_rank(True) and not distributed.any_rank(False)
    items = ["x", "y"]
    assert distributed.gather_objects(items) is items
    assert global_loss_normalizers(17, 4) == (17, 4)
    assert data_parallel_loss_scale() == 1.0
    assert micro_batch_schedule(3) == [(0, 1.0), (1, 1.0), (2, 1.0)]
    assert micro_batch_schedule(0) == []
    assert vllm_colocate_kwargs(seed=3) == {"seed": 3}
    with pytest.raises(ValueError, match="divide"):
        vllm_colocate_kwargs(seed=3, tensor_parallel_size=2)
    assert rank_info().world_size == 1 and rank_info().is_main


_EMPTY_RANK_SCRIPT = """
import sys
from datetime import timedelta
import torch.distributed as dist
from grpo_train.parallel.distributed import micro_batch_schedule
dist.init_process_group("gloo", timeout=timedelta(seconds=60))
try:
    print("schedule", micro_batch_schedule(int(sys.argv[1])))
except ValueError as err:
    print("refused", err)
dist.destroy_process_group()
"""


@pytest.mark.timeout(120)
def test_a_rank_without_micro_batches_stops_every_rank() -> None:
    """Rank 0 has no micro-batch, rank 1 has two: both refuse the step. Were only rank 0 to
    raise, rank 1 would go on into a forward whose collectives wait for it (under NCCL, until
    the collective timeout; other nodes' launchers do not stop their ranks sooner)."""
    port = str(_free_port())
    procs = []
    for rank, count in enumerate((0, 2)):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": port, "OMP_NUM_THREADS": "1"}  # fmt: skip
        cmd = [sys.executable, "-c", _EMPTY_RANK_SCRIPT, str(count)]
        procs.append(subprocess.Popen(cmd, env=guarded_env(env), stdout=subprocess.PIPE, text=True))
    outputs = [proc.communicate(timeout=100)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], outputs
    assert all("refused a rank has no micro-batch" in out for out in outputs), outputs


def test_engines_take_exported_state_dicts(tiny_model_path: Path) -> None:
    from grpo_train.models.loading import load_policy
    from grpo_train.rollout.hf import HFEngine

    engine = HFEngine(tiny_model_path)
    trained, _ = load_policy(str(tiny_model_path))
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(0.01)
    assert not is_sharded(trained)
    engine.sync_weights(full_state_dict(trained))
    for name, tensor in trained.state_dict().items():
        assert torch.equal(engine.model.state_dict()[name], tensor), name
    # The replicated path exports the module's merged weights.
    trained2, _ = load_policy(str(tiny_model_path))
    sync_rollout_weights(engine, trained2)
    assert torch.equal(engine.model.lm_head.weight, trained2.lm_head.weight)


EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


@pytest.mark.parametrize(
    ("name", "kind", "machines"),
    [
        ("ddp", "MULTI_GPU", 1),
        ("fsdp", "FSDP", 1),
        ("zero2", "DEEPSPEED", 1),
        ("zero3", "DEEPSPEED", 1),
        ("multi_node", "MULTI_GPU", 2),
    ],
)
def test_example_accelerate_configs_load(name: str, kind: str, machines: int) -> None:
    # accelerate's own loader builds a dataclass from the file: an unknown key fails here.
    from accelerate.commands.config.config_args import load_config_from_file

    config = load_config_from_file(str(EXAMPLES / "accelerate" / f"{name}.yaml"))
    assert config.distributed_type.value == kind
    assert config.num_machines == machines and config.num_processes % machines == 0
    if name == "fsdp":
        assert config.fsdp_config["fsdp_version"] == 2
    if name.startswith("zero"):
        assert config.deepspeed_config["zero_stage"] == int(name[-1])
        # auto: set from max_grad_norm (set_deepspeed_gradient_clipping); a number would have
        # to equal it
        assert "gradient_clipping" not in config.deepspeed_config
    if machines > 1:
        assert config.main_process_ip and config.main_process_port
    assert f"accelerate/{name}.yaml" in (EXAMPLES / "README.md").read_text()


# ----------------------------------------------------------------- the GRPO update under test


def synthetic_step(
    step: int, vocab: int
) -> tuple[list[list[int]], list[list[list[int]]], torch.Tensor]:
    """Deterministic prompts, completions (P, G) and rewards: the rollout is not under test."""
    gen = torch.Generator().manual_seed(1000 + step)
    prompts = [
        torch.randint(
            5, vocab, (int(torch.randint(3, 7, (1,), generator=gen)),), generator=gen
        ).tolist()
        for _ in range(PROMPTS)
    ]
    completions = [
        [
            torch.randint(
                5, vocab, (int(torch.randint(2, 9, (1,), generator=gen)),), generator=gen
            ).tolist()
            for _ in range(GROUP)
        ]
        for _ in range(PROMPTS)
    ]
    rewards = torch.tensor(
        [[sum(t % 2 == 0 for t in c) / len(c) for c in group] for group in completions]
    )
    return prompts, completions, rewards


def synthetic_batch(step: int, vocab: int, mine: list[int]) -> RolloutBatch:
    """This rank's prompts ``mine`` of ``synthetic_step``, as the update's rollout batch."""
    prompts, completions, rewards = synthetic_step(step, vocab)
    rows = [completions[p][g] for p in mine for g in range(GROUP)]
    shape = (len(mine), GROUP)
    return RolloutBatch(
        prompt_ids=tuple(tuple(prompts[p]) for p in mine),
        completion_ids=tuple(tuple(c) for c in rows),
        loss_mask=tuple(torch.ones(len(c), dtype=torch.bool) for c in rows),
        sampling_logprobs=tuple((0.0,) * len(c) for c in rows),
        rewards=rewards[mine].double(),
        scored=torch.ones(shape, dtype=torch.bool),
        trainable=torch.ones(shape, dtype=torch.bool),
        truncated=torch.zeros(shape, dtype=torch.bool),
        env_index=torch.zeros(len(mine), dtype=torch.long),
    )


def grpo_updates(
    model: torch.nn.Module, rank: int, world: int, accelerator: Any = None, beta: float = 0.0
) -> tuple[list[float], int]:
    """``STEPS`` real ``grpo_update`` calls (mu = 1, DAPO loss, batch-scaled advantages).

    Returns the step losses (the global loss, on every rank) and the number of zero-weight
    padding passes this rank ran. With ``beta > 0`` the model is a LoRA model and the k3 KL
    term uses the adapter-free reference (``lora.reference_logprobs``), through the DDP wrapper.

    SGD rather than AdamW: Adam's first step is ~lr * sign(grad), so a gradient that is 1e-9 on
    one run and -1e-9 on another (summation order) would move a weight by 2 * lr; SGD keeps the
    single- vs multi-process comparison about the gradients, which is what is under test.
    """
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=LR)

    def sgd_step(loss: float) -> float:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return 0.0

    inner: Any = getattr(model, "module", model)  # through the DDP wrapper
    vocab = int(inner.config.vocab_size)
    learner = Learner(
        model,
        pad_id=0,
        reference=(lambda mb: reference_logprobs(model, mb)) if beta else None,
        accelerator=accelerator,
    )
    padded = 0
    schedule = distributed.micro_batch_schedule

    def counted_schedule(count: int) -> list[tuple[int, float]]:
        nonlocal padded
        plan = schedule(count)
        padded += sum(weight == 0.0 for _, weight in plan)
        return plan

    # A small budget gives each rank several micro-batches, and different counts per rank.
    settings = update_settings(
        TrainConfig.from_flat(
            {"beta": beta, "loss_type": "dapo", "is_correction": False, "micro_batch_tokens": 24}
        )
    )
    losses = []
    with mock.patch.object(distributed, "micro_batch_schedule", counted_schedule):
        for step in range(STEPS):
            batch = synthetic_batch(step, vocab, shard_prompts(list(range(PROMPTS)), rank, world))
            advantages = global_advantages(batch.rewards, "grpo", "batch", local_valid=batch.scored)
            metrics = grpo_update(learner, sgd_step, batch, advantages.local.float(), settings)
            losses.append(metrics["loss"])
    return losses, padded


# ------------------------------------------------------------------------------ worker (2 ranks)


def _worker(model_path: str, out: Path) -> None:
    from accelerate import Accelerator

    from grpo_train.learner.lora import apply_lora, save_merged
    from grpo_train.models.loading import load_policy

    accelerator = Accelerator(cpu=True)
    info = rank_info()
    report: dict[str, Any] = {"rank": info.rank, "world": info.world_size}
    times = {"start": time.perf_counter()}

    # 1. DDP GRPO updates.
    torch.manual_seed(0)
    model, _ = load_policy(model_path)
    ddp = accelerator.prepare(model)
    report["wrapper"] = type(ddp).__name__
    report["losses"], report["padded"] = grpo_updates(ddp, info.rank, info.world_size, accelerator)
    report["replica_diff"] = max_rank_difference(ddp)
    report["vllm_kwargs"] = vllm_colocate_kwargs(seed=5)
    times["ddp"] = time.perf_counter()

    # 1b. LoRA under DDP with a KL term against the adapter-free reference.
    torch.manual_seed(0)
    lora_ddp = accelerator.prepare(apply_lora(load_policy(model_path)[0], LORA))
    report["lora_losses"], _ = grpo_updates(lora_ddp, info.rank, info.world_size, accelerator, BETA)
    report["lora_replica_diff"] = max_rank_difference(lora_ddp)
    if info.is_main:
        lora_state = accelerator.unwrap_model(lora_ddp).state_dict()
        torch.save({k: v.detach().clone() for k, v in lora_state.items()}, out / "lora_params.pt")

    # 2. The checker sees a difference planted on one rank.
    param = next(accelerator.unwrap_model(ddp).parameters())
    with torch.no_grad():
        if info.rank == 1:
            param.view(-1)[0] += 0.25
        report["planted_diff"] = max_rank_difference(ddp)
        if info.rank == 1:
            param.view(-1)[0] -= 0.25

    # 3. Uneven gathers: rank r holds r + 1 reward rows.
    local = torch.tensor([[10.0 * info.rank + i, 0.0] for i in range(info.rank + 1)])
    report["gathered"] = gather_step_rewards(local).rewards.tolist()
    report["batch_adv"] = global_advantages(local, scale_rewards="batch").local.tolist()
    # EMA baselines: every rank's advantages from every rank's groups, the same new state.
    ema_adv, ema_state = global_ema_advantages(
        local,
        EMA_KEYS[info.rank],
        EMA_START,
        0.9,
        "batch",
        torch.ones_like(local, dtype=torch.bool),
    )
    report["ema_adv"], report["ema_state"] = ema_adv.tolist(), ema_state.to_state()

    # 4. DDP full state dict has clean names and the trained weights.
    state = full_state_dict(ddp)
    unwrapped = accelerator.unwrap_model(ddp).state_dict()
    report["ddp_state_ok"] = set(state) == set(unwrapped) and all(
        torch.equal(state[k], unwrapped[k]) for k in unwrapped
    )
    if info.is_main:
        torch.save({k: v.detach().clone() for k, v in unwrapped.items()}, out / "ddp_params.pt")
    times["checks"] = time.perf_counter()

    # 5. FSDP2 shards of a LoRA model: gathered + merged on every rank == merged before sharding.
    from torch.distributed.fsdp import fully_shard

    from grpo_train.rollout.hf import HFEngine

    lora = apply_lora(load_policy(model_path)[0], LORA)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    expected = export_state_dict(lora)
    expected = {k: v.clone() for k, v in expected.items()}
    base: Any = lora.get_base_model()
    for layer in base.model.layers:
        fully_shard(layer)
    fully_shard(lora)
    report["fsdp_sharded"] = is_sharded(lora)
    gathered = merge_lora_state_dict(full_state_dict(lora), 8.0 / 4)
    report["fsdp_merge_max_err"] = max(
        float((gathered[k] - v).abs().max()) for k, v in expected.items()
    )
    # The streamed export (one all-gather per tensor, LoRA merged per layer): the same names
    # and values on the rank that keeps it; a rank that does not keep it joins and holds none.
    streamed = {k: v.detach().clone() for k, v in export_stream(lora, keep=info.is_main)}
    if info.is_main:
        report["fsdp_stream_names_ok"] = set(streamed) == set(expected)
        report["fsdp_stream_max_err"] = max(
            float((streamed[k] - v).abs().max()) for k, v in expected.items()
        )
    else:
        report["fsdp_stream_names_ok"] = streamed == {}
        report["fsdp_stream_max_err"] = 0.0
    engine = HFEngine(model_path)
    sync_rollout_weights(engine, lora)
    engine_state = engine.model.state_dict()
    report["engine_sync_max_err"] = max(
        float((engine_state[k] - v).abs().max()) for k, v in expected.items()
    )
    # save_merged gathers the shards onto rank 0 (collective) and writes a plain HF folder.
    save_merged(lora, None, out / "merged", is_main_process=info.is_main)
    if info.is_main:
        torch.save(expected, out / "expected_merged.pt")
    times["fsdp"] = time.perf_counter()
    report["seconds"] = {k: round(v - times["start"], 2) for k, v in times.items() if k != "start"}
    (out / f"rank{info.rank}.json").write_text(json.dumps(report))
    accelerator.wait_for_everyone()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_two_cpu_ranks_match_single_process(tmp_path: Path, tiny_model_path: Path) -> None:
    from safetensors.torch import load_file
    from two_ranks import accelerate_two_ranks

    cmd = [*accelerate_two_ranks(__file__), "--model", str(tiny_model_path), "--out", str(tmp_path)]
    env = guarded_env({**os.environ, "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1"})
    # Start the two ranks, and run the single-process reference while they work.
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        from grpo_train.learner.lora import apply_lora
        from grpo_train.models.loading import load_policy

        torch.manual_seed(0)
        single, _ = load_policy(str(tiny_model_path))
        initial = {k: v.clone() for k, v in single.state_dict().items()}
        losses, padded = grpo_updates(single, rank=0, world=1)
        assert padded == 0  # one process never pads
        torch.manual_seed(0)
        single_lora = apply_lora(load_policy(str(tiny_model_path))[0], LORA)
        lora_losses, _ = grpo_updates(single_lora, rank=0, world=1, beta=BETA)
        stdout, stderr = proc.communicate(timeout=360)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stdout[-3000:] + stderr[-5000:]
    assert stderr.count(GUARD_BANNER) >= 2  # both ranks ran under the NCCL collective guard
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]

    for rep in reports:
        assert rep["world"] == 2 and rep["wrapper"] == "DistributedDataParallel"
        assert rep["vllm_kwargs"] == {
            "seed": 5 + rep["rank"],
            "tensor_parallel_size": 1,
            "distributed_executor_backend": "external_launcher",
        }
        assert rep["replica_diff"] == 0.0  # DDP kept both replicas bit-identical
        assert rep["lora_replica_diff"] == 0.0
        assert rep["planted_diff"] == pytest.approx(0.25, abs=1e-6)
        assert rep["gathered"] == [[0.0, 0.0], [10.0, 0.0], [11.0, 0.0]]
        assert rep["ddp_state_ok"] and rep["fsdp_sharded"]
        assert rep["fsdp_merge_max_err"] < 1e-6 and rep["engine_sync_max_err"] < 1e-6
        assert rep["fsdp_stream_names_ok"] and rep["fsdp_stream_max_err"] < 1e-6
    merged_fsdp = load_file(tmp_path / "merged" / "model.safetensors")
    for name, tensor in torch.load(tmp_path / "expected_merged.pt").items():
        torch.testing.assert_close(merged_fsdp[name], tensor, rtol=0, atol=1e-6, msg=name)
    # The data makes the ranks' micro-batch counts differ, so the padding path ran.
    assert reports[0]["padded"] + reports[1]["padded"] > 0
    every_key = [key for keys in EMA_KEYS for key in keys]
    ema_all, ema_state = ema_advantages(
        torch.tensor(reports[1]["gathered"]), every_key, EMA_START, 0.9, "batch"
    )
    for rep in reports:  # identical baselines on both ranks, as one process computes them
        assert rep["ema_state"] == ema_state.to_state()
    torch.testing.assert_close(torch.tensor(reports[0]["ema_adv"]), ema_all[:1])
    torch.testing.assert_close(torch.tensor(reports[1]["ema_adv"]), ema_all[1:])
    everything = compute_advantages(torch.tensor(reports[1]["gathered"]), scale_rewards="batch")
    torch.testing.assert_close(torch.tensor(reports[0]["batch_adv"]), everything[:1])
    torch.testing.assert_close(torch.tensor(reports[1]["batch_adv"]), everything[1:])

    # The same global batches single-process: same weights within float tolerance.
    ddp_params = torch.load(tmp_path / "ddp_params.pt")
    moved = max(float((single.state_dict()[k] - initial[k]).abs().max()) for k in initial)
    assert moved > 1e-3  # the updates did something
    for name, tensor in single.state_dict().items():
        torch.testing.assert_close(ddp_params[name], tensor, rtol=0, atol=1e-5, msg=name)

    # LoRA + KL to the adapter-free reference: same adapters, base untouched.
    lora_params = torch.load(tmp_path / "lora_params.pt")
    for name, tensor in single_lora.state_dict().items():
        torch.testing.assert_close(lora_params[name], tensor, rtol=0, atol=1e-5, msg=name)
        if "lora_" not in name:
            assert torch.equal(
                tensor, initial[name.replace("base_model.model.", "").replace(".base_layer", "")]
            )
    assert any(
        ("lora_B" in k) and v.abs().max() > 1e-4 for k, v in single_lora.state_dict().items()
    )
    # Every rank reports the global loss (the ranks' shares summed): the single process's.
    for rep in reports:
        assert rep["lora_losses"] == pytest.approx(lora_losses, abs=1e-5)
        assert rep["losses"] == pytest.approx(losses, abs=1e-5)


def _cli_args(model: Path, out: Path) -> list[str]:
    return [
        "grpo", "train", "--model", str(model), "--env", "test/digit-v0", "--engine", "hf",
        "--max_steps", "2", "--num_generations", "4", "--prompts_per_step", "4",
        "--max_completion_length", "6", "--eval_size", "2", "--save_every", "0",
        "--learning_rate", "5e-3", "--seed", "11", "--seed_per_prompt", "true",
        "--progress", "false", "--log_every_samples", "0", "--output_dir", str(out),
    ]  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_grpo_train_cli_on_two_cpu_ranks_matches_one_process(
    tmp_path: Path, tiny_model_path: Path
) -> None:
    """The real `grpo train` under `accelerate launch`: 2 gloo ranks == 1 process, same batch."""
    from safetensors.torch import load_file
    from two_ranks import accelerate_two_ranks

    from grpo_train.run.run_log import read_metrics

    launch = accelerate_two_ranks(__file__)
    env = guarded_env({**os.environ, "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1"})
    env["TOKENIZERS_PARALLELISM"] = "false"
    two = subprocess.Popen(
        launch + _cli_args(tiny_model_path, tmp_path / "two"),
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    one = subprocess.Popen(
        # DDP ranks run one forward per row; so does the single process here (a shared prompt
        # forward is the same math in another float32 order, and Adam amplifies that at lr 5e-3).
        [
            sys.executable, __file__, *_cli_args(tiny_model_path, tmp_path / "one"),
            "--share_prompt_forward", "false",
        ],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        outs = [p.communicate(timeout=280) for p in (two, one)]
    finally:
        for p in (two, one):
            if p.poll() is None:
                p.kill()
                p.communicate()
    for p, (stdout, stderr) in zip((two, one), outs):
        assert p.returncode == 0, stdout[-2000:] + stderr[-4000:]
    assert outs[0][1].count(GUARD_BANNER) >= 2  # both ranks ran under the NCCL collective guard
    # Only the main rank reports; both ranks end with bit-identical weights.
    assert outs[0][0].count("held-out accuracy: before") == 1
    two_rows, one_rows = read_metrics(tmp_path / "two"), read_metrics(tmp_path / "one")
    assert [r["step"] for r in two_rows] == [0, 1, 2]  # rank 0 evaluated before and after
    assert two_rows[-1]["eval/accuracy"] == one_rows[-1]["eval/accuracy"]
    assert two_rows[-1]["dist/max_rank_diff"] == 0.0
    # Same global batch: the same rewards, and the same loss (summed over ranks).
    for a, b in zip(two_rows[1:], one_rows[1:], strict=True):
        assert a["reward/mean"] == pytest.approx(b["reward/mean"], abs=1e-9)
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-5)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)
        # Entropy is measured on the rows that train (on each rank's first row where no row
        # trains at all: then one process and two ranks measure different rows).
        if a["group/frac_zero_std"] < 1:
            assert a["entropy"] == pytest.approx(b["entropy"], rel=1e-5)
    weights = [
        load_file(tmp_path / run / "checkpoints" / "step-000002" / "model" / "model.safetensors")
        for run in ("two", "one")
    ]
    initial = load_file(tiny_model_path / "model.safetensors")
    assert max(float((weights[1][k] - initial[k]).abs().max()) for k in initial) > 1e-4
    for name, tensor in weights[1].items():
        torch.testing.assert_close(weights[0][name], tensor, rtol=0, atol=2e-5, msg=name)


def _grpo_with_digit_env(argv: list[str]) -> int:
    """``grpo`` (the real CLI) with the toy ``test/digit-v0`` registered: a reward a random tiny
    model finds now and then, so the updates are not all zero."""
    sys.path.insert(0, str(Path(__file__).parents[1]))
    import grpo_envs
    from grpo_train.cli import main

    grpo_envs.register("test/digit-v0", "toy_env:DigitEnv")
    return main(argv)


if __name__ == "__main__" and sys.argv[1:2] == ["grpo"]:
    raise SystemExit(_grpo_with_digit_env(sys.argv[2:]))
if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    _worker(args.model, args.out)


@pytest.mark.parametrize("given", ["auto", None, 4])
def test_deepspeed_gets_a_micro_batch_size_without_a_dataloader(given: object) -> None:
    """accelerate's prepare() resolves ``auto`` from a dataloader, which the trainer has not:
    the DeepSpeed plugin the zero*.yaml examples build gets a number, a user's own is kept."""
    from types import SimpleNamespace

    from accelerate.utils import DeepSpeedPlugin

    from grpo_train.parallel.distributed import set_deepspeed_micro_batch_size

    plugin = DeepSpeedPlugin(zero_stage=2, gradient_accumulation_steps=1)
    if given is None:
        del plugin.deepspeed_config["train_micro_batch_size_per_gpu"]
    else:
        plugin.deepspeed_config["train_micro_batch_size_per_gpu"] = given
    set_deepspeed_micro_batch_size(SimpleNamespace(state=SimpleNamespace(deepspeed_plugin=plugin)))
    # what prepare() reads (through the plugin's HfDeepSpeedConfig)
    assert not plugin.is_auto("train_micro_batch_size_per_gpu")
    assert plugin.get_value("train_micro_batch_size_per_gpu") == (4 if given == 4 else 1)
    set_deepspeed_micro_batch_size(SimpleNamespace(state=SimpleNamespace(deepspeed_plugin=None)))


@pytest.mark.parametrize(
    ("given", "max_grad_norm", "clips_at"),
    [("auto", 0.5, 0.5), (None, 0.5, 0.5), ("auto", 0.0, 0.0), (0.5, 0.5, 0.5), (1.0, 0.5, None)],
)
def test_deepspeed_clips_at_max_grad_norm(
    given: object, max_grad_norm: float, clips_at: float | None
) -> None:
    """DeepSpeed clips inside its own step, at its ``gradient_clipping``; accelerate's prepare()
    fills an ``auto`` with 1.0 whatever max_grad_norm is. It becomes max_grad_norm before
    prepare(); a different number in the launcher's config is refused, naming both."""
    from types import SimpleNamespace

    from accelerate.utils import DeepSpeedPlugin

    from grpo_train.parallel.distributed import set_deepspeed_gradient_clipping

    def plugin_with(value: object) -> DeepSpeedPlugin:
        plugin = DeepSpeedPlugin(zero_stage=2, gradient_accumulation_steps=1)
        if value is None:
            plugin.deepspeed_config.pop("gradient_clipping", None)
        else:
            plugin.deepspeed_config["gradient_clipping"] = value
        return plugin

    def prepared(plugin: DeepSpeedPlugin) -> object:
        # What Accelerator._prepare_deepspeed does with the config before deepspeed.initialize.
        filled = {"gradient_clipping": 1.0, "train_micro_batch_size_per_gpu": 1}
        plugin.deepspeed_config_process(must_match=False, train_batch_size=1, **filled)
        return plugin.deepspeed_config.get("gradient_clipping", 0.0)  # DeepSpeed's default: 0

    assert prepared(plugin_with("auto")) == 1.0  # accelerate alone: 1.0, whatever the run says
    plugin = plugin_with(given)
    problem = set_deepspeed_gradient_clipping(
        SimpleNamespace(state=SimpleNamespace(deepspeed_plugin=plugin)), max_grad_norm
    )
    if clips_at is None:
        assert problem is not None
        assert "max_grad_norm is 0.5" in problem and "gradient_clipping: 1.0" in problem
        assert "auto" in problem and "--max_grad_norm 1.0" in problem
    else:
        assert problem is None and prepared(plugin) == clips_at
    no_plugin = SimpleNamespace(state=SimpleNamespace(deepspeed_plugin=None))
    assert set_deepspeed_gradient_clipping(no_plugin, 0.5) is None
