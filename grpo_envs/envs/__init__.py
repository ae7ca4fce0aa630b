"""The built-in environments, registered by id (entry points are strings: nothing is imported).

| id | what |
| --- | --- |
| ``math/gsm8k-v0`` | GSM8K word problems (local folder or hub) |
| ``math/math500-v0`` | MATH-500 (local folder or hub) |
| ``math/aime24-v0``, ``math/aime25-v0``, ``math/amc23-v0`` | AIME 2024 / 2025, AMC 2023 |
| ``science/gpqa-diamond-v0`` | GPQA-Diamond, options shuffled by a fixed seed, letter graded |
| ``code/livecodebench-v0`` | LiveCodeBench code generation (``version_tag``, date window) |
| ``code/humaneval-plus-v0``, ``code/mbpp-plus-v0`` | EvalPlus's HumanEval+ and MBPP+ |
| ``math/arithmetic-v0`` | procedural multi-step arithmetic, ``difficulty`` 1-5, ``task="add2"`` |
| ``math/add2-v0`` | two two-digit numbers to add |
| ``math/countdown-v0`` | reach a target with given numbers, ``difficulty`` 1-5 |
| ``format/think-answer-v0`` | easy arithmetic rewarding the R1 ``<think>``/``<answer>`` format |
| ``rg/<task>-v0`` | any reasoning-gym task (``rg/reasoning-gym-v0`` takes ``task=``) |
| | ``answer='loose'``: a final answer stated in prose counts (as in ``math/arithmetic-v0``) |
| ``code/humaneval-v0``, ``code/mbpp-v0``, ``code/stdio-v0`` | code, scored in the sandbox |
| ``math/dataset-v0``, ``code/dataset-v0`` | your own data file or hub dataset, no code |
| ``code/feedback-v0`` | multi-turn: failing visible tests come back, hidden tests reward |
| ``math/python-tool-v0`` | multi-turn: math with a sandboxed Python tool |
| ``math/feedback-v0`` | multi-turn: a wrong answer is told what was wrong and tries again |
| ``math/add2-feedback-v0`` | the same over two-digit additions (learnable by the default model) |
"""

from __future__ import annotations

from grpo_envs.registration import register, register_family, registry

_BUILTIN: tuple[tuple[str, str, str, dict[str, object]], ...] = (
    (
        "math/gsm8k-v0",
        "grpo_envs.envs.math_datasets:gsm8k_env",
        "GSM8K grade-school word problems ($GRPO_GSM8K_DIR or hub openai/gsm8k)",
        {},
    ),
    (
        "math/math500-v0",
        "grpo_envs.envs.math_datasets:math500_env",
        "MATH-500 competition problems ($GRPO_MATH500_DIR or hub HuggingFaceH4/MATH-500)",
        {},
    ),
    (
        "math/aime24-v0",
        "grpo_envs.envs.benchmarks:aime24_env",
        "AIME 2024, 30 problems ($GRPO_AIME24_DIR or hub HuggingFaceH4/aime_2024)",
        {},
    ),
    (
        "math/aime25-v0",
        "grpo_envs.envs.benchmarks:aime25_env",
        "AIME 2025, 30 problems ($GRPO_AIME25_DIR or hub math-ai/aime25)",
        {},
    ),
    (
        "math/amc23-v0",
        "grpo_envs.envs.benchmarks:amc23_env",
        "AMC 2023, 40 problems ($GRPO_AMC23_DIR or hub math-ai/amc23)",
        {},
    ),
    (
        "science/gpqa-diamond-v0",
        "grpo_envs.envs.gpqa:GPQAEnv",
        "GPQA-Diamond, 198 questions, letter graded ($GRPO_GPQA_DIR or hub Idavidrein/gpqa)",
        {},
    ),
    (
        "code/livecodebench-v0",
        "grpo_envs.envs.code_benchmarks:LiveCodeBenchEnv",
        "LiveCodeBench code generation, version_tag= and start_date=/end_date= (sandbox)",
        {},
    ),
    (
        "code/humaneval-plus-v0",
        "grpo_envs.envs.code_benchmarks:HumanEvalPlusEnv",
        "HumanEval+ with EvalPlus's extra tests ($GRPO_HUMANEVAL_PLUS_DIR or hub)",
        {},
    ),
    (
        "code/mbpp-plus-v0",
        "grpo_envs.envs.code_benchmarks:MBPPPlusEnv",
        "MBPP+ with EvalPlus's extra tests ($GRPO_MBPP_PLUS_DIR or hub)",
        {},
    ),
    (
        "math/arithmetic-v0",
        "grpo_envs.envs.arithmetic:ArithmeticEnv",
        "procedural multi-step integer arithmetic (difficulty 1-5, operands/digits/ops, add2)",
        {},
    ),
    (
        "math/add2-v0",
        "grpo_envs.envs.arithmetic:ArithmeticEnv",
        "What is 37 + 58? (two two-digit numbers)",
        {"task": "add2"},
    ),
    (
        "math/countdown-v0",
        "grpo_envs.envs.countdown:CountdownEnv",
        "reach a target with + - * / over given numbers (difficulty 1-5)",
        {},
    ),
    (
        "format/think-answer-v0",
        "grpo_envs.envs.arithmetic:ArithmeticEnv",
        "easy arithmetic, rewarding the R1 <think>/<answer> format",
        {"difficulty": 1, "format": "think_answer", "format_weight": 1.0},
    ),
    (
        "rg/reasoning-gym-v0",
        "grpo_envs.envs.reasoning_gym:ReasoningGymEnv",
        "any reasoning-gym task: task='leg_counting', ...",
        {"task": "leg_counting"},
    ),
    (
        "math/dataset-v0",
        "grpo_envs.envs.dataset:math_dataset",
        "your math questions: path=FILE.jsonl|.parquet|.csv|hub id, question=, answer= columns",
        {},
    ),
    (
        "code/dataset-v0",
        "grpo_envs.envs.dataset:code_dataset",
        "your coding problems: path=..., question=, tests= (asserts) or inputs=/outputs= columns",
        {},
    ),
    (
        "code/humaneval-v0",
        "grpo_envs.envs.humaneval:HumanEvalEnv",
        "HumanEval, run in the sandbox",
        {},
    ),
    ("code/mbpp-v0", "grpo_envs.envs.mbpp:MBPPEnv", "MBPP, run in the sandbox", {}),
    (
        "code/stdio-v0",
        "grpo_envs.envs.stdio:StdioEnv",
        "stdin/stdout programs, run in the sandbox",
        {},
    ),
    (
        "code/feedback-v0",
        "grpo_envs.envs.multiturn:code_feedback_env",
        "multi-turn code: visible-test failures fed back, hidden tests reward (base=code env id)",
        {},
    ),
    (
        "math/python-tool-v0",
        "grpo_envs.envs.multiturn:math_python_env",
        "multi-turn math with a sandboxed Python tool (base=math env id, tool_format=)",
        {},
    ),
    (
        "math/feedback-v0",
        "grpo_envs.envs.multiturn:math_feedback_env",
        "multi-turn math: a wrong answer gets feedback and another try (base=math env id)",
        {},
    ),
    (
        "math/add2-feedback-v0",
        "grpo_envs.envs.multiturn:math_feedback_env",
        "What is 37 + 58?, with too high / too low feedback and 3 tries",
        {"task": "add2", "answer": "loose"},
    ),
)


def register_builtin() -> None:
    """Register the built-in ids (idempotent: already-registered ids are left alone)."""
    for env_id, entry_point, description, defaults in _BUILTIN:
        if env_id not in registry:
            register(env_id, entry_point, description=description, **defaults)
    from grpo_envs.registration import _families

    if "rg" not in _families:
        register_family("rg", "grpo_envs.envs.reasoning_gym:ReasoningGymEnv", param="task")


register_builtin()
