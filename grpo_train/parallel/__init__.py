"""Several processes.

Rank and shard helpers, collectives, DeepSpeed/FSDP details, and ``grpo launch``.
"""
