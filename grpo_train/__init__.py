"""grpo_train: a compact GRPO trainer, its rollout engines, and evaluation.

``trainer.py`` is the loop (generate, score, advantages, update, sync weights, log);
``cli.py``, ``train_cli.py`` and ``eval_cli.py`` are ``grpo``, ``grpo train`` and ``grpo eval``.
The subpackages, each importing only those after it in this list: ``setup`` (a run assembled
from its ``TrainConfig``), ``config``, ``eval``, ``learner`` (the update), ``collect`` (one
step's batch), ``episodes`` (what the model reads and writes), ``rollout`` (generation engines),
``run`` (run folder, checkpoints, logs), ``algorithm`` (the GRPO math), ``models``, ``parallel``.
README.md's "Architecture" section maps each one.
"""
