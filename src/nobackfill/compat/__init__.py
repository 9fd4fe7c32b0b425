"""Backfill-free model upgrades (seed 000, XBT) and bridges between embedding spaces.

* :mod:`.phi` - the projection phi (Sec. 4.1).
* :mod:`.adapters` - switchable LoRA (peft) / vision soft prompts / LayerNorm copies.
* :mod:`.xbt` - stage 1 text-only pretraining (Eq. 3) and stage 2 XBT (Eq. 4-5) as loop methods.
* :mod:`.direct` - the Direct baselines (Eq. 6): Full-tune, LoRA-only, Base.
* :mod:`.bridges` - Procrustes, SLERP, phi bridges, the bridge registry and chains.
* :mod:`.upgrade` - upgrade directories, ``load_upgrade``, :class:`UpgradedEncoder` (on / off).
* :mod:`.data` - text corpora, image-text pair sources, in-memory world splits.
"""

from .adapters import AdapterConfig, Adapters
from .bridges import (BridgeRegistry, ComposedBridge, NoBridgeError, PairedEncoder, PhiBridge,
                      ProcrustesBridge, SlerpBridge, procrustes, slerp)
from .phi import Projection, random_projection
from .upgrade import Upgrade, UpgradedEncoder, load_upgrade, query_side

__all__ = ["AdapterConfig", "Adapters", "BridgeRegistry", "ComposedBridge", "NoBridgeError", "PairedEncoder",
           "PhiBridge", "ProcrustesBridge", "SlerpBridge", "procrustes", "slerp", "Projection",
           "random_projection", "Upgrade", "UpgradedEncoder", "load_upgrade", "query_side"]
