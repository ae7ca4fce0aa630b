"""Evaluation: benchmark suites, pass@k, resumable runs, run comparison.

The trainer calls ``evaluate(engine, tokenizer, envs, ...)`` with its running engine; the command
line is ``grpo eval`` (see ``grpo_train.eval.cli``).
"""

from grpo_train.eval.passk import mean_pass_at_k, pass_at_k
from grpo_train.eval.records import SampleRecord, SampleStore
from grpo_train.eval.report import SuiteResult, markdown_table
from grpo_train.eval.runner import GREEDY, EvalSummary, EvalTask, evaluate
from grpo_train.eval.suites import BUILTIN_SUITES, Suite, Task, resolve_tasks

__all__ = [
    "BUILTIN_SUITES",
    "GREEDY",
    "EvalSummary",
    "EvalTask",
    "SampleRecord",
    "SampleStore",
    "Suite",
    "SuiteResult",
    "Task",
    "evaluate",
    "markdown_table",
    "mean_pass_at_k",
    "pass_at_k",
    "resolve_tasks",
]
