"""The policy update.

Loading the model, log-probs and their heads, micro-batching and packing, Liger's fused loss,
LoRA, activation memory, and the export of weights to the rollout engine.
"""
