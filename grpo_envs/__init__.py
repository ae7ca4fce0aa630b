r"""grpo_envs: environments for RL with verifiable rewards.

One registry (``register``, ``make``, ``spec``, ``list_envs``), one scoring contract (``Sample`` in,
``Score`` out; see ``grpo_envs.types``), and the built-in math, format, reasoning-gym and code
environments. Importing this package is cheap: environment modules (and ``datasets``) load on
first use.

Example:
    >>> import grpo_envs
    >>> env = grpo_envs.make("math/add2-v0", train_size=4, test_size=2)
    >>> row = env.dataset("train")[0]
    >>> env.score("\\boxed{" + row["answer"] + "}", row).reward
    1.0
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from grpo_envs import envs as _builtin  # noqa: F401 - registers the built-in ids
from grpo_envs.registration import (
    EnvSpec,
    RegistryError,
    list_envs,
    load_plugins,
    make,
    register,
    register_family,
    registry,
    spec,
)
from grpo_envs.types import Component, Message, Outcome, Sample, Score

if TYPE_CHECKING:
    from grpo_envs.base import Environment, SingleTurnEnv, easier_versions
    from grpo_envs.checker import check_env
    from grpo_envs.episode import EpisodeBudget, MultiTurnEnv, Step, run_episode
    from grpo_envs.mixture import MixtureEnv
    from grpo_envs.rubric import Judgement, Parser, RewardComponent, Rubric

# name -> module: loaded on first attribute access (PEP 562) so `import grpo_envs` stays light.
_LAZY = {
    "Environment": "grpo_envs.base",
    "SingleTurnEnv": "grpo_envs.base",
    "easier_versions": "grpo_envs.base",
    "check_env": "grpo_envs.checker",
    "EpisodeBudget": "grpo_envs.episode",
    "MultiTurnEnv": "grpo_envs.episode",
    "Step": "grpo_envs.episode",
    "run_episode": "grpo_envs.episode",
    "MixtureEnv": "grpo_envs.mixture",
    "Judgement": "grpo_envs.rubric",
    "Parser": "grpo_envs.rubric",
    "RewardComponent": "grpo_envs.rubric",
    "Rubric": "grpo_envs.rubric",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'grpo_envs' has no attribute {name!r}")


__all__ = [
    "Component",
    "EnvSpec",
    "Environment",
    "EpisodeBudget",
    "Judgement",
    "Message",
    "MixtureEnv",
    "MultiTurnEnv",
    "Outcome",
    "Parser",
    "RegistryError",
    "RewardComponent",
    "Rubric",
    "Sample",
    "Score",
    "SingleTurnEnv",
    "Step",
    "check_env",
    "easier_versions",
    "list_envs",
    "load_plugins",
    "make",
    "register",
    "register_family",
    "registry",
    "run_episode",
    "spec",
]
