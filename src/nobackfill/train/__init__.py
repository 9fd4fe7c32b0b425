"""The one training loop of every method, its optimisers (with per-row gradient and weight-decay
scaling) and checkpoints.

May import: ``data``, ``encoders``, ``metrics``, ``progress``.
"""
