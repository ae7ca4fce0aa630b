"""Code verification: extracting a program from a completion and scoring it in the sandbox.

The concrete code environments (``code/humaneval-v0`` -> ``grpo_envs.envs.humaneval.HumanEvalEnv``,
``code/mbpp-v0`` -> ``grpo_envs.envs.mbpp.MBPPEnv``, ``code/stdio-v0`` ->
``grpo_envs.envs.stdio.StdioEnv``) live with the other environments in ``grpo_envs.envs``. Scoring
goes through the sandbox's trusted-verdict path (see ``grpo_envs.code.scoring``).
"""

from grpo_envs.code.extract import (
    ExtractedCode,
    ExtractionMethod,
    extract_code,
    extract_humaneval_program,
)
from grpo_envs.code.scoring import (
    CodeConfig,
    CodeEnvironment,
    CodeTask,
    RewardMode,
    close_shared_sandboxes,
    shared_sandbox,
)

__all__ = [
    "CodeConfig",
    "CodeEnvironment",
    "CodeTask",
    "ExtractedCode",
    "ExtractionMethod",
    "RewardMode",
    "close_shared_sandboxes",
    "extract_code",
    "extract_humaneval_program",
    "shared_sandbox",
]
