"""Code environments: HumanEval, MBPP and stdin/stdout tasks, scored in the sandbox.

The registry maps ``code/humaneval-v0`` -> ``HumanEvalEnv``, ``code/mbpp-v0`` -> ``MBPPEnv`` and
``code/stdio-v0`` -> ``StdioEnv``. Scoring goes through the sandbox's trusted-verdict path (see
``grpo_envs.code.scoring``).
"""

from grpo_envs.code.extract import (
    ExtractedCode,
    ExtractionMethod,
    extract_code,
    extract_humaneval_program,
)
from grpo_envs.code.humaneval import HumanEvalEnv
from grpo_envs.code.mbpp import MBPPEnv
from grpo_envs.code.scoring import (
    CodeConfig,
    CodeEnvironment,
    CodeTask,
    RewardMode,
    close_shared_sandboxes,
    shared_sandbox,
)
from grpo_envs.code.stdio import StdioEnv, StdioProblem, parse_stdio_row

__all__ = [
    "CodeConfig",
    "CodeEnvironment",
    "CodeTask",
    "ExtractedCode",
    "ExtractionMethod",
    "HumanEvalEnv",
    "MBPPEnv",
    "RewardMode",
    "StdioEnv",
    "StdioProblem",
    "close_shared_sandboxes",
    "extract_code",
    "extract_humaneval_program",
    "parse_stdio_row",
    "shared_sandbox",
]
