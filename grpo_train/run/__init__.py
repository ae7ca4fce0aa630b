"""Run management.

The run folder, checkpoints and resume, logs and metrics, the console, stopping on signals,
throughput, and plots.
"""
