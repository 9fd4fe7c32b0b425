"""RECO, retrieval-enhanced contrastive embeddings (Iscen et al. 2023): refine frozen-encoder embeddings with
cross-modal knowledge retrieved from an external memory, without retraining the encoder or
re-embedding the gallery.

* :mod:`.memory` — the memory (a gallery of both modalities), near-duplicate removal, kNN retrieval
  (uni-modal search + cross-modal fusion, and the ablations).
* :mod:`.fusion` — phi_image / phi_text: one-layer transformer fusion, and mean fusion.
* :mod:`.model` — a trained refinement directory (``reco.json`` + ``fusion.safetensors``).
* :mod:`.train` — the RECO loss and its :class:`~nobackfill.train.loop.Method` plug-in.

May import: ``_safetensors``, ``_lazy``, ``config``, ``data``, ``encoders``, ``evaluate``, ``gallery``, ``metrics``, ``train``.
"""

from .._lazy import lazy_exports

_EXPORTS = {
    "FusionConfig": "fusion", "MeanFusion": "fusion", "TransformerFusion": "fusion",
    "NEAR_DUPLICATE_THRESHOLD": "memory", "Memory": "memory", "build_memory": "memory",
    "RecoModel": "model", "RecoSpec": "model", "load_reco": "model",
    "PairEmbeddings": "train", "RecoTrainConfig": "train", "RecoTraining": "train", "reco_loss": "train",
    "train_reco": "train",
}
__all__ = sorted(_EXPORTS)


#: lazy exports: ``nobackfill.cli.reco`` (imported by the CLI) must not pull in torch
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
