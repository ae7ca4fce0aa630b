"""Shared helpers of the environment tests live in this folder.

``scan_work`` (linear-time checks of parsers): pytest puts a conftest's folder on ``sys.path``,
so the tests in the subfolders (``math/``, ``code/``, ``envs/``, one per ``grpo_envs``
subpackage) import it by its plain name.
"""
