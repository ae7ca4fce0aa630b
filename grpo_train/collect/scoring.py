"""Scoring a generation call's groups while the rest still generates (``overlap_scoring``).

The rollout engine reports each prompt's group as soon as it is sampled (``rollout.base.
GroupDone``); ``ScoringStage.submit`` hands it to one background thread, which scores the
groups that have arrived, one ``guarded_scores`` call per environment (a code environment's
sandbox runs one call's programs in parallel over its workers), while the engine goes on.
``finish`` waits for the last scores and returns them by prompt index: the scores of scoring
everything after generation, whatever order the groups finished in, since a completion's score
depends on it and its sample alone (``guarded_scores`` scores a failing batch one by one on that
premise). So a step with slow rewards costs about max(generation, scoring) instead of their sum.
With ``background=False`` nothing runs early: ``finish`` scores every group after generation,
one call per environment, as the collector always did.

Failures: ``guarded_scores`` turns a scorer's failure into error scores; anything else raised on
the thread (a bug, a ``KeyboardInterrupt``) is raised again by ``finish`` in the collecting
thread. A stage left early (generation failed, a stop) stops its thread after the call in
progress; the thread is a daemon, so it never keeps the process from exiting.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Sequence
from types import TracebackType

from grpo_envs.base import Environment
from grpo_envs.types import Sample, Score
from grpo_envs.wrappers import guarded_scores
from grpo_train.rollout.base import Completion

#: A reported group: its prompt index and completions.
Finished = tuple[int, list[Completion]]


class ScoringStage:
    """Scores the groups of one generation call as the engine reports them (module doc).

    ``drawn``: each prompt's sample and environment index, by prompt index. Use it as a context
    manager: leaving it stops the thread. ``overlapped_s`` after ``finish``: the scoring seconds
    that ran while generation was still going (hidden from the step's wall time).
    """

    def __init__(
        self,
        envs: Sequence[Environment],
        drawn: Sequence[tuple[Sample, int]],
        background: bool = True,
    ) -> None:
        self.envs, self.drawn, self.background = list(envs), list(drawn), background
        self.overlapped_s = 0.0
        self._reported: dict[int, list[Completion]] = {}
        self._scores: list[list[Score] | None] = [None] * len(drawn)
        self._calls: list[tuple[float, float]] = []  # (start, end) of each scoring call
        self._queue: queue.SimpleQueue[Finished | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._scored_all = threading.Event()
        self._error: BaseException | None = None

    def __enter__(self) -> ScoringStage:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()

    def submit(self, index: int, completions: list[Completion]) -> None:
        """Take prompt ``index``'s finished group (the engines' ``on_done``); score it soon."""
        if not 0 <= index < len(self.drawn):
            raise IndexError(f"prompt {index} reported; this call has {len(self.drawn)}")
        if index in self._reported:
            raise ValueError(f"prompt {index}'s group was reported twice")
        self._reported[index] = completions
        if not self.background:
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="scoring", daemon=True)
            self._thread.start()
        self._queue.put((index, completions))

    def finish(self, generated: Sequence[list[Completion]]) -> list[list[Score]]:
        """Return every group's scores by prompt index, once all are scored.

        ``generated``: the generation call's result; groups the engine did not report are
        scored now. Raises what the scoring raised beyond ``guarded_scores``' error scores.
        """
        ended = time.perf_counter()
        if len(generated) != len(self.drawn):
            raise ValueError(f"{len(generated)} groups generated for {len(self.drawn)} prompts")
        for index, group in enumerate(generated):
            if index not in self._reported:
                self.submit(index, group)
        if not self.background:
            self._score(sorted(self._reported.items()))
        elif self._thread is not None:
            self._scored_all.wait()  # a signal handler still runs (and may raise) meanwhile
        if self._error is not None:
            raise self._error
        self.overlapped_s = sum(max(0.0, min(end, ended) - start) for start, end in self._calls)
        scores = [s for s in self._scores if s is not None]
        assert len(scores) == len(self.drawn), "every reported group is scored"
        return scores

    def close(self) -> None:
        """Stop the thread after its call in progress (nothing is waited for)."""
        if self._thread is not None and not self._scored_all.is_set():
            self._queue.put(None)

    def _run(self) -> None:
        """Score what has arrived, again and again, until every group is (the thread)."""
        try:
            while sum(s is not None for s in self._scores) < len(self.drawn):
                batch = [self._queue.get()]
                while not self._queue.empty():
                    batch.append(self._queue.get())
                if None in batch:  # closed
                    return
                self._score([item for item in batch if item is not None])
        except BaseException as err:  # raised again by ``finish`` in the collecting thread
            self._error = err
        finally:
            self._scored_all.set()

    def _score(self, groups: Sequence[Finished]) -> None:
        """Score ``groups``: one ``guarded_scores`` call per environment, placed by index."""
        start = time.perf_counter()
        for env_index, env in enumerate(self.envs):
            here = [(k, group) for k, group in groups if self.drawn[k][1] == env_index]
            if not here:
                continue
            texts = [c.text for _, group in here for c in group]
            samples = [self.drawn[k][0] for k, group in here for _ in group]
            flat = guarded_scores(env, texts, samples)
            offset = 0
            for k, group in here:
                self._scores[k] = flat[offset : offset + len(group)]
                offset += len(group)
        self._calls.append((start, time.perf_counter()))
