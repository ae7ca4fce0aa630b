"""Runs at interpreter start in every process of a multi-rank test (this folder is put first on
PYTHONPATH by the test): installs the NCCL collective guard."""

import nccl_guard

nccl_guard.install()
