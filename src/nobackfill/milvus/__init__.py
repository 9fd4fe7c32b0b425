"""Collections in Milvus: the same :class:`~nobackfill.collection.collection.Collection` over milvus-lite
(embedded, ``milvus-lite:PATH#NAME``), a standalone server or a cluster (``milvus://HOST:PORT[/DB]#NAME``),
through one client (pymilvus).

A collection ``NAME`` is a set of Milvus collections named ``nb_<NAME>_...``:

* ``nb_<NAME>_meta``: small documents by key (``k``): which store holds which space. (The
  collection's catalog -- items, plan, backfill -- is a database: SQLite beside a milvus-lite file,
  ``PATH.NAME.catalog.sqlite``, and PostgreSQL for a server, named by ``?catalog=postgresql://...``;
  collections of the previous format kept it here as documents and are converted when opened.)
* ``nb_<NAME>_s_<hash>``: one per embedding space (Milvus collections have one vector field, and a
  missing vector would come back as zeros: never nullable vectors), one partition per modality,
  rows ``key`` (the item version's key, primary), ``modality``, ``seq`` (insertion time in ns:
  readers discover new rows by it) and ``vec``.

The catalog and the vectors are everything a set of ``serve`` replicas or backfill workers must
share, so several processes on several machines can work on one collection. Consistency by commit
timestamps: a commit records the Milvus insert timestamp of the vectors it names in the catalog (in its
own transaction); a reader numbers a space's rows from the keys the catalog names (never a query over
Milvus) and reads with the largest commit timestamp it has seen as the guarantee timestamp (level
``Customized``), waiting only for rows the server has not consumed yet. Writers look keys up Strong.
Without timestamps (milvus-lite), a search is Strong while the space holds a row this process knows of
that was written less than ``FRESH_S`` ago, and ``Bounded`` after that. Vector writes are safe without
a lock (a row's key names its content, rows already present are skipped, and search results are
de-duplicated by key); commits and locks are the catalog's (transactions, advisory locks). milvus-lite
allows one process per path. A :class:`MilvusStorage` connects on first use: a command that reads only
the catalog (``collection status``) imports no pymilvus.

May import: ``_logging``, ``ann``, ``catalog``, ``gallery``, ``storage``.
"""

from __future__ import annotations

# The parts live in submodules: connection (clients, consistency levels and limits, index
# parameters), space_store (MilvusSpaceStore: one space in a collection of our own), adopted
# (MilvusAdoptedStore: a user's collection adopted in place, and its checks) and storage
# (MilvusStorage: documents, catalog, spaces). A constant is looked up in the module that uses it:
# patch it there (e.g. nobackfill.milvus.space_store.FRESH_S).
from .adopted import MilvusAdoptedStore, adopted_search_params, describe_adoptable
from .connection import (BOUNDED, FRESH_S, STRONG, TOKEN_ENV, TOKEN_FILE_ENV, _client, _safe, close_clients,
                         milvus_index_params)
from .space_store import MilvusSpaceStore
from .storage import MilvusStorage

__all__ = ["MilvusAdoptedStore", "MilvusSpaceStore", "MilvusStorage", "TOKEN_ENV", "TOKEN_FILE_ENV", "close_clients",
           "BOUNDED", "FRESH_S", "STRONG", "_client", "_safe", "adopted_search_params", "describe_adoptable",
           "milvus_index_params"]
