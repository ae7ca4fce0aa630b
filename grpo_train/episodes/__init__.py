"""What the model reads and writes.

Prompts and conversations encoded as tokens (environment text as plain text, never control
tokens), the multi-turn driver, per-turn records, and the adapters that hand grpo-kit's episodes
to TRL and verl.
"""
