"""A code environment for trainer tests whose programs reach the sandbox whatever the model says.

A tiny random model writes no code; this environment runs a fixed program for every completion
(``extract`` ignores the text), so a training step really scores in the configured sandbox
(local, or remote services). ``style="call"`` gives function-call tests (as HumanEval's).
Registered on import as ``faults/remote-code-v0``.
"""

from __future__ import annotations

import datasets

import grpo_envs
from grpo_envs.code.extract import ExtractedCode, ExtractionMethod
from grpo_envs.code.scoring import CodeEnvironment, CodeTask
from grpo_envs.types import Sample

PROGRAM = (
    "def double(n):\n    return 2 * n\n\n"
    "if __name__ == '__main__':\n    print(double(int(input())))\n"
)


class RemoteCodeEnv(CodeEnvironment):
    """'Double a number': every completion runs ``PROGRAM``, which passes."""

    env_id = "faults/remote-code-v0"
    splits: tuple[str, ...] = ("train", "test")

    def __init__(self, style: str = "io", size: int = 8, **overrides: object) -> None:
        super().__init__(calibrate=False, **overrides)
        self.style, self.size = style, size

    def dataset(self, split: str = "train") -> datasets.Dataset:
        rows = [
            Sample(id=f"{split}-{i}", prompt=(), answer=PROGRAM, env_id=self.env_id).to_row()
            | {"prompt": [{"role": "user", "content": f"Double {i}."}]}
            for i in range(self.size)
        ]
        return datasets.Dataset.from_list(rows)

    def task(self, sample: Sample) -> CodeTask:
        from sandbox import CallTest, IOTest

        if self.style == "call":
            calls = (CallTest("assert candidate(2) == 4"), CallTest("assert double(0) == 0"))
            return CodeTask(key=sample.id, tests=calls, entry_point="double")
        return CodeTask(key=sample.id, tests=(IOTest("21\n", "42\n"), IOTest("0\n", "0\n")))

    def extract(self, completion: str, task: CodeTask, sample: Sample) -> ExtractedCode | None:
        return ExtractedCode(PROGRAM, ExtractionMethod.BARE)


if RemoteCodeEnv.env_id not in grpo_envs.registration.registry:
    grpo_envs.register(RemoteCodeEnv.env_id, "remote_code_env:RemoteCodeEnv")
