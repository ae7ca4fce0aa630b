"""Evaluation: benchmark suites, pass@k, resumable runs, run comparison.

The command line is ``grpo eval`` (see ``grpo_train.eval_cli``). A trainer evaluates with the
engine it already has running, so no model is loaded twice::

    from grpo_train.eval import GREEDY, evaluate

    summary = evaluate(engine, tokenizer, envs, split="test", limit=64, sampling=GREEDY,
                       progress=False)
    logger.log(step, summary.metrics("eval"))   # eval/accuracy, eval/<env>/pass@1, ...

Pieces: ``passk`` (the unbiased estimator), ``metrics`` (avg@k with its standard errors, maj@k,
macro averages), ``protocols`` (named presets such as ``r1``, reasoning removal, the run record
that makes two runs comparable), ``suites`` (named sets of env ids, the benchmark suites among
them), ``runner`` (generate -> score -> record), ``records`` (the resumable JSONL), ``report``
(per-task results and the markdown table), ``compare`` (deltas with confidence intervals and a bar
chart), ``training_suites`` (benchmark suites evaluated during training).
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
