"""What every logged completion says, in training's and evaluation's ``samples.jsonl`` alike.

The trainer logs ``run_log.TrainingSample`` rows (the step and advantage of a sampled
completion); ``grpo eval`` writes ``eval.records.SampleRecord`` rows (a resumable result keyed by
generation index, with extraction and pass@k fields). Both are this record plus their own fields,
so tools reading either file find the same names for the same facts.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class CompletionRecord:
    """One scored completion: where its prompt came from, the texts, and the judgement."""

    env_id: str
    sample_id: str
    prompt: str
    """The prompt text (evaluation: as the model saw it, chat template applied; training: the
    last message)."""
    completion: str
    reward: float
    outcome: str
    """A ``grpo_envs.types.Outcome`` value."""
