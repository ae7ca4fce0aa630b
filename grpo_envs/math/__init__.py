r"""Math answer verification: extract a final answer from free text, compare it with the gold.

>>> from grpo_envs.math import verify
>>> verify("#### 72", "She sells 48 + 24 = 72 clips. The answer is 72.").correct
True

See ``verify`` for the pipeline, ``extract`` for the accepted answer formats (strict and
flexible), ``equivalence`` for what counts as equal (and the conventions chosen where graders
differ), and ``pool`` for how timeouts are enforced from any thread or process.
"""

from grpo_envs.math.extract import extract_answer
from grpo_envs.math.pool import shutdown_pool
from grpo_envs.math.verify import MathResult, verify, verify_batch

__all__ = ["MathResult", "extract_answer", "shutdown_pool", "verify", "verify_batch"]
