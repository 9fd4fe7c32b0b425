"""Continual language learning (CLL-CLIP with TEIR; seed 004): a deployed text tower learns new
languages one after another by growing and training only its token embeddings, so the image tower
and every stored image embedding stay valid.

Modules: :mod:`.vocab` (per-task vocabularies and their union), :mod:`.embeddings` (the expandable
token embedding layer), :mod:`.teir` (initialisation and per-row scales), :mod:`.losses` (Eq. 2-4),
:mod:`.methods` (the loop plug-in and baselines), :mod:`.learner` (the task sequence),
:mod:`.data` (Multi30K and world tasks / evaluation), :mod:`.cli` (commands). Kept import-free so
the command line starts fast.
"""
