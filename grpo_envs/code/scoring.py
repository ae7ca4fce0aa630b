"""Shared scoring machinery of the code environments: tasks, jobs, verdicts, rewards.

Every code environment turns a sample into a ``CodeTask`` (trusted tests, trusted setup code, an
optional reference solution) and a completion into a program; ``CodeEnvironment`` runs the
programs through the sandbox's trusted-verdict path (``sandbox.Sandbox.run_tests_many``: the
parent process, not the untrusted program, decides pass/fail) and maps each ``TestReport`` to a
``Score``.

Per-test time limits follow EvalPlus: ``max(4 s, 4 x the reference solution's runtime)``
(EvalPlus, ``evalplus/evaluate.py``, ``min_time_limit`` and ``gt_time_limit_factor``). The
reference runs lazily: completions first run under the 4 s floor, and only when one of them times
out is its task's reference measured (once, cached) and, if that raises the limit, the item run
again. Since a larger limit only changes timeout verdicts, this gives the verdicts of measuring
every reference up front, without paying for it on tasks where nothing times out.

Why one module over 500 lines: tasks, jobs, verdicts and rewards are one contract between the
code environments and the sandbox; the reward a completion gets is decided in this file only.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import logging
import os
import threading
import time
import types
import weakref
from abc import abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Self

from grpo_envs.base import SingleTurnEnv
from grpo_envs.code.backend import remote_sandbox_settings
from grpo_envs.code.extract import ExtractedCode
from grpo_envs.executor import fan_out
from grpo_envs.rubric import Judgement, RewardComponent, Rubric, ScoringContext
from grpo_envs.types import Component, Outcome, Sample, Scalar, Score

if TYPE_CHECKING:  # the sandbox is imported lazily: loading datasets must not start it
    from sandbox import CallTest, IOTest, Sandbox, TestJob, TestReport
    from sandbox.remote import RemoteSandbox, RemoteSettings

log = logging.getLogger(__name__)

#: Characters of a failing test's detail kept in ``Score.details``.
DETAIL_CHARS = 300
#: Jobs are not started with less time than this left in the batch budget (start-up alone
#: takes a good part of it); they score ``timeout`` instead.
MIN_JOB_S = 0.5
#: Tasks kept built (per environment) so that repeated samples are not parsed again.
TASK_CACHE_SIZE = 4096


class RewardMode(StrEnum):
    """How test results become a reward."""

    BINARY = "binary"  # 1.0 if every test passes, else 0.0 (the HumanEval/pass@k convention)
    FRACTION = "fraction"  # the fraction of tests passed (partial credit)


@dataclass(frozen=True)
class CodeConfig:
    """Scoring options shared by the code environments (each may be overridden in ``make``)."""

    reward: RewardMode = RewardMode.BINARY
    """``binary`` (all tests pass) or ``fraction`` (share of tests passed)."""
    min_test_timeout_s: float = 4.0
    """Floor of the per-test time limit (EvalPlus: 4 s)."""
    reference_time_factor: float = 4.0
    """Per-test limit = max(floor, factor x reference runtime) (EvalPlus: 4)."""
    default_test_timeout_s: float = 4.0
    """Per-test limit for tasks without a (working) reference solution."""
    calibrate: bool = True
    """Derive limits from the reference solution (run once, when a completion first times out);
    False: ``default_test_timeout_s`` for every task."""
    max_job_s: float = 60.0
    """Wall-clock cap on one completion's whole run, all its tests together."""
    memory_mb: int = 1024
    """Memory limit of the untrusted program."""
    batch_timeout_s: float = 600.0
    """Bound on one ``score_batch`` call; items not started in time score ``timeout``."""
    workers: int | None = None
    """Sandbox worker processes (None: one per CPU)."""
    compile_timeout_s: float = 20.0
    """Limit of the compile step of a compiled language (C++, Java, Rust; run once per job)."""

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "reward", RewardMode(self.reward))
        except ValueError:
            raise ValueError(
                f"reward={self.reward!r} is not a reward mode; use one of "
                f"{[m.value for m in RewardMode]}"
            ) from None
        for name in (
            "min_test_timeout_s",
            "default_test_timeout_s",
            "compile_timeout_s",
            "max_job_s",
            "batch_timeout_s",
        ):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0 seconds, got {getattr(self, name)!r}")
        if self.reference_time_factor < 1:
            raise ValueError(
                f"reference_time_factor={self.reference_time_factor} would fail the reference "
                "itself; use >= 1 (EvalPlus uses 4)"
            )
        if self.memory_mb < 64:
            raise ValueError(f"memory_mb={self.memory_mb} is too small for Python; use >= 64")
        if self.workers is not None and self.workers < 1:
            raise ValueError(f"workers must be >= 1 or None (one per CPU), got {self.workers}")

    def with_overrides(self, overrides: Mapping[str, object]) -> CodeConfig:
        """Return a copy with ``overrides`` applied; an unknown name fails, listing valid ones."""
        valid = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(overrides) - valid)
        if unknown:
            raise TypeError(f"unknown code-environment option(s) {unknown}; valid: {sorted(valid)}")
        return dataclasses.replace(self, **overrides)  # type: ignore[arg-type]


@dataclass(frozen=True)
class CodeTask:
    """Everything needed to judge programs for one problem. All of it is trusted dataset content."""

    key: str
    """Stable id (the sample id); keys the reference-time cache."""
    tests: tuple[CallTest, ...] | tuple[IOTest, ...]
    entry_point: str | None = None
    """The function the tests call (function-style tasks); None for stdin/stdout tasks."""
    setup: str = ""
    """Trusted code run in the verdict namespace before the tests (helpers, imports, ``check``)."""
    reference: str | None = None
    """A full program that passes the tests, used to calibrate the time limit."""
    language: str = "python"
    """The program's language (``sandbox.Language``); other than Python: IOTests only."""


_TEST_STATUS_OUTCOME = {
    "passed": Outcome.PASSED,
    "failed": Outcome.FAILED,
    "timeout": Outcome.TIMEOUT,
    "memory": Outcome.MEMORY,
    "runtime_error": Outcome.RUNTIME_ERROR,
    "output_limit": Outcome.RUNTIME_ERROR,  # flooding stdout is the program's fault
    "sandbox_error": Outcome.SANDBOX_ERROR,
    "compile_error": Outcome.COMPILE_ERROR,
}
# How the untrusted program as a whole ended; only statuses that explain a failure are mapped.
_PROGRAM_STATUS_OUTCOME = {
    "compile_error": Outcome.COMPILE_ERROR,
    "timeout": Outcome.TIMEOUT,
    "memory": Outcome.MEMORY,
    "sandbox_error": Outcome.SANDBOX_ERROR,
}


def outcome_of(report: TestReport, n_tests: int) -> Outcome:
    """Decide the outcome of a run: passed only if all ``n_tests`` tests ran and passed.

    A sandbox failure wins (it is not the model's fault, and the trainer may drop such items);
    then a program-wide timeout or memory kill; then the first failing test's status.
    """
    statuses = [str(r.status) for r in report.results]
    if str(report.status) == "sandbox_error" or "sandbox_error" in statuses:
        return Outcome.SANDBOX_ERROR
    if len(statuses) == n_tests and n_tests > 0 and all(s == "passed" for s in statuses):
        return Outcome.PASSED
    program = _PROGRAM_STATUS_OUTCOME.get(str(report.status))
    if program is not None:
        return program
    for status in statuses:
        if status != "passed":
            return _TEST_STATUS_OUTCOME.get(status, Outcome.SANDBOX_ERROR)
    # Fewer results than tests and none failed: the program ended before serving them all.
    return Outcome.RUNTIME_ERROR


def score_report(
    report: TestReport,
    n_tests: int,
    mode: RewardMode,
    method: str,
    timeout_s: float,
) -> Score:
    """Map a sandbox ``TestReport`` to a ``Score`` (reward, outcome, logged details)."""
    outcome = outcome_of(report, n_tests)
    passed = sum(1 for r in report.results if str(r.status) == "passed")
    fraction = passed / n_tests if n_tests else 0.0
    if outcome is Outcome.SANDBOX_ERROR:
        reward = 0.0  # unknown, not the model's fault: no reward, and the outcome says so
    elif mode is RewardMode.BINARY:
        reward = 1.0 if outcome is Outcome.PASSED else 0.0
    else:
        reward = fraction
    details: dict[str, Scalar] = {
        "extraction": method,
        "passed": passed,
        "total": n_tests,
        "program_status": str(report.status),
        "wall_s": round(report.wall_s, 4),
        "test_timeout_s": round(timeout_s, 3),
        "isolation": "+".join(report.isolation),
    }
    failing = next((r for r in report.results if str(r.status) != "passed"), None)
    if failing is not None:
        details["first_failure"] = f"{failing.name}: {failing.status}: {failing.detail}"[
            :DETAIL_CHARS
        ]
    return Score(
        reward=reward,
        outcome=outcome,
        components=(
            Component("tests", reward, 1.0),
            Component("pass_fraction", fraction, 0.0),  # logged metric, no weight
        ),
        details=details,
    )


def tests_component(env: CodeEnvironment) -> RewardComponent:
    """The ``tests`` component of a code environment: its programs run in the sandbox.

    Bounded (the sandbox kills programs at their limits), so ``make`` adds no time-limit wrapper.
    """
    return RewardComponent(
        "tests",
        1.0,
        lambda ctx: env.judge_many([ctx])[0],
        env.judge_many,
        bounded=True,
    )


def _failed(outcome: Outcome, reason: str, **details: Scalar) -> Judgement:
    return Judgement(0.0, outcome, {"reason": reason[:DETAIL_CHARS], **details})


@dataclass(frozen=True)
class Unrun:
    """A job that produced no report: why, and the outcome its item gets."""

    outcome: Outcome
    reason: str


class CodeEnvironment(SingleTurnEnv):
    """Base of the code environments: sample -> ``CodeTask``, completion -> program, sandbox run.

    Scoring is the same as every ``SingleTurnEnv``'s: a ``Rubric`` whose ``tests`` component has a
    batch function (``judge_many``) that runs all the batch's programs at once on the sandbox's
    workers. What a code environment adds: the task of a sample (``task``), the program of a
    completion (``extract``), per-task time limits calibrated on the reference solution, and the
    sandbox. Subclasses implement ``dataset``, ``task`` and ``extract``.

    By default every code environment of a process shares one sandbox per worker count
    (``shared_sandbox``), started on the first score (loading data never starts it) and closed at
    exit or by ``close_shared_sandboxes()``: a mixture of code environments, or ``check_env``'s
    twin, then costs no extra worker pool. Pass ``sandbox=`` to use your own (never closed here).
    """

    def __init__(
        self,
        config: CodeConfig | None = None,
        *,
        sandbox: Sandbox | RemoteSandbox | None = None,
        **overrides: Any,
    ) -> None:
        super().__init__(rubric=Rubric([tests_component(self)]))
        self.config = (config or CodeConfig()).with_overrides(overrides)
        self._sandbox = sandbox
        self._lock = threading.Lock()
        _ENVIRONMENTS.add(self)
        self._local = threading.local()
        self.rubric = Rubric(
            [tests_component(self)]
        )  # this thread's batch deadline (see score_batch)
        self._test_timeouts: dict[str, float] = {}
        self._tasks: dict[tuple[str, str, str], CodeTask] = {}
        #: Keys of tasks whose reference solution did not pass in the sandbox (data to inspect).
        self.reference_failures: dict[str, str] = {}

    # -- what subclasses provide ---------------------------------------------------------------

    @abstractmethod
    def task(self, sample: Sample) -> CodeTask:
        """Build the trusted tests and setup for ``sample`` (ValueError on malformed metadata)."""

    @abstractmethod
    def extract(self, completion: str, task: CodeTask, sample: Sample) -> ExtractedCode | None:
        """Extract the program to run for ``completion``; None when no parsable code is found."""

    # -- scoring -------------------------------------------------------------------------------

    def score_batch(
        self,
        completions: Sequence[str],
        samples: Sequence[Sample | Mapping[str, object]],
        *,
        workers: int | None = None,
        timeout_s: float | None = None,
    ) -> list[Score]:
        """Score many completions (``SingleTurnEnv.score_batch``) within one time budget.

        The whole call is bounded by ``timeout_s`` (default ``config.batch_timeout_s``); items it
        leaves unrun score ``timeout``. ``workers`` is ignored: the sandbox's worker pool
        (``config.workers``) sets the parallelism.
        """
        budget = self.config.batch_timeout_s if timeout_s is None else timeout_s
        self._local.deadline = time.monotonic() + budget
        try:
            return super().score_batch(completions, samples)
        finally:
            self._local.deadline = None

    def judge_many(self, contexts: Sequence[ScoringContext]) -> list[Judgement]:
        """Run the programs of ``contexts`` in the sandbox; one ``Judgement`` each, input order.

        Malformed samples judge ``error``, code that cannot be extracted ``unparsable`` (also when
        the extractor raises: model text never yields ``error``); a GRPO group's repeated
        programs run once.
        """
        deadline = getattr(self._local, "deadline", None)
        if deadline is None:
            deadline = time.monotonic() + self.config.batch_timeout_s
        judged: list[Judgement | None] = [None] * len(contexts)
        pending: list[tuple[int, CodeTask, ExtractedCode]] = []
        for i, ctx in enumerate(contexts):
            try:
                task = self._cached_task(ctx.sample)
            except (ValueError, TypeError, KeyError) as exc:
                judged[i] = _failed(Outcome.ERROR, f"bad sample: {exc}")
                continue
            try:
                program = self.extract(ctx.completion, task, ctx.sample)
            except Exception as exc:  # an extractor bug costs this item, not the batch
                # Logged, but judged from the model's side: the extractor sees only model text,
                # and model text never yields an error outcome (the trainer would drop the item).
                log.exception("extracting code for %s raised", ctx.sample.id)
                judged[i] = _failed(Outcome.UNPARSABLE, f"extraction raised {exc!r}")
                continue
            if program is None:
                what = "Python" if task.language == "python" else f"{task.language} (fenced)"
                judged[i] = _failed(Outcome.UNPARSABLE, f"no parsable {what} code found")
                continue
            pending.append((i, task, program))

        if pending:
            # A GRPO group often repeats a program word for word: each distinct one runs once.
            unique: dict[tuple[CodeTask, str], int] = {}
            for _, task, program in pending:
                unique.setdefault((task, program.code), len(unique))
            jobs = [self._job(task, code) for task, code in unique]
            ran = self._run_bounded(jobs, deadline)
            if self.config.calibrate:
                self._rejudge_timeouts(list(unique), jobs, ran, deadline)
            for i, task, program in pending:
                slot = unique[(task, program.code)]
                job, report = jobs[slot], ran[slot]
                timeout = job.per_test_timeout_s or self.config.default_test_timeout_s
                if isinstance(report, Unrun):
                    judged[i] = _failed(
                        report.outcome, report.reason, extraction=str(program.method)
                    )
                else:
                    score = score_report(
                        report, len(task.tests), self.config.reward, str(program.method), timeout
                    )
                    fraction = score.component("pass_fraction").value
                    judged[i] = Judgement(
                        score.reward, score.outcome, score.details, {"pass_fraction": fraction}
                    )
        return [j if j is not None else _failed(Outcome.ERROR, "not judged") for j in judged]

    def _cached_task(self, sample: Sample) -> CodeTask:
        # Building a task parses test code; the samples of a GRPO group repeat, so keep recent ones.
        key = (sample.id, sample.answer, json.dumps(dict(sample.metadata), sort_keys=True))
        task = self._tasks.get(key)
        if task is None:
            task = self.task(sample)
            with self._lock:  # score_batch may run in several threads
                if len(self._tasks) >= TASK_CACHE_SIZE:
                    self._tasks.pop(next(iter(self._tasks)))  # oldest first (dicts keep order)
                self._tasks[key] = task
        return task

    def reference_completion(self, sample: Sample) -> str | None:
        """Return the reference solution as a fenced block (a completion that must pass)."""
        return f"```python\n{sample.answer}\n```" if sample.answer else None

    def calibrate(self, samples: Sequence[Sample | Mapping[str, object]]) -> dict[str, float]:
        """Measure the reference solutions of ``samples`` now (once each; scoring does it lazily).

        Returns key -> per-test limit, e.g. to save and reuse with ``set_test_timeouts``.
        """
        tasks = [self.task(Sample.from_row(s)) for s in samples]
        self._calibrate(tasks, time.monotonic() + self.config.batch_timeout_s)
        return {t.key: self.test_timeout(t) for t in tasks}

    @property
    def calibrated(self) -> Mapping[str, float]:
        """The per-test limits measured (or set) so far: task key -> seconds (read-only view)."""
        return types.MappingProxyType(self._test_timeouts)

    def set_test_timeouts(self, limits: Mapping[str, float]) -> None:
        """Reuse per-test limits (key -> seconds) from an earlier ``calibrate``, e.g. saved JSON."""
        for key, seconds in limits.items():
            if not seconds > 0:
                raise ValueError(f"test time limit for {key!r} must be > 0 s, got {seconds!r}")
            self._test_timeouts[str(key)] = float(seconds)

    def test_timeout(self, task: CodeTask) -> float:
        """Return the per-test time limit of ``task``.

        The calibrated limit; else the floor when there is a reference to calibrate against
        should a completion time out; else the default.
        """
        limit = self._test_timeouts.get(task.key)
        if limit is not None:
            return limit
        if task.reference and self.config.calibrate:
            return self.config.min_test_timeout_s
        return self.config.default_test_timeout_s

    # -- sandbox plumbing ----------------------------------------------------------------------

    @property
    def sandbox(self) -> Sandbox | RemoteSandbox:
        """The sandbox: the one given, else the process's shared one (started on first use).

        In a process forked after the given one was made (a dataloader or reward worker), the
        given one belongs to the parent (``sandbox.SandboxForkedError``): the child uses its own
        process's shared sandbox instead, as an unpickled copy does.
        """
        with self._lock:
            given = self._sandbox
        if given is None or getattr(given, "owner_pid", os.getpid()) != os.getpid():
            return shared_sandbox(self.config.workers)
        return given

    def close(self) -> None:
        """Forget the sandbox (a given one stays open; see ``close_shared_sandboxes``)."""
        with self._lock:
            self._sandbox = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, object]:
        # Worker processes (dataloaders, verl's reward pool) get a copy without the live sandbox;
        # they use their own process's shared one.
        state = self.__dict__.copy()
        state["_sandbox"] = None
        del state["_lock"], state["_local"], state["rubric"]  # the rubric holds bound methods
        return state

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        _ENVIRONMENTS.add(self)
        self._local = threading.local()
        self.rubric = Rubric([tests_component(self)])

    def _job(self, task: CodeTask, program: str, per_test_s: float | None = None) -> TestJob:
        from sandbox import Limits, TestJob

        per_test = per_test_s if per_test_s is not None else self.test_timeout(task)
        # Whole-program wall limit: every test at its limit, plus start-up slack, capped.
        total = min(self.config.max_job_s, per_test * max(1, len(task.tests)) + 2.0)
        return TestJob(
            program=program,
            tests=task.tests,
            entry_point=task.entry_point,
            setup=task.setup,
            limits=Limits(timeout_s=total, memory_mb=self.config.memory_mb),
            per_test_timeout_s=per_test,
            # Every test runs, in order, whatever the verdicts before it: a program that is
            # called again only after a pass learns its verdict, and with any channel between
            # runs, a group of copies converges on the expected outputs. The binary reward is
            # computed afterwards. What may stop a job early is only the program's own failure
            # (time, memory, crash), which does not depend on a verdict; partial credit needs
            # every test even then.
            stop_on_first_failure=False,
            stop_on_program_failure=self.config.reward is RewardMode.BINARY,
            language=task.language,
            # Python has no compile step (and the sandbox refuses a compile limit for it).
            compile_timeout_s=None if task.language == "python" else self.config.compile_timeout_s,
        )

    def _run_bounded(self, jobs: Sequence[TestJob], deadline: float) -> list[TestReport | Unrun]:
        """Run ``jobs`` on every sandbox worker at once so that the call ends near ``deadline``.

        ``fan_out``: one thread per sandbox worker hands jobs over one at a time (no chunk
        barriers: a slow job holds one worker, never the others). Each job starts with at most the
        time left as its wall limit, so hanging programs cannot overrun the budget; jobs that start
        with less than ``MIN_JOB_S`` left, or are lost to a sandbox that raised, come back as
        ``Unrun``.
        """
        if not jobs:
            return []
        box = self.sandbox
        workers = getattr(box, "workers", None) or self.config.workers or os.cpu_count() or 1

        def run_one(job: TestJob) -> TestReport | Unrun:
            left = deadline - time.monotonic()
            if left <= MIN_JOB_S:
                return Unrun(Outcome.TIMEOUT, "batch time budget spent before this item ran")
            try:
                got = box.run_tests_many([_cap_job(job, left)])
            except Exception as exc:  # a sandbox bug must cost this item, not the training run
                log.exception("sandbox.run_tests_many raised")
                return Unrun(Outcome.SANDBOX_ERROR, f"sandbox raised {type(exc).__name__}: {exc}")
            if len(got) != 1:
                return Unrun(Outcome.SANDBOX_ERROR, f"sandbox returned {len(got)} reports for 1")
            return got[0]

        return fan_out(run_one, jobs, int(workers))

    def _rejudge_timeouts(
        self,
        keys: list[tuple[CodeTask, str]],
        jobs: list[TestJob],
        ran: list[TestReport | Unrun],
        deadline: float,
    ) -> None:
        """Calibrate the tasks of timed-out jobs; rerun those whose limit went up (in place)."""
        timed_out = [
            slot
            for slot, (task, _) in enumerate(keys)
            if task.reference and task.key not in self._test_timeouts and _timed_out(ran[slot])
        ]
        if not timed_out:
            return
        self._calibrate([keys[slot][0] for slot in timed_out], deadline)
        redo = [
            slot
            for slot in timed_out
            if self.test_timeout(keys[slot][0]) > (jobs[slot].per_test_timeout_s or 0.0)
        ]
        again = self._run_bounded([self._job(*keys[slot]) for slot in redo], deadline)
        for slot, report in zip(redo, again):
            if not isinstance(report, Unrun):  # out of time: keep the first verdict
                jobs[slot], ran[slot] = self._job(*keys[slot]), report

    def _calibrate(self, tasks: Sequence[CodeTask], deadline: float) -> None:
        """Measure the reference solution of each task not measured yet, in one parallel batch."""
        todo: dict[str, CodeTask] = {}
        for task in tasks:
            if task.reference and task.key not in self._test_timeouts and task.key not in todo:
                todo[task.key] = task
        if not todo:
            return
        # The reference runs with generous limits and every test, so its runtime is comparable.
        jobs = [
            dataclasses.replace(
                self._job(t, t.reference or "", per_test_s=self.config.max_job_s),
                stop_on_program_failure=False,
            )
            for t in todo.values()
        ]
        reports = self._run_bounded(jobs, deadline)
        for task, report in zip(todo.values(), reports):
            limit = self.config.default_test_timeout_s
            if isinstance(report, Unrun):
                continue  # not run (time or sandbox trouble): retried next time
            if report.all_passed and report.total == len(task.tests):
                # wall_s covers all the tests (TestReport has no per-test times): an upper bound
                # of any one test's runtime, so the limit errs on the generous side.
                limit = max(
                    self.config.min_test_timeout_s,
                    self.config.reference_time_factor * report.wall_s,
                )
            else:
                failing = next((r for r in report.results if str(r.status) != "passed"), None)
                why = f"{failing.status}: {failing.detail}" if failing else str(report.status)
                self.reference_failures[task.key] = why[:DETAIL_CHARS]
                log.warning("reference solution of %s fails in the sandbox: %s", task.key, why)
            self._test_timeouts[task.key] = limit


_SHARED: dict[tuple[int, int | RemoteSettings | None], Sandbox | RemoteSandbox] = {}
_SHARED_LOCK = threading.Lock()
#: Every code environment of this process (weakly), to renew their locks after a fork.
_ENVIRONMENTS: weakref.WeakSet[CodeEnvironment] = weakref.WeakSet()


def shared_sandbox(workers: int | None = None) -> Sandbox | RemoteSandbox:
    """Return this process's sandbox with ``workers`` workers (started once, closed at exit).

    Keyed by process id too: a forked child must not use its parent's pool (its pipes and threads
    belong to the parent), so it starts its own. With remote services chosen
    (``grpo_envs.code.backend.use_remote_sandbox``), a ``RemoteSandbox`` for them instead, whose
    ``max_in_flight`` replaces ``workers``.
    """
    remote = remote_sandbox_settings()
    key = (os.getpid(), workers if remote is None else remote)
    with _SHARED_LOCK:
        box = _SHARED.get(key)
        if box is None:
            from sandbox import Sandbox
            from sandbox.remote import RemoteSandbox

            if not _SHARED:
                atexit.register(close_shared_sandboxes)
            box = _SHARED[key] = (
                Sandbox(workers=workers) if remote is None else RemoteSandbox(remote)
            )
        return box


def _after_fork_in_child() -> None:
    # A lock another thread held at the fork stays held forever in the child (its owner does
    # not exist there): the code environments of a forked worker would hang on their first score.
    global _SHARED_LOCK
    _SHARED_LOCK = threading.Lock()
    for env in list(_ENVIRONMENTS):
        env._lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def close_shared_sandboxes() -> None:
    """Close the shared sandboxes this process started (the next score starts a new one)."""
    with _SHARED_LOCK:
        mine = [k for k in _SHARED if k[0] == os.getpid()]
        boxes = [_SHARED.pop(k) for k in mine]
    for box in boxes:
        try:
            box.close()
        except Exception:  # at exit, a half-closed pool must not mask the real error
            log.exception("closing a shared sandbox failed")


def _timed_out(report: TestReport | Unrun) -> bool:
    """Whether a run hit a time limit (the whole program's or a test's)."""
    if isinstance(report, Unrun):
        return False
    return str(report.status) == "timeout" or any(
        str(r.status) == "timeout" for r in report.results
    )


def _cap_job(job: TestJob, seconds: float) -> TestJob:
    """``job`` with its wall-clock limits (a compile step's too) cut to at most ``seconds``."""
    limits, per_test, compile_s = job.limits, job.per_test_timeout_s, job.compile_timeout_s
    over = limits is not None and limits.timeout_s > seconds
    if not over and (compile_s is None or compile_s <= seconds):
        return job
    return dataclasses.replace(
        job,
        limits=dataclasses.replace(limits, timeout_s=seconds) if over and limits else limits,
        per_test_timeout_s=min(per_test, seconds) if over and per_test is not None else per_test,
        compile_timeout_s=min(compile_s, seconds) if compile_s is not None else None,
    )
