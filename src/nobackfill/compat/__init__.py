"""Backfill-free model upgrades (Jang & Lim 2024, XBT) and bridges between embedding spaces.

* :mod:`.phi` - the projection phi (Sec. 4.1).
* :mod:`.adapters` - switchable LoRA (peft) / vision soft prompts / LayerNorm copies (CLIP or BERT).
* :mod:`.xbt` - stage 1 text-only pretraining (Eq. 3) and stage 2 XBT (Eq. 4-5) as loop methods.
* :mod:`.text_upgrade` - XBT on a text-only model (kind ``xbt-text``: MiniLM -> the Multi30K old model).
* :mod:`.direct` - the Direct baselines (Eq. 6): Full-tune, LoRA-only, Base.
* :mod:`.bridges` - Procrustes, SLERP, phi bridges, the bridge registry and chains.
* :mod:`.upgrade` - upgrade directories, ``load_upgrade``, :class:`UpgradedEncoder` (on / off).
* :mod:`.data` - text corpora, image-text pair sources, in-memory world splits.
* :mod:`.fitted` - bridges fitted on a collection's own backfilled items (kind ``fitted``), chosen without labels.
* :mod:`.learning` - compatibility learning over T model updates (Biondi et al.'s tutorial): BCT, CoReS, ... as plug-ins.

Their commands (``nobackfill compat ...``, ``nobackfill upgrade ...``, ``bench compat-steps``) are in
``nobackfill.cli``.

Names are exported lazily, so importing the package (and the CLI) does not load transformers or peft.

May import: ``_atomic``, ``_safetensors``, ``_lazy``, ``config``, ``data``, ``encoders``, ``evaluate``, ``gallery``, ``metrics``, ``progress``,
``train``.
"""

from __future__ import annotations

from .._lazy import lazy_exports

#: public name -> submodule. Imported on first use (PEP 562), so that ``nobackfill.compat.learning``
#: and the CLI do not pull transformers and peft in just by importing the package.
_EXPORTS = {
    "AdapterConfig": "adapters", "Adapters": "adapters", "detect_architecture": "adapters",
    "BridgeRegistry": "bridges", "ComposedBridge": "bridges", "NoBridgeError": "bridges",
    "PairedEncoder": "bridges", "PhiBridge": "bridges", "ProcrustesBridge": "bridges",
    "SlerpBridge": "bridges", "procrustes": "bridges", "slerp": "bridges",
    "Projection": "phi", "random_projection": "phi",
    "Upgrade": "upgrade", "UpgradedEncoder": "upgrade", "TextUpgradedEncoder": "upgrade",
    "load_upgrade": "upgrade",
    "TextUpgradeTrainer": "text_upgrade", "TextXBTUpgradeConfig": "text_upgrade", "TextXBTConfig": "text_upgrade",
    "train_text_upgrade": "text_upgrade",
}

__all__ = list(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
