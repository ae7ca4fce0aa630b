"""Collecting one training step.

Prompts and curriculum, generation and scoring into groups, the learning-signal guard, the batch
the update consumes, and the pipeline that overlaps the next step's generation with this update.
"""
