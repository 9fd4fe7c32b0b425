"""Cross-modal late interaction (the Target-CMLI paper): streamed CMLI scoring (``cmli``), token stores and
re-ranking (``rerank``, ``nobackfill.gallery.tokens``), CMLI as contrastive logits (``train``),
Target-CMLI distillation with the empty target (``distill``), world training drivers (``world``),
attribute-swap hard negatives (``hard_negatives``) and the choice of re-ranking on val (``choose``);
the commands are in ``nobackfill.cli.late``.

Importing this package is light (no torch); import the submodules you need.

May import: ``_safetensors``, ``collection``, ``data``, ``encoders``, ``gallery``, ``metrics``, ``progress``, ``train``.
"""
