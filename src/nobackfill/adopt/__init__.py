"""Adopting vectors embedded elsewhere ("bring your own index").

Holds: the sources (:mod:`nobackfill.adopt.sources`: clip-retrieval folders, npy / npz / parquet /
JSONL / CSV tables, faiss indexes), the import into a collection (``importing``), the model check
(``model_check``: a sample re-embedded by the declared model must match the stored vectors) and a
user's Milvus collection adopted in place (``in_place``).

Layer: the top of the storage layers. May import: ``collection``, ``milvus``, ``storage``,
``catalog``, ``gallery``, ``ann`` and the core (``encoders``, ``data``, ``progress``, ``memory``).
"""
