"""User-format datasets (an image folder with ``captions.jsonl``, clip-retrieval metadata), the
synthetic world generator and its captions, and Multi30K read in place.

May import: ``_atomic``, ``progress``.
"""
