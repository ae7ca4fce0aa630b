"""Shared helpers of the trainer's tests live in this folder.

``toy_env``, ``rollout_checks``, ``memory_probe`` and ``fault_envs``: pytest puts a conftest's
folder on ``sys.path``, so the tests in the subfolders (one per ``grpo_train`` subpackage) import
them by their plain names. A few tests reuse another test module's helpers across subfolders
(``test_rollout_pipeline``'s fake collector, ``test_rollout_episodes_engines``' turn check): the
subfolders go on ``sys.path`` too, so that such an import works whichever file pytest is given,
not only when collection happened to import the other folder first. Test file names are unique
across the folders, so no name shadows another.
"""

import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
for _folder in sorted(_HERE.iterdir()):
    if (_folder / "__init__.py").exists() or not any(_folder.glob("test_*.py")):
        continue
    if str(_folder) not in sys.path:
        sys.path.append(str(_folder))
