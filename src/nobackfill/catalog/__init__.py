"""A collection's catalog: the database of its items, plan, backfill documents and leases.

Holds: the schema and rows (``schema``), one write transaction's statements (``writer``), the
:class:`~nobackfill.catalog.catalog.Catalog` itself (SQLite embedded, in memory, or PostgreSQL shared
by several machines: ``catalog``), the serving plan (``plan``: spaces, routes, upgrades, merge) and
the item records with their errors and JSON rows (``items``).

Layer: above :mod:`nobackfill.gallery`. May import: ``_atomic``, ``gallery`` (file helpers, modalities), ``ann``.
"""
