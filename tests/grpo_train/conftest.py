"""Shared helpers of the trainer's tests live in this folder.

``toy_env``, ``rollout_checks``, ``memory_probe`` and ``fault_envs``: pytest puts a conftest's
folder on ``sys.path``, so the tests in the subfolders (one per ``grpo_train`` subpackage) import
them by their plain names.
"""
