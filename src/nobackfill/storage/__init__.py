"""Where a collection lives: the :class:`~nobackfill.storage.base.Storage` interface (a catalog and
one vector store per space, :class:`~nobackfill.storage.base.SpaceStore`) and its directory
implementation, :class:`~nobackfill.storage.local.LocalStorage` (``catalog.sqlite`` and one gallery
per space). Milvus implements the same interface in :mod:`nobackfill.milvus`; a URI picks one in
:mod:`nobackfill.collection.uri`.

Layer: above :mod:`nobackfill.catalog`. May import: ``catalog``, ``gallery``, ``ann``.
"""
