"""Ctrl-C and SIGTERM as they arrive: to the whole process group of a real `grpo train`.

A terminal sends Ctrl-C to its foreground process group and job runners (``timeout``, Slurm,
Kubernetes) signal every process of the job, so the rollout engine's processes get it too. Each
test runs the real command in its own session and signals the group (``os.killpg``) at one phase
of the run, held there by the test-only pause point (``stop.pause_point``: the run writes a marker
file and waits for the signal; the code path is the production one).

To keep CI short, one run is interrupted phase after phase: each link stops at the next phase,
checks the exit code, the one resume line, that the checkpoint it saved holds the uninterrupted
run's weights of that step, no traceback and nothing left running; the next link resumes it
with the printed command. The last link finishes the run, which must end with the uninterrupted
run's weights, bit for bit.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from test_console import check_quiet_vllm_run, quiet_vllm_env

from grpo_train.rollout.base import EngineDied
from grpo_train.rollout.child_output import ChildOutput
from grpo_train.rollout.processes import EngineProcesses, owned_dir, remove_stale_dirs
from grpo_train.rollout.vllm_engine import SYNC_DIR_PREFIX
from grpo_train.run.checkpoint import MODEL_DIR, checkpoint_path, latest_checkpoint
from grpo_train.run.stop import (
    PAUSE_AT_ENV,
    PAUSE_FILE_ENV,
    REPEAT_WINDOW_S,
    SecondSignal,
    StopRequest,
)

BIN = Path(sys.executable).parent
RESUME = re.compile(r"^interrupted by (SIG\w+): saved step (\d+) in (\S+); resume with `(.+)`$")


# ------------------------------------------------------------------------- the pieces, fast


def test_a_repeat_within_the_window_is_the_same_request_a_later_one_is_a_second():
    stop = StopRequest()
    stop.on_signal(signal.SIGTERM, None)
    stop.on_signal(signal.SIGTERM, None)  # the launcher's forwarded copy
    assert stop.signum == signal.SIGTERM and stop.exit_code == 143 and stop.name == "SIGTERM"
    stop._first_at -= REPEAT_WINDOW_S + 0.1
    with pytest.raises(SecondSignal):
        stop.on_signal(signal.SIGINT, None)


def test_a_request_to_a_dead_engine_raises_at_once_and_nothing_is_left():
    before = EngineProcesses.current_children()
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    watched = EngineProcesses.started_since(before, roots=[victim.pid, helper.pid])
    assert set(watched.pids) == {victim.pid, helper.pid}
    assert watched.call(lambda: 42, "generate") == 42 and watched.dead() is None
    victim.kill()
    victim.wait()
    start = time.monotonic()
    with pytest.raises(EngineDied, match=f"during generate: .*pid {victim.pid}"):
        watched.call(lambda: time.sleep(30), "generate")  # a request that would never return
    assert time.monotonic() - start < 5
    watched.end(grace_s=0.5)  # what still ran is killed (and reaped)
    assert not Path(f"/proc/{helper.pid}").exists()


def test_a_killed_child_its_owner_has_not_polled_is_named_killed_by_its_signal():
    # The OOM killer's SIGKILL lands between two polls of the engine's owner: the process is a
    # zombie nobody has reaped, and the message must still give the signal (not "is gone").
    before = EngineProcesses.current_children()
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    # exitcodes: an owner that never polled
    watched = EngineProcesses.started_since(before, roots=[victim.pid])
    os.kill(victim.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while (cause := watched.dead()) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert cause is not None and f"pid {victim.pid}) was killed by SIGKILL" in cause
    assert victim.wait(timeout=5) == -signal.SIGKILL  # left for its owner to reap


# vLLM's engine core as the process tree shows it: named by setproctitle (the kernel keeps 15
# characters), with its worker as a child.
NAMED_ENGINE = """
import subprocess, sys, time
from pathlib import Path
Path("/proc/self/comm").write_text(sys.argv[1])
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print(worker.pid, flush=True)
time.sleep(60)
"""


def _short_lived_child(seconds: float) -> subprocess.Popen[bytes]:
    """A child of the trainer that is not the engine's (torch inductor's compile workers)."""
    return subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"])


@pytest.mark.parametrize("by", ["name", "roots"])
def test_only_the_engines_processes_are_watched_other_children_may_come_and_go(by: str) -> None:
    before = EngineProcesses.current_children()
    helper = _short_lived_child(1.0)  # started with the engine, ended while it runs
    # by roots: vLLM's own list of its engine core processes, without setproctitle's names
    name = "VLLM::EngineCore" if by == "name" else "python"
    engine = subprocess.Popen([sys.executable, "-c", NAMED_ENGINE, name], stdout=subprocess.PIPE)
    worker = int(engine.stdout.readline())  # type: ignore[union-attr]
    roots = [engine.pid] if by == "roots" else []
    watched = EngineProcesses.started_since(before, roots=roots)
    try:
        assert set(watched.pids) == {engine.pid, worker}
        later = _short_lived_child(0.2)  # a compile pool started after the engine was up
        assert watched.call(lambda: (helper.wait(), later.wait(), 42)[2], "generate") == 42
        assert watched.dead() is None
        os.kill(worker, signal.SIGKILL)
        with pytest.raises(EngineDied, match=f"during generate: .*pid {worker}"):
            watched.call(lambda: time.sleep(30), "generate")
    finally:
        watched.end(grace_s=0.5)
        engine.wait(timeout=5)


# A process whose main thread has ended while another still runs: how a killed multithreaded
# process (vLLM's engine core) looks while the kernel tears its threads down. SYS_exit (not
# exit_group) ends the calling thread alone; ctypes releases the GIL around the call.
LEADER_GONE_FIRST = """
import ctypes, os, platform, threading, time
threading.Thread(target=lambda: (time.sleep(1.0), os._exit(7))).start()
ctypes.CDLL(None).syscall({"x86_64": 60, "aarch64": 93}[platform.machine()], 0)
"""


def test_a_process_whose_threads_are_still_ending_is_named_by_its_exit_code():
    # Its state reads zombie at once, but the kernel gives its status only after the last
    # thread exits: the message must wait for the code rather than say "is gone".
    before = EngineProcesses.current_children()
    victim = subprocess.Popen([sys.executable, "-c", LEADER_GONE_FIRST])
    watched = EngineProcesses.started_since(before, roots=[victim.pid])
    deadline = time.monotonic() + 10
    while _running(victim.pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert victim.poll() is None  # the zombie leader: not yet waitable
    assert str(watched.dead()).endswith(f"(pid {victim.pid}) exited with code 7")
    assert victim.wait(timeout=5) == 7


OWNER = """
import subprocess, sys, time
from pathlib import Path
from grpo_train.rollout.processes import EngineProcesses, owned_dir, owned_dirs_pattern
before = EngineProcesses.current_children()
engine = subprocess.Popen([sys.executable, "-c", sys.argv[1]])  # maps a segment, then waits
while not Path(f"/dev/shm/{sys.argv[2]}").exists():
    time.sleep(0.05)
time.sleep(0.5)
processes = EngineProcesses.started_since(before, roots=[engine.pid])
processes.reap_when_owner_dies(remove=[owned_dirs_pattern("grpo-kit-test-", Path(sys.argv[3]))])
folder = owned_dir("grpo-kit-test-", Path(sys.argv[3]))  # made after the reaper started
if sys.argv[4] == "end":
    processes.end(grace_s=0.1)
print(engine.pid, processes.reaper.pid if processes.reaper else 0, folder, flush=True)
time.sleep(60)
"""
ENGINE = """
import sys, time
from multiprocessing import shared_memory
segment = shared_memory.SharedMemory(name=sys.argv[1], create=True, size=4096)
time.sleep(60)
"""


def _owner(tmp_path: Path, ending: str) -> tuple[subprocess.Popen[bytes], list[str], str]:
    name = f"psm_test{os.getpid()}{ending}"
    engine = ENGINE.replace("sys.argv[1]", repr(name))
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, engine, name, str(tmp_path), ending], stdout=subprocess.PIPE
    )
    return owner, owner.stdout.readline().decode().split(), name  # type: ignore[union-attr]


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_sigkilled_owners_engine_processes_segments_and_sync_folders_are_reaped(tmp_path):
    owner, (engine, reaper, folder), segment = _owner(tmp_path, "kill")
    assert _running(int(engine)) and _running(int(reaper)) and Path(folder).is_dir()
    owner.kill()  # the kernel's OOM killer: the owner runs nothing more
    owner.wait()
    deadline = time.monotonic() + 15
    while (_running(int(engine)) or _running(int(reaper))) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _running(int(engine)) and not _running(int(reaper))
    assert not (Path("/dev/shm") / segment).exists() and not Path(folder).exists()


def test_an_owner_that_ends_its_engine_stops_its_reaper(tmp_path):
    owner, (engine, reaper, folder), segment = _owner(tmp_path, "end")
    try:
        assert not _running(int(engine)) and not _running(int(reaper))  # end() stopped both
        assert not (Path("/dev/shm") / segment).exists()
        assert Path(folder).is_dir()  # still the owner's: only its own close removes it
    finally:
        owner.kill()
        owner.wait()


def test_engine_output_is_passed_on_unless_muted(capfd):
    output = ChildOutput(hold_s=0.2)
    script = (
        "import sys, time; print('engine ready', flush=True); time.sleep(1.5); "
        "print('Traceback (most recent call last): teardown', file=sys.stderr, flush=True)"
    )
    with output.capture():
        child = subprocess.Popen([sys.executable, "-c", script])
    print("the trainer's own line", flush=True)
    time.sleep(1.0)
    output.mute()  # a stop request or a dead engine, noticed before the teardown
    child.wait()
    output.close()
    captured = capfd.readouterr()
    assert "engine ready" in captured.out and "the trainer's own line" in captured.out
    assert "Traceback" not in captured.err


def test_a_sigkilled_owners_sync_folder_is_removed_by_the_next_one(tmp_path):
    # `kill -9` of a trainer leaves its weight-sync folder (in /dev/shm: RAM); the next run's
    # folder creation removes it, and leaves a running trainer's alone.
    make = (
        "import sys, time; from pathlib import Path; "
        "from grpo_train.rollout.processes import owned_dir; "
        f"print(owned_dir({SYNC_DIR_PREFIX!r}, Path(sys.argv[1])), flush=True); time.sleep(60)"
    )
    owners = [
        subprocess.Popen([sys.executable, "-c", make, str(tmp_path)], stdout=subprocess.PIPE)
        for _ in range(2)
    ]
    killed, running = (Path(p.stdout.readline().decode().strip()) for p in owners)  # type: ignore[union-attr]
    (killed / "model.safetensors").write_bytes(b"weights")
    owners[0].kill()
    owners[0].wait()
    (tmp_path / f"{SYNC_DIR_PREFIX}notes").mkdir()  # not one of owned_dir's: never touched
    mine = owned_dir(SYNC_DIR_PREFIX, tmp_path)
    assert not killed.exists() and running.is_dir() and mine.is_dir()
    assert (tmp_path / f"{SYNC_DIR_PREFIX}notes").is_dir()
    owners[1].kill()
    owners[1].wait()
    assert remove_stale_dirs(tmp_path, SYNC_DIR_PREFIX) == [running] and mine.is_dir()


# --------------------------------------------------------------- the real command, signalled


def _args(model: Path, out: Path, engine: str, *extra: str) -> list[str]:
    return [
        "--model", str(model), "--env", "math/add2-v0", "--engine", engine,
        "--num_generations", "4", "--prompts_per_step", "2", "--max_prompt_length", "64",
        "--max_completion_length", "4", "--eval_size", "2", "--eval_every", "2",
        "--save_every", "3", "--keep_last", "20", "--learning_rate", "1e-2", "--progress",
        "false", "--log_every_samples", "0", "--seed", "5", "--num_threads", "1",
        "--vllm_cpu_kv_cache_gib", "0.25", "--output_dir", str(out), *extra,
    ]  # fmt: skip


def _env(**more: str) -> dict[str, str]:
    env = {**quiet_vllm_env(), "OMP_NUM_THREADS": "1"}
    env.pop(PAUSE_AT_ENV, None)
    return {**env, **more}


def _launch(cmd: list[str], ranks: int, env: dict[str, str]) -> subprocess.Popen[str]:
    """Start ``grpo train ...`` (``cmd`` without the program) in a session of its own."""
    if ranks == 1:
        full = [str(BIN / "grpo"), "train", *cmd]
    else:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        # The documented multi-rank command: accelerate's launcher (torch elastic), CPU ranks.
        full = [
            str(BIN / "grpo"), "launch", "--num_processes", str(ranks),
            "--main_process_port", str(port), "train", *cmd,
        ]  # fmt: skip
    return subprocess.Popen(
        full, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip


def _session(sid: int) -> list[str]:
    """The processes still alive in session ``sid``: 'pid command line' each."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[3]) != sid or fields[0] == "Z":
                continue
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, ValueError):
            continue
        found.append(f"{entry.name} {command}")
    return found


def _unmapped_shm(before: set[str]) -> set[str]:
    """Shared-memory segments created since ``before`` that no living process maps (leaked)."""
    new = {p.name for p in Path("/dev/shm").glob("psm_*")} - before
    for _ in range(2):  # a test beside this one may be creating or removing its own segment
        if not new:
            return set()
        for maps in Path("/proc").glob("[0-9]*/maps"):
            with contextlib.suppress(OSError):
                text = maps.read_text()
                new = {name for name in new if name not in text}
        time.sleep(0.5)
        new = {name for name in new if (Path("/dev/shm") / name).exists()}
    return new


@dataclass
class Link:
    """One interrupted launch: the phase it stops at, the signal, the ranks that pause there."""

    phase: str
    signum: int
    ranks_paused: tuple[int, ...] = (0,)
    engine_in_rank: bool = False
    """The engine runs inside each rank's process (vLLM under a launch): no VLLM:: process."""


def _interrupt(
    cmd: list[str], link: Link, ranks: int, tmp: Path, timeout: float = 420
) -> tuple[int, str]:
    """Run ``cmd``, signal its process group at ``link.phase``; return the exit code and output."""
    marker = tmp / f"pause-{time.monotonic_ns()}"
    env = _env(**{PAUSE_AT_ENV: link.phase, PAUSE_FILE_ENV: str(marker)})
    shm_before = {p.name for p in Path("/dev/shm").glob("psm_*")}
    proc = _launch(cmd, ranks, env)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and proc.poll() is None:
            if link.phase == "engine start (vLLM)":
                if any("VLLM::EngineCore" in p for p in _session(proc.pid)):
                    time.sleep(1.0)  # inside the engine's start-up, which takes tens of seconds
                    break
            elif all(Path(f"{marker}.{r}").exists() for r in link.ranks_paused):
                break
            time.sleep(0.05)
        assert proc.poll() is None, f"ended before {link.phase}:\n{proc.communicate()[0][-3000:]}"
        if link.engine_in_rank:
            assert not [p for p in _session(proc.pid) if "VLLM::" in p], _session(proc.pid)
        os.killpg(proc.pid, link.signum)
        output, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    deadline = time.monotonic() + 20
    while _session(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _session(proc.pid), f"left running: {_session(proc.pid)}\n{output[-3000:]}"
    assert not _unmapped_shm(shm_before), f"leaked shared memory: {_unmapped_shm(shm_before)}"
    return proc.returncode, output


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(folder / "model.safetensors")


def _same_weights(a: Path, b: Path) -> bool:
    x, y = _weights(a), _weights(b)
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


def _run_chain(
    model: Path,
    tmp: Path,
    engine: str,
    ranks: int,
    links: list[Link],
    max_steps: int,
    reference_extra: tuple[str, ...] = (),
    extra: tuple[str, ...] = (),
) -> tuple[str, list[str]]:
    """Interrupt one run at each link in turn, resume it, and compare with an uninterrupted run.

    The last link stops in the last step: every link after the first resumes the previous one's
    checkpoint, and each saved checkpoint must hold the uninterrupted run's weights. Returns the
    uninterrupted run's output (run with ``reference_extra`` too) and each link's. ``extra``:
    arguments of every run.
    """
    full, cut = tmp / "full", tmp / "cut"
    every = ("--max_steps", str(max_steps), *extra)
    reference = _launch(
        [*_args(model, full, engine, *every, "--save_every", "1", *reference_extra)], ranks, _env()
    )
    reference_output, _ = reference.communicate(timeout=900)
    assert reference.returncode == 0, reference_output[-3000:]
    cmd = _args(model, cut, engine, *every)
    outputs = []
    for link in links:
        code, output = _interrupt(cmd, link, ranks, tmp)
        outputs.append(output)
        where = f"{link.phase}, {signal.Signals(link.signum).name}, {ranks} rank(s)"
        assert code == 128 + link.signum, f"{where}: exit {code}\n{output[-4000:]}"
        assert "Traceback" not in output, f"{where}:\n{output[-6000:]}"
        assert "death signal" not in output and "closing signal" not in output, output[-3000:]
        # vLLM's notes that mean nothing to act on (console.EXPECTED_NOISE).
        assert "set_num_threads" not in output and "SSM cache" not in output, output[-3000:]
        lines = [m for line in output.splitlines() if (m := RESUME.match(line))]
        assert len(lines) == 1, f"{where}: resume line\n{output[-3000:]}"
        name, step, folder, command = lines[0].groups()
        assert name == signal.Signals(link.signum).name
        assert Path(folder) == latest_checkpoint(cut) == checkpoint_path(cut, int(step))
        expected = checkpoint_path(full, int(step)) / MODEL_DIR if int(step) else model
        assert _same_weights(Path(folder) / MODEL_DIR, expected), where
        argv = shlex.split(command)
        if ranks == 1:
            assert argv[:2] == ["grpo", "train"]
        else:  # the command as launched, ranks and port included
            assert argv[:3] == ["grpo", "launch", "--num_processes"] and argv[3] == str(ranks)
        cmd = argv[argv.index("train") + 1 :]
    assert latest_checkpoint(cut) == checkpoint_path(cut, max_steps)
    rows = [json.loads(line) for line in (cut / "metrics.jsonl").read_text().splitlines()]
    assert sorted({r["step"] for r in rows if r["step"] > 0}) == list(range(1, max_steps + 1))
    return reference_output, outputs


INT, TERM = signal.SIGINT, signal.SIGTERM

#: The vLLM engine in child processes (on CPU the default runs it in the trainer's process):
#: processes of its own, which a group's signal or the kernel's OOM killer reaches on their own.
CHILD_ENGINE = ("--vllm_in_process", "false")

#: Every phase of a step, each with one of the two signals (they alternate).
HF_LINKS = [
    Link("engine start", INT),
    Link("generation@1", TERM),
    Link("scoring@2", INT),
    Link("update@3", TERM),
    Link("weight sync@4", INT),
    Link("checkpoint write@6", TERM),
    Link("evaluation@8", INT),  # the last step's: no step to resume after it
]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_every_phase_one_process_hf(tiny_model_path, tmp_path):
    _run_chain(tiny_model_path, tmp_path, "hf", 1, HF_LINKS, max_steps=8)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_every_phase_two_ranks_hf(tiny_model_path, tmp_path):
    # The phases where the ranks meet in a collective (one process runs every phase above):
    # the sampled groups' gather, the gradient's all-reduce, the checkpoint's barrier, and the
    # evaluation that rank 0 runs while the other waits.
    both = (0, 1)
    links = [
        Link("generation@1", TERM, both),
        Link("update@2", INT, both),
        Link("checkpoint write@3", TERM, both),
        Link("evaluation@4", INT, (0,)),
    ]
    _run_chain(tiny_model_path, tmp_path, "hf", 2, links, max_steps=4)


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.timeout(1500)
def test_vllm_engine_start_generation_and_weight_sync(tiny_model_path, tmp_path):
    # The CPU default: the engine runs in the trainer's process, so the group's signal reaches
    # no engine process and, as with the HF engine, the phase in progress finishes: the engine's
    # start (step 0 saved), the generation (the step finishes and is saved), the weight sync.
    links = [
        Link("engine start", TERM, engine_in_rank=True),
        Link("generation@1", INT, engine_in_rank=True),
        Link("weight sync@2", TERM, engine_in_rank=True),
    ]
    # The uninterrupted run at debug shows vLLM's reload warnings; every interrupted one, at the
    # default level, must not (test_console's check, here without an engine start of its own).
    debug = ("--log_level", "debug")
    reference_output, outputs = _run_chain(
        tiny_model_path, tmp_path, "vllm", 1, links, max_steps=2, reference_extra=debug
    )
    assert "Failed to load weights" in reference_output
    for output in outputs[1:]:  # each ran a step (and its weight sync) and printed its summary
        check_quiet_vllm_run(output)


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.timeout(1500)
def test_child_process_vllm_engine_start_generation_and_weight_sync(tiny_model_path, tmp_path):
    # vllm_in_process: false: the engine's processes die with the signal: during its start
    # (nothing trained: step 0 saved), during generation (the step is undone: the previous one
    # is saved) and during the weight sync (the update stands: the step is saved).
    links = [
        Link("engine start (vLLM)", TERM),
        Link("generation@2", INT),
        Link("weight sync@2", TERM),
    ]
    _run_chain(tiny_model_path, tmp_path, "vllm", 1, links, max_steps=2, extra=CHILD_ENGINE)


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.timeout(900)
def test_vllm_on_two_ranks_generation(tiny_model_path, tmp_path):
    # Under a launch each rank's vLLM joins the job (external_launcher), which runs the engine
    # inside the rank's process: the group's signal reaches no engine process, so, as with the
    # HF engine, the step in progress finishes and is saved.
    links = [Link("generation@2", INT, (0, 1), engine_in_rank=True)]
    _run_chain(tiny_model_path, tmp_path, "vllm", 2, links, max_steps=2)


# ------------------------------------------------------------------------------- grpo eval

EVAL_STOPPED = re.compile(
    r"^grpo eval: interrupted by (SIG\w+): (\d+) of (\d+) missing completions generated and "
    r"saved; every finished sample is in (\S+); resume with `(.+)`$"
)


def _eval_cmd(model: Path, out: Path, engine: str) -> list[str]:
    return [
        "--model", str(model), "--suite", "math/add2-v0", "--limit", "6", "--batch_size", "1",
        "--max_tokens", "4", "--engine", engine, "--out", str(out), "--no_progress",
    ]  # fmt: skip


def _eval(cmd: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(BIN / "grpo"), "eval", *cmd], env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip


def _samples(out: Path) -> dict[str, str]:
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    return {f"{r['env_id']}/{r['sample_id']}/{r['gen_index']}": r["completion"] for r in rows}


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    ("engine", "signum"),
    [("hf", signal.SIGTERM), pytest.param("vllm", signal.SIGINT, marks=pytest.mark.vllm)],
)
def test_grpo_eval_keeps_every_finished_sample(tiny_model_path, tmp_path, engine, signum):
    full, cut = tmp_path / "full", tmp_path / "cut"
    if engine == "hf":  # greedy, one prompt per batch: the uninterrupted run is the reference
        reference = _eval(_eval_cmd(tiny_model_path, full, engine), _env())
        out, _ = reference.communicate(timeout=600)
        assert reference.returncode == 0, out[-3000:]
    marker = tmp_path / "pause"
    env = _env(**{PAUSE_AT_ENV: "eval generation@3", PAUSE_FILE_ENV: str(marker)})
    shm_before = {p.name for p in Path("/dev/shm").glob("psm_*")}
    proc = _eval(_eval_cmd(tiny_model_path, cut, engine), env)
    try:
        deadline = time.monotonic() + 600
        while not Path(f"{marker}.0").exists() and proc.poll() is None:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        os.killpg(proc.pid, signum)
        output, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 128 + signum, output[-3000:]
    assert "Traceback" not in output, output[-6000:]
    lines = [m for line in output.splitlines() if (m := EVAL_STOPPED.match(line))]
    assert len(lines) == 1, output[-3000:]
    name, done, total, kept, command = lines[0].groups()
    # Signalled before batch 3: both engines run in the eval's process and finish it.
    finished = 3
    assert name == signal.Signals(signum).name and (int(done), int(total)) == (finished, 6)
    assert len(_samples(cut)) == finished and Path(kept) == cut / "samples.jsonl"
    time.sleep(1)
    assert not _session(proc.pid) and not _unmapped_shm(shm_before)
    before = _samples(cut)
    argv = shlex.split(command)
    assert argv[:2] == ["grpo", "eval"]
    if engine != "hf":  # resuming reads samples.jsonl whatever the engine: run once, with hf
        return
    again = _eval(argv[2:], _env())
    out, _ = again.communicate(timeout=600)
    assert again.returncode == 0, out[-3000:]
    assert f"{6 - finished} generated, {finished} resumed" in out
    after = _samples(cut)
    assert len(after) == 6 and all(after[k] == v for k, v in before.items())
    if engine == "hf":
        assert after == _samples(full)


# ------------------------------------------------------ an engine that dies for another reason


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.timeout(600)
def test_a_killed_trainer_takes_its_engine_processes_and_their_shared_memory_with_it(
    tiny_model_path, tmp_path
):
    # The OOM killer's SIGKILL to the trainer alone: nothing of the trainer runs any more, and
    # vLLM's engine core would wait for its requests forever, holding its RAM and segments.
    marker = tmp_path / "pause"
    env = _env(**{PAUSE_AT_ENV: "generation@1", PAUSE_FILE_ENV: str(marker)})
    shm_before = {p.name for p in Path("/dev/shm").glob("psm_*")}
    proc = _launch(_args(tiny_model_path, tmp_path / "run", "vllm", *CHILD_ENGINE, "--max_steps",
                         "2"), 1, env)  # fmt: skip
    try:
        while not Path(f"{marker}.0").exists():
            assert proc.poll() is None, proc.communicate()[0][-3000:]
            time.sleep(0.05)
        engine = [p for p in _session(proc.pid) if "VLLM::" in p]
        assert len(engine) == 2, engine  # the engine core and its worker
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)  # not communicate(): a left engine would hold the pipe open
        deadline = time.monotonic() + 30
        while _session(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _session(proc.pid), _session(proc.pid)
        assert not _unmapped_shm(shm_before), _unmapped_shm(shm_before)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.timeout(900)
@pytest.mark.parametrize("victim", ["VLLM::EngineCore", "VLLM::Worker"])
def test_a_killed_engine_process_is_one_line_naming_it_and_the_checkpoint(
    tiny_model_path, tmp_path, victim
):
    # As the kernel's OOM killer does (SIGKILL, to the engine core or its worker alone).
    out = tmp_path / "run"
    marker = tmp_path / "pause"
    env = _env(**{PAUSE_AT_ENV: "generation@2", PAUSE_FILE_ENV: str(marker)})
    shm_before = {p.name for p in Path("/dev/shm").glob("psm_*")}
    proc = _launch(_args(tiny_model_path, out, "vllm", *CHILD_ENGINE, "--max_steps", "4"), 1, env)
    try:
        while not Path(f"{marker}.0").exists():
            assert proc.poll() is None, proc.communicate()[0][-3000:]
            time.sleep(0.05)
        pid = next(int(p.split()[0]) for p in _session(proc.pid) if victim in p)
        os.kill(pid, signal.SIGKILL)
        Path(f"{marker}.0").unlink()  # the run goes on into the dead engine
        output, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 1, output[-3000:]
    assert "Traceback" not in output, output[-6000:]
    lines = [line for line in output.splitlines() if line.startswith("grpo train:")][1:]
    assert len(lines) == 1, output[-3000:]
    line = lines[0]
    assert line.startswith("grpo train: aborted: the rollout engine died during generate")
    assert f"{victim} (pid {pid})" in line or "VLLM::EngineCore" in line
    if victim == "VLLM::EngineCore":
        assert "killed by SIGKILL" in line and "out-of-memory" in line
    ckpt = checkpoint_path(out, 1)  # the last completed step, saved on the way out
    assert f"last checkpoint {ckpt}; resume with `grpo train --config" in line
    assert latest_checkpoint(out) == ckpt
    time.sleep(1)
    assert not _session(proc.pid), _session(proc.pid)
    assert not _unmapped_shm(shm_before)
