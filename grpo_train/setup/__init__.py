"""Assembling a run from its ``TrainConfig``.

``run.setup_run`` builds everything a run needs (folder, process, environments, resume checks,
policy, optimizer, training state, prompts, engine) and returns a frozen ``RunSetup``;
``settings`` builds each component's own settings object; ``engines`` the rollout engine.
"""
