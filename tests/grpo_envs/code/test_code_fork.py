"""A code environment used in a forked worker (a dataloader, a reward pool) scores, never hangs.

The sandbox it was given belongs to the parent (its threads do not exist in the child, its
slots are the parent's): the child scores on its own process's shared sandbox instead.
"""

from __future__ import annotations

import os
import select

import pytest

import grpo_envs
from grpo_envs.code.scoring import close_shared_sandboxes
from grpo_envs.types import Sample
from sandbox import Sandbox


def test_humaneval_env_scores_in_a_forked_worker() -> None:
    with Sandbox(workers=1) as box:
        env = grpo_envs.make("code/humaneval-v0", sandbox=box)
        sample = Sample.from_row(env.dataset("test")[0])
        honest = f"```python\n{sample.answer}\n```"
        wrong = "```python\ndef has_close_elements(numbers, threshold):\n    return True\n```"
        assert [s.reward for s in env.score_batch([honest, wrong], [sample] * 2)] == [1.0, 0.0]

        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                scores = env.score_batch([honest, wrong], [sample] * 2)
                out = " ".join(f"{s.reward}:{s.outcome}" for s in scores)
                close_shared_sandboxes()
            except BaseException as exc:
                out = f"raised {exc!r}"
            os.write(write_end, out.encode())
            os._exit(0)
        os.close(write_end)
        try:
            ready, _, _ = select.select([read_end], [], [], 120)
            if not ready:
                os.kill(pid, 9)
                pytest.fail("scoring in the forked worker hung")
            out = os.read(read_end, 4096).decode()
        finally:
            os.close(read_end)
            os.waitpid(pid, 0)
        assert out == "1.0:passed 0.0:failed"
        # The parent's sandbox still serves the parent.
        assert env.score(honest, sample).reward == 1.0
