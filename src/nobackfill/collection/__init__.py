"""Collections of several embedding spaces at once.

Holds: :class:`~nobackfill.collection.collection.Collection` (open, create, snapshot, plan changes),
its writes (``writes``: add, upsert, delete, commits of backfilled and imported rows), its status and
locks (``status``), reader snapshots (``snapshot``), where vectors are placed (``placement``), the
commit worker of bulk imports (``commit_worker``), adding user data (``ingest``), reading the previous
format (``migrate``) and storage URIs (``uri``: a path, ``milvus-lite:``, ``milvus://``).

Layer: above :mod:`nobackfill.storage` and :mod:`nobackfill.milvus`. May import: ``milvus``,
``storage``, ``catalog``, ``gallery``, ``ann`` and the core (``data``, ``encoders``, ``progress``,
``memory``).
"""
