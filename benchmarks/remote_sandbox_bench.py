"""Scoring throughput, local sandbox vs remote sandbox service, side by side in one run.

Run: ``.venv/bin/python benchmarks/remote_sandbox_bench.py [--workers N] [--rounds N]``

Two workloads, each scored by its code environment's ``score_batch`` (a fresh environment per
round, as ``code_env_bench.py`` does) with reference solutions that must all pass:

* ``humaneval``: the 164 canonical HumanEval solutions through ``code/humaneval-v0``
  (function-call tests, judged outside the candidate's process);
* ``cpp``: the reference solutions of the shipped C++ stdin/stdout set
  (``grpo_envs/data/cpp_stdio.jsonl``) through ``code/stdio-v0``.

Each is scored three ways (HumanEval: the first two; a plain SandboxFusion cannot judge
function-call tests):

* ``local``: the process's shared ``Sandbox`` with ``--workers`` workers (the default backend);
* ``grpo``: ``RemoteSandbox`` protocol ``grpo`` over loopback to a ``grpo sandbox serve --port 0
  --workers N`` subprocess: one ``POST /v1/run_tests`` per completion (its whole test set; C++:
  compiled once per job, each test a fresh run), the verdict decided by the service;
* ``sandbox_fusion``: the same service through SandboxFusion's ``/run_code``: one request per
  test, each compiling the program again, the output judged in this process.

The remote side runs its sandbox with the same ``--workers`` as the local one; the client keeps
``--in-flight`` requests open (default twice the workers, so that a worker finishing a job finds
the next one queued instead of waiting for a round trip). Everything is warmed up first (slot
servers, the C++ precompiled header, connections); then ``--rounds`` rounds alternate the order of
the modes (local first, then last) and the table gives medians, problems/s, the ratio to local
per round, and the CPU per problem split into this process (the client), the service's own
process (HTTP, JSON) and the sandboxes (slot servers, compilers, programs). Every solution must
pass in every mode: any that does not is a FAIL line (and exit status 1), not a number.

``--service-max-request-s`` sets the service's ceiling on one request's worst case
(``sandbox.service.worst_case_s``; default: the service's own, an hour).

Beside ours it prints SandboxFusion's throughput as the ScaleBox technical report measured it, per
core: other hardware, other problems, other test counts; not a like-for-like comparison. On this
machine client, service and sandboxes share the same cores, so remote modes pay the HTTP work
out of the sandbox's CPU; on separate machines that work would not compete with the runs.

    .venv/bin/python benchmarks/remote_sandbox_bench.py
    .venv/bin/python benchmarks/remote_sandbox_bench.py --humaneval 20 --cpp 4 --rounds 1  # quick
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import select
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from grpo_envs.code.backend import use_remote_sandbox  # noqa: E402
from grpo_envs.code.scoring import CodeEnvironment, close_shared_sandboxes  # noqa: E402
from grpo_envs.data import CPP_STDIO  # noqa: E402
from grpo_envs.envs.humaneval import HumanEvalEnv  # noqa: E402
from grpo_envs.envs.stdio import StdioEnv  # noqa: E402
from grpo_envs.types import Sample  # noqa: E402
from sandbox.remote import Protocol, RemoteSettings  # noqa: E402

LOCAL = "local"
#: The modes in their order within a round (reversed every other round).
MODES = (LOCAL, "grpo", "sandbox_fusion")
#: Seconds to wait for ``grpo sandbox serve`` to print its address.
SERVICE_START_S = 120.0
_CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Published:
    """A throughput someone else measured, with what it ran on (never our hardware)."""

    what: str
    problems_per_s: float
    cores: int

    @property
    def per_core(self) -> float:
        return self.problems_per_s / self.cores


#: SandboxFusion as the ScaleBox technical report measured it. Nodes of 128 cores (the size the
#: report gives for the per-test run); other problems and test counts than ours.
SANDBOX_FUSION_PUBLISHED = (
    Published("SandboxFusion /run_code, one request per test", 8.5, 128),
    Published("SandboxFusion batch endpoint, one node", 25.0, 128),
    Published("SandboxFusion batch endpoint, three nodes", 45.0, 3 * 128),
)


@dataclass(frozen=True)
class Workload:
    """Reference completions of one problem set, and how to make its environment."""

    name: str
    make_env: Callable[[int], CodeEnvironment]
    samples: tuple[Sample, ...]
    completions: tuple[str, ...]
    modes: tuple[str, ...]


@dataclass(frozen=True)
class CpuSeconds:
    """CPU seconds of this process tree, split by role."""

    client: float = 0.0
    """This process: the environment, the HTTP client, the local sandbox's dispatch."""
    service: float = 0.0
    """The service's own process: HTTP and JSON (not the sandbox runs under it)."""
    sandbox: float = 0.0
    """Every other process: slot servers, compilers, the programs (reaped ones included)."""

    def minus(self, earlier: CpuSeconds) -> CpuSeconds:
        return CpuSeconds(
            self.client - earlier.client,
            self.service - earlier.service,
            self.sandbox - earlier.sandbox,
        )


@dataclass(frozen=True)
class Measure:
    """One mode's pass over one workload in one round."""

    workload: str
    mode: str
    round: int
    wall_s: float
    cpu: CpuSeconds
    failures: tuple[str, ...]
    load: float
    """The 1-minute load average when it ended."""


@dataclass(frozen=True)
class ModeSummary:
    """Medians of one mode on one workload over the rounds."""

    workload: str
    mode: str
    problems: int
    wall_s: float
    problems_per_s: float
    ratio_to_local: float | None
    round_ratios: tuple[float, ...]
    cpu_ms_per_problem: CpuSeconds
    failures: int
    rounds_wall_s: tuple[float, ...] = field(default_factory=tuple)


# -- CPU accounting -------------------------------------------------------------------------------


def _stat(pid: int) -> tuple[int, float, float] | None:
    """(parent pid, own CPU s, reaped children's CPU s) of a live process, or None."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    own = (int(fields[11]) + int(fields[12])) / _CLK_TCK
    reaped = (int(fields[13]) + int(fields[14])) / _CLK_TCK
    return int(fields[1]), own, reaped


def tree_cpu(service_pid: int | None) -> CpuSeconds:
    """CPU seconds of this process and every live descendant, split by role (``CpuSeconds``)."""
    stats = {int(e): s for e in os.listdir("/proc") if e.isdigit() and (s := _stat(int(e)))}
    me = os.getpid()
    tree, frontier = {me}, {me}
    while frontier:
        frontier = {pid for pid, s in stats.items() if s[0] in frontier} - tree
        tree |= frontier
    client = service = sandbox = 0.0
    for pid in tree:
        _, own, reaped = stats[pid]
        if pid == me:
            client += own
        elif pid == service_pid:
            service += own
        else:
            sandbox += own
        sandbox += reaped  # what a process reaped ran programs or compilers, never HTTP
    return CpuSeconds(client, service, sandbox)


# -- the service ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Service:
    """A running ``grpo sandbox serve`` subprocess."""

    url: str
    pid: int


@contextlib.contextmanager
def serving(workers: int, max_request_s: float | None = None) -> Iterator[Service]:
    """Start ``grpo sandbox serve --port 0 --workers N`` on loopback; stop it on exit.

    ``max_request_s``: its ``--max-request-s`` (None: the service's default).
    """
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("GRPO_SANDBOX_TOKEN", None)  # loopback: no token
    command = [sys.executable, "-m", "grpo_train.cli", "sandbox", "serve"]
    command += ["--port", "0", "--workers", str(workers)]
    if max_request_s:
        command += ["--max-request-s", str(max_request_s)]
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=ROOT,
    )
    assert proc.stdout is not None
    try:
        deadline = time.monotonic() + SERVICE_START_S
        seen: list[str] = []
        found = None
        while found is None and time.monotonic() < deadline and proc.poll() is None:
            ready, _, _ = select.select([proc.stdout], [], [], 1.0)
            if ready:
                line = proc.stdout.readline()
                seen.append(line)
                found = re.search(r"listening on (http://\S+) ", line)
        if found is None:
            raise SystemExit(f"grpo sandbox serve did not start: {''.join(seen)[-2000:]}")
        yield Service(found.group(1), proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stdout.close()


# -- workloads ------------------------------------------------------------------------------------


def humaneval_workload(limit: int) -> Workload:
    """The first ``limit`` HumanEval problems and their canonical solutions."""
    env = HumanEvalEnv()
    samples = tuple(env.sample(p) for p in env.problems[:limit])
    completions = tuple(env.reference_completion(s) or "" for s in samples)
    return Workload(
        "humaneval",
        lambda workers: HumanEvalEnv(workers=workers),
        samples,
        completions,
        (LOCAL, "grpo"),
    )


def cpp_workload(limit: int) -> Workload:
    """The first ``limit`` problems of the C++ stdin/stdout set and their reference solutions."""

    def make(workers: int) -> CodeEnvironment:
        return StdioEnv(data_files=str(CPP_STDIO), workers=workers)

    env = make(1)
    samples = tuple(Sample.from_row(row) for row in env.dataset("test"))[:limit]
    completions = tuple(env.reference_completion(s) or "" for s in samples)
    return Workload("cpp", make, samples, completions, MODES)


def settings_for(mode: str, service: Service, in_flight: int) -> RemoteSettings | None:
    """The backend of ``mode``: None (local) or the service through ``mode``'s protocol."""
    if mode == LOCAL:
        return None
    protocol: Protocol = "grpo" if mode == "grpo" else "sandbox_fusion"
    return RemoteSettings(urls=(service.url,), protocol=protocol, max_in_flight=in_flight)


def score(
    workload: Workload,
    mode: str,
    service: Service,
    workers: int,
    in_flight: int,
    round_index: int,
    count: int | None = None,
) -> Measure:
    """Score ``workload``'s completions (the first ``count``) in ``mode``; time and check them."""
    samples = workload.samples[:count]
    completions = workload.completions[:count]
    use_remote_sandbox(settings_for(mode, service, in_flight))
    try:
        env = workload.make_env(workers)
        cpu_before = tree_cpu(service.pid)
        start = time.perf_counter()
        scores = env.score_batch(list(completions), list(samples))
        wall = time.perf_counter() - start
        cpu = tree_cpu(service.pid).minus(cpu_before)
    finally:
        use_remote_sandbox(None)
    failures = tuple(
        f"{sample.id}: {s.outcome} {dict(s.details)}"[:400]
        for sample, s in zip(samples, scores)
        if not s.correct
    )
    return Measure(workload.name, mode, round_index, wall, cpu, failures, os.getloadavg()[0])


def summarize(workload: Workload, measures: Sequence[Measure]) -> list[ModeSummary]:
    """Medians per mode; the ratio to local is local's wall time over the mode's, per round."""
    by_mode = {m: [x for x in measures if x.mode == m] for m in workload.modes}
    local_walls = {x.round: x.wall_s for x in by_mode[LOCAL]}
    n = len(workload.samples)
    out = []
    for mode, runs in by_mode.items():
        walls = [x.wall_s for x in runs]
        wall = statistics.median(walls)
        ratios = tuple(local_walls[x.round] / x.wall_s for x in runs)
        cpu = CpuSeconds(
            *(
                statistics.median(getattr(x.cpu, role) for x in runs) * 1000 / n
                for role in ("client", "service", "sandbox")
            )
        )
        out.append(
            ModeSummary(
                workload=workload.name,
                mode=mode,
                problems=n,
                wall_s=wall,
                problems_per_s=n / wall,
                ratio_to_local=None if mode == LOCAL else statistics.median(ratios),
                round_ratios=() if mode == LOCAL else ratios,
                cpu_ms_per_problem=cpu,
                failures=sum(len(x.failures) for x in runs),
                rounds_wall_s=tuple(walls),
            )
        )
    return out


def table(summaries: Sequence[ModeSummary], cores: int) -> list[str]:
    """Our results as a markdown table."""
    lines = [
        "| workload | mode | problems | median s | problems/s | per core | vs local (rounds) "
        "| CPU ms/problem: client / service / sandbox | failures |",
        "|---|---|---:|---:|---:|---:|---|---|---:|",
    ]
    for s in summaries:
        if s.ratio_to_local is None:
            ratio = "1.00x"
        else:
            rounds = ", ".join(f"{r:.2f}" for r in s.round_ratios)
            ratio = f"{s.ratio_to_local:.2f}x ({rounds})"
        c = s.cpu_ms_per_problem
        lines.append(
            f"| {s.workload} | {s.mode} | {s.problems} | {s.wall_s:.2f} | {s.problems_per_s:.1f} "
            f"| {s.problems_per_s / cores:.2f} | {ratio} "
            f"| {c.client:.1f} / {c.service:.1f} / {c.sandbox:.1f} | {s.failures} |"
        )
    return lines


def published_table(summaries: Sequence[ModeSummary], cores: int) -> list[str]:
    """SandboxFusion's published numbers per core beside ours (not like for like)."""
    lines = [
        "| system | problems/s | cores | problems/s per core |",
        "|---|---:|---:|---:|",
    ]
    for p in SANDBOX_FUSION_PUBLISHED:
        lines.append(f"| {p.what} | {p.problems_per_s:g} | {p.cores} | {p.per_core:.3f} |")
    for s in summaries:
        lines.append(
            f"| ours, {s.workload}, {s.mode} | {s.problems_per_s:.1f} | {cores} "
            f"| {s.problems_per_s / cores:.3f} |"
        )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """Measure, print the tables (and FAIL lines), write the JSON; 0 when every solution passed."""
    args = _parse_args(argv)
    workers, in_flight = args.workers, args.in_flight or 2 * args.workers
    cores = min(workers, os.cpu_count() or 1)
    workloads = [
        w
        for w in (
            humaneval_workload(args.humaneval) if args.humaneval else None,
            cpp_workload(args.cpp) if args.cpp else None,
        )
        if w is not None
    ]
    load_before = os.getloadavg()
    measures: list[Measure] = []
    with serving(workers, args.service_max_request_s or None) as service:
        try:
            for workload in workloads:  # warm-up: slots, the precompiled header, connections
                for mode in workload.modes:
                    warm = score(workload, mode, service, workers, in_flight, -1, 2 * workers)
                    measures += [warm] if warm.failures else []
            for r in range(args.rounds):
                for workload in workloads:
                    order = workload.modes if r % 2 == 0 else workload.modes[::-1]
                    for mode in order:
                        measures.append(score(workload, mode, service, workers, in_flight, r))
        finally:
            close_shared_sandboxes()
    load_after = os.getloadavg()
    timed = [m for m in measures if m.round >= 0]
    summaries = [
        s for w in workloads for s in summarize(w, [m for m in timed if m.workload == w.name])
    ]
    loads = [load_before[0], *(m.load for m in timed), load_after[0]]
    print(
        f"{workers} sandbox workers each side, {in_flight} requests in flight, {args.rounds} "
        f"rounds (order alternating), {os.cpu_count()} CPUs; load average "
        f"{min(loads):.1f}-{max(loads):.1f} "
        f"({load_before[0]:.1f} before, {load_after[0]:.1f} after)"
    )
    print("\n".join(table(summaries, cores)))
    print(
        "\nSandboxFusion as published (ScaleBox technical report): other hardware, other problem "
        "sets and test counts; NOT a like-for-like comparison. Per core: problems/s over the "
        f"cores used (ours: {cores}; theirs assumes 128-core nodes)."
    )
    print("\n".join(published_table(summaries, cores)))
    failures = [m for m in measures if m.failures]
    for m in failures:
        when = "warm-up" if m.round < 0 else f"round {m.round}"
        for line in m.failures:
            print(f"FAIL {m.workload} {m.mode} {when}: {line}")
    grpo_ratios = [s.ratio_to_local for s in summaries if s.mode == "grpo" and s.ratio_to_local]
    if grpo_ratios:
        worst = min(grpo_ratios)
        print(f"protocol grpo vs local: {worst:.3f}x at worst (target >= 0.8x: "
              f"{'met' if worst >= 0.8 else 'not met'})")  # fmt: skip
    if args.json:
        record = {
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "args": vars(args) | {"json": str(args.json), "in_flight": in_flight},
            "cpus": os.cpu_count(),
            "load_before": load_before,
            "load_after": load_after,
            "load_range": [min(loads), max(loads)],
            "summaries": [asdict(s) for s in summaries],
            "measures": [asdict(m) for m in timed],
            "failures": [asdict(m) for m in failures],
            "published": [asdict(p) | {"per_core": p.per_core} for p in SANDBOX_FUSION_PUBLISHED],
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=1) + "\n")
    return 1 if failures else 0


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--workers", type=int, default=2, help="sandbox workers, each side")
    parser.add_argument(
        "--in-flight", type=int, default=0, help="client requests at once (0: twice --workers)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (medians)")
    parser.add_argument("--humaneval", type=int, default=164, help="HumanEval problems (0: none)")
    parser.add_argument("--cpp", type=int, default=22, help="C++ problems (0: none)")
    parser.add_argument(
        "--service-max-request-s",
        type=float,
        default=0.0,
        help="the service's --max-request-s (0: its default)",
    )
    parser.add_argument("--json", type=Path, help="also write the run here")
    return parser.parse_args(argv)


if __name__ == "__main__":
    raise SystemExit(main())
