"""The GRPO algorithm as pure functions: advantage estimators, per-prompt baselines, the objective.

Nothing here reads a config or touches a model: tensors and numbers in, tensors and numbers out
(``global_advantages`` computes them over every data-parallel rank's groups, gathered through
``grpo_train.parallel``).
"""
