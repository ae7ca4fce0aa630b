"""Run management.

The run folder, checkpoints and resume, logs and metrics, the console, stopping on signals, what
to lower when GPU memory runs out, throughput, and plots.
"""
