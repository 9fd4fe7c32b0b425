"""The one training loop of every method, its optimisers (with per-row gradient and weight-decay
scaling) and checkpoints.

May import: ``_atomic``, ``_interrupts``, ``_safetensors``, ``data``, ``encoders``, ``metrics``, ``progress``.
"""
